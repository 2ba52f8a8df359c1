//! The client side of lockd, over its HTTP API: `lockd exec`, which runs a
//! command while holding a lock (like `flock(1)` across machines), and the
//! shell subcommands `acquire`, `extend`, `release` and `status`, which
//! print the server's JSON answer. Nothing here talks to Redis.
//!
//! Every subcommand takes one lockd server or several
//! ([`servers::Servers`]): a call moves on to the next server when one does
//! not answer, or answers 502, 503 or 504.

pub mod api;
pub mod args;
pub mod exec;
pub mod exit;
pub mod servers;
pub mod shell;
pub mod watch;
