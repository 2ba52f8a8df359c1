//! The `/locks/{name}` routes and `GET /locks`: one file per action, each a thin handler
//! that parses input ([`input`]), calls the lock core and shapes the answer
//! ([`model`]): [`acquire`] (`POST`), [`extend`] (`PATCH`), [`release`]
//! (`DELETE`), [`inspect`] (`GET`) and [`list`] (`GET /locks`).

pub mod acquire;
pub mod extend;
pub mod input;
pub mod inspect;
pub mod list;
pub mod model;
pub mod release;
