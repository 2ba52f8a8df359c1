//! lockd: a distributed lock service over HTTP, with locks held in Redis.
//!
//! # Layout
//! - [`lock`]: the lock core. Parsed input types, the [`lock::Node`] trait
//!   (one lock server: the Redis backend with its Lua scripts, or an
//!   in-memory backend) and the [`lock::Store`] trait over nodes (one, or
//!   Redlock's several). No HTTP in it.
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
//! - [`transport`]: how connections are served: HTTP/1.1 over TCP or TLS,
//!   with limits on request heads; [`framing`] follows each connection's
//!   requests to see what hyper drops (a `#fragment`).
//! - [`client`]: `lockd exec` and the shell subcommands, over the HTTP API.
//! - [`backoff`]: the one capped exponential backoff of every retry loop.

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
pub mod metrics;
pub mod transport;
