//! The client side of lockd, over its HTTP API: `lockd exec`, which runs a
//! command while holding a lock (like `flock(1)` across machines), and the
//! shell subcommands `acquire`, `extend`, `release` and `status`, which
//! print the server's JSON answer. Nothing here talks to Redis.

pub mod api;
pub mod args;
pub mod exec;
pub mod exit;
pub mod shell;
