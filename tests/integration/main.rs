//! lockd's integration tests, in one binary.

#![allow(clippy::unwrap_used)]

mod support;

mod api;
mod auth;
mod breaks;
mod browsers;
mod cases;
mod cluster;
mod dashboard;
mod exec;
mod fences;
mod haproxy;
mod history;
mod in_process;
mod limits;
mod listing;
mod meta;
mod module_docs;
mod observability;
mod openapi;
mod pages;
mod parsers;
mod process;
mod readme_snippets;
mod redis_outage;
mod redis_tls;
mod redlock;
mod replicas;
mod runs;
mod semaphores;
mod sentinel;
mod shared;
mod shutdown;
mod strict_input;
mod torture;
mod transport;
mod waiting;
mod watch;
