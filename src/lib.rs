//! lockd: a distributed lock service over HTTP, with locks held in Redis.
//!
//! # Layout
//! - [`lock`]: the lock core, one room per job: the rules and traits at its
//!   top (parsed input types, [`lock::Subject`], the traits of a lock server
//!   in [`lock::node`] and the [`lock::Store`] over them), then a folder
//!   each for the Redis backend (and everything that talks to Redis), the
//!   memory backend, Redlock, and the service that adds waiting and
//!   watches. No HTTP in it. Its module doc says where to look, and what
//!   to write to add a new kind of lease.
//! - [`http`]: the axum routes, one thin handler per action, extractors, and
//!   the one mapping from errors to RFC 9457 problem documents.
//! - [`metrics`]: the Prometheus registry and a node decorator that
//!   counts outcomes and times calls.
//! - [`cli`]: the command line (clap): the subcommands and the flags of
//!   `lockd serve`.
//! - [`config`]: those flags, the environment and the TOML file, merged into
//!   [`config::Settings`].
//! - [`auth`]: API keys (the keys file, constant-time lookup, reload).
//! - [`app`]: builds and runs the application; `main` only calls it.
//! - [`keygen`]: `lockd keygen`, which mints API keys.
//! - [`manpages`]: the manual pages (hidden `lockd manpages DIR`), rendered
//!   from [`cli`] for the Debian package.
//! - [`transport`]: how connections are served: HTTP/1.1 over TCP or TLS,
//!   with limits on request heads; [`framing`] follows each connection's
//!   requests to see what hyper drops (a `#fragment`).
//! - [`client`]: `lockd exec` and the shell subcommands, over the HTTP API.
//! - [`backoff`]: the one capped exponential backoff of every retry loop.
//! - [`logs`]: the log writer: lines copied into one buffer and written out
//!   by a thread of its own, a batch at a time.

pub mod app;
pub mod auth;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod config;
pub mod framing;
pub mod http;
pub mod keygen;
pub mod lock;
pub mod logs;
pub mod manpages;
pub mod metrics;
pub mod transport;
