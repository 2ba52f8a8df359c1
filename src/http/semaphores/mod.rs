//! The `/semaphores/{name}` routes and `GET /semaphores`: one file per action, as for
//! `/locks/{name}`, each a thin handler that parses input ([`input`]),
//! calls the lock core's permits and shapes the answer ([`model`]):
//! [`take`] (`POST`), [`extend`] (`PATCH`), [`give_back`] (`DELETE`),
//! [`inspect`] (`GET`) and [`list`] (`GET /semaphores`); [`problem`] holds
//! the semaphores' own problem types.

pub mod extend;
pub mod give_back;
pub mod input;
pub mod inspect;
pub mod list;
pub mod model;
pub mod problem;
pub mod take;
