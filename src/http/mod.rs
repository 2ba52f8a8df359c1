//! The HTTP face of lockd: routes, thin handlers, extractors and the one
//! mapping from errors to RFC 9457 problem documents.

pub mod admission;
pub mod auth;
pub mod deadline;
pub mod extract;
pub mod limits;
pub mod locks;
pub mod openapi;
pub mod ops;
pub mod problem;
pub mod routes;
pub mod state;
pub mod target;
pub mod telemetry;
