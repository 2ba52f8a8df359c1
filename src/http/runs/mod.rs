//! The `/runs/{key}` routes: one file per action, as for `/locks/{name}`,
//! each a thin handler that parses input ([`input`]), calls the lock
//! core's runs and shapes the answer ([`model`]): [`start`] (`POST`),
//! [`complete`] (`PUT /runs/{key}/result`), [`abandon`] (`DELETE`),
//! [`extend`] (`PATCH`), [`inspect`] (`GET`) and [`list`] (`GET /runs`);
//! [`problem`] holds the
//! runs' own problem types. docs/runs.md says what a run guarantees.

pub mod abandon;
pub mod complete;
pub mod extend;
pub mod input;
pub mod inspect;
pub mod list;
pub mod model;
pub mod problem;
pub mod start;
