//! The client side of lockd, over its HTTP API: `lockd exec`, which runs a
//! command while holding a lock (like `flock(1)` across machines), and the
//! shell subcommands `acquire`, `extend`, `release` and `status`, which
//! print the server's JSON answer. Nothing here talks to Redis.
//!
//! Every subcommand takes one lockd server or several
//! ([`servers::Servers`]): a call moves on to the next server when one does
//! not answer, or answers 502, 503 or 504.
//!
//! - [`api`]: `LockClient`, the one typed client of the HTTP API;
//! - [`servers`]: one call over several servers;
//! - [`args`]: the flags every client subcommand shares;
//! - [`exec`]: `lockd exec`; [`shell`]: the shell subcommands;
//!   [`watch`]: `lockd watch`;
//! - [`exit`]: the exit codes.

pub mod api;
pub mod args;
pub mod exec;
pub mod exit;
pub mod servers;
pub mod shell;
pub mod watch;
