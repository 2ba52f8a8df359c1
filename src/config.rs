//! Settings: the flags and environment variables of `lockd serve`
//! ([`crate::cli::ServeArgs`]) over an optional TOML file (`--config`, read
//! with figment) over defaults.
//! `config/lockd.example.toml` documents every setting.
//!
//! # Two shapes, one set of defaults
//! - [`RawSettings`] is the shape users write: flat, one field per key,
//!   each named as in the file, as its flag (`max_ttl_ms`: `--max-ttl-ms`)
//!   and as its environment variable (`LOCKD_MAX_TTL_MS`), durations in
//!   whole milliseconds. figment extracts it (flags over the file over the
//!   defaults) and refuses an unknown key.
//! - [`Settings`] is what lockd runs with: grouped by concern, with typed
//!   values (durations as [`Duration`], lease lengths as [`Ttl`], counts
//!   that must be at least 1 as [`NonZeroUsize`], the TLS files as one
//!   [`TlsFiles`], the Redis TLS files as one [`RedisTlsFiles`]).
//!   `TryFrom<RawSettings>` builds it, each group by its own function,
//!   which checks that group's values; so a `Settings` from
//!   [`Settings::load`] has been checked, and there is no separate check.
//! - The defaults are [`Settings::default`]; [`RawSettings::default`] is
//!   their flat form (`From<&Settings>`), which `load` lays under the file.
//!
//! # Groups
//!
//! | Field of `Settings` | Concern | Keys |
//! | --- | --- | --- |
//! | `listen`: [`ListenSettings`] | the main listener | `listen`, `tls_cert`, `tls_key`, `header_read_timeout_ms`, `max_header_bytes`, `cors_allow_origin`, `allowed_host` |
//! | `store`: [`StoreSettings`] | where locks are kept | `dev`, `redis_url`, `redis_mode`, `sentinel_master`, `min_replicas_acked`, `replica_ack_timeout_ms`, `redis_ca_cert`, `redis_client_cert`, `redis_client_key`, `key_prefix`, `redis_timeout_ms`, `pool_size`, `node_timeout_ms`, `drift_factor`, `fence_retention_ms`, `history_length`, `redlock_restart_delay_ms` |
//! | `limits`: [`LimitSettings`] | what a request is held to | `default_ttl_ms`, `max_ttl_ms`, `max_wait_ms`, `max_waiters`, `max_requests`, `request_timeout_ms`, `max_semaphore_limit`, `max_watchers`, `watch_keepalive_ms`, `run_retention_ms`, `max_result_bytes`, `max_meta_bytes` |
//! | `auth`: [`AuthSettings`] | API keys, or their absence | `auth_keys_file`, `insecure_no_auth` |
//! | `metrics`: [`MetricsSettings`] | the metrics listener and series | `metrics_listen`, `metrics_max_namespaces` |
//! | `service`: [`ServiceSettings`] | the process itself | `log_format`, `shutdown_timeout_ms` |
//!
//! The groups are built and checked in the order limits, store, metrics,
//! auth, listener, so that the first value at fault is the one named. The
//! metrics and auth groups check their values against the main listener's
//! address too (`metrics_listen` must differ from `listen`; no API keys
//! only on loopback).
//!
//! # TLS to Redis
//! A `rediss://` URL is TLS, a `redis://` one plain TCP, each URL on its
//! own: a Redlock set may mix them; a cluster's seeds may not (the nodes
//! found from them are reached as the seeds are). The redis crate's
//! `#insecure` fragment, which would skip verifying the server, is
//! refused. The files (`redis_ca_cert`; `redis_client_cert` with
//! `redis_client_key`, both or neither) are checked here only for being
//! given together; [`crate::app::Application::build`] reads and parses
//! them (a file that cannot be used exits 2 too, naming its setting), and
//! [`crate::lock::redis::connect`] builds every Redis client with them. They apply
//! to `rediss://` URLs only.
//!
//! The fields are public, for code that builds settings (the tests:
//! `Settings::default()` and edits on the groups). What the types hold
//! (a TTL from 1 ms to 365 days, a count of at least 1, both TLS files or
//! none, a client certificate for Redis with its key or neither) holds
//! there too; the rest is the editor's to keep in range, and
//! [`crate::http::limits::Limits`] still refuses a default TTL above the
//! maximum.

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::cli::{LogFormat, RedisMode, ServeArgs};
use crate::lock::history::HistoryLength;
use crate::lock::redis::connect::{is_tls, redact_url, redact_urls_in};
use crate::lock::run::{MAX_RESULT_BYTES, MAX_RETENTION_MS};
use crate::lock::{Meta, Ttl};

/// The service's settings, grouped by concern, with typed values: what
/// [`Settings::load`] gives, checked. `Debug` hides any password in the
/// Redis URLs (see [`RedisUrl`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// The main listener: address, TLS, limits on request heads.
    pub listen: ListenSettings,
    /// Where locks are kept: memory or Redis (one node, or Redlock's
    /// several), and how lockd talks to it.
    pub store: StoreSettings,
    /// The limits a request is held to: TTLs, waits, admission, time.
    pub limits: LimitSettings,
    /// API keys, or their absence.
    pub auth: AuthSettings,
    /// The metrics listener and series.
    pub metrics: MetricsSettings,
    /// The process itself: its logs and its shutdown.
    pub service: ServiceSettings,
}

/// The main listener (keys `listen`, `tls_cert`, `tls_key`,
/// `header_read_timeout_ms`, `max_header_bytes`, `cors_allow_origin`,
/// `allowed_host`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenSettings {
    /// Address to listen on; port 0 picks a free port (`listen`).
    pub addr: SocketAddr,
    /// The certificate and key to serve HTTPS with; `None`: plain HTTP
    /// (`tls_cert` and `tls_key`, both or neither).
    pub tls: Option<TlsFiles>,
    /// Longest time a client may take to send a request head; also how
    /// long an idle keep-alive connection stays open, and, with TLS, how
    /// long the handshake may take. At least 1 ms
    /// (`header_read_timeout_ms`).
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers), in bytes; at least
    /// [`MIN_HEADER_BYTES`] (`max_header_bytes`).
    pub max_header_bytes: usize,
    /// The web origins whose browser pages may call lockd, each in its
    /// serialized form (`https://dash.example.com`, `http://127.0.0.1:3000`:
    /// lower case, no default port, no path), none twice
    /// (`cors_allow_origin`; see [`crate::http::browsers`]).
    pub cors_allow_origins: Vec<String>,
    /// Host names a request to a loopback listener may name beside the
    /// loopback ones, lower case, without a port (`allowed_host`).
    pub allowed_hosts: Vec<String>,
}

/// The files of HTTPS, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's certificate first (`tls_cert`).
    pub cert: PathBuf,
    /// The private key of `cert` (`tls_key`).
    pub key: PathBuf,
}

/// Where locks are kept (keys `dev`, `redis_url`, `redis_mode`,
/// `redis_ca_cert`, `redis_client_cert`, `redis_client_key`, `key_prefix`,
/// `redis_timeout_ms`, `pool_size`, `node_timeout_ms`, `drift_factor`,
/// `fence_retention_ms`, `history_length`, `redlock_restart_delay_ms`).
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    /// Keep locks in this process's memory instead of Redis (`dev`).
    pub dev: bool,
    /// Redis URLs, at least one, no node twice: one runs the
    /// single-instance backend, several run Redlock over them
    /// (`redis_url`).
    pub redis_urls: Vec<RedisUrl>,
    /// What `redis_urls` are; `None`: inferred from their number (see
    /// [`StoreSettings::mode`]) (`redis_mode`).
    pub redis_mode: Option<RedisMode>,
    /// Sentinel mode: the name the Sentinels monitor the master by; set in
    /// that mode only (`sentinel_master`).
    pub sentinel_master: Option<String>,
    /// How many replicas must acknowledge each grant, extend and release (Redis
    /// `WAIT`); 0: none. Not in Redlock mode (`min_replicas_acked`).
    pub min_replicas_acked: usize,
    /// How long a grant or extend waits for those replicas; at least 1 ms,
    /// below `redis_timeout` (`replica_ack_timeout_ms`).
    pub replica_ack_timeout: Duration,
    /// The TLS files for `rediss://` URLs (`redis_ca_cert`,
    /// `redis_client_cert`, `redis_client_key`).
    pub redis_tls: RedisTlsFiles,
    /// Prefix of every Redis key lockd writes; no braces (`key_prefix`).
    pub key_prefix: String,
    /// Longest time one Redis operation may take, single Redis; at least
    /// 1 ms (`redis_timeout_ms`).
    pub redis_timeout: Duration,
    /// Most pooled Redis connections, per node (`pool_size`).
    pub pool_size: NonZeroUsize,
    /// Redlock: the longest one node may take to answer; at least 1 ms
    /// (`node_timeout_ms`).
    pub node_timeout: Duration,
    /// Redlock: clock drift allowed, as a fraction of the TTL, from 0 to
    /// below 0.5 (`drift_factor`).
    pub drift_factor: f64,
    /// How long a fencing counter is kept after its lock's last grant;
    /// from 1 s to 365 days (`fence_retention_ms`).
    pub fence_retention: Duration,
    /// How many leases each name's history keeps, 0 (none) to 1000
    /// (`history_length`).
    pub history_length: HistoryLength,
    /// Redlock: how long a restarted node counts toward no quorum, from its
    /// start, at most 365 days; `None`: the longest TTL (see
    /// [`Settings::redlock_restart_delay`]) (`redlock_restart_delay_ms`).
    pub redlock_restart_delay: Option<Duration>,
}

/// The TLS files for `rediss://` URLs, all PEM; unset, servers are
/// verified against the system's root certificates and lockd has no client
/// certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTlsFiles {
    /// The CA certificates to verify servers against instead of the
    /// system's roots (`redis_ca_cert`).
    pub ca_cert: Option<PathBuf>,
    /// The client certificate chain and its key, for servers that require
    /// one (`redis_client_cert` and `redis_client_key`, both or neither).
    pub client: Option<TlsFiles>,
}

/// The limits a request is held to (keys `default_ttl_ms`, `max_ttl_ms`,
/// `max_wait_ms`, `max_waiters`, `max_requests`, `request_timeout_ms`,
/// `max_semaphore_limit`, `max_watchers`, `watch_keepalive_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    /// Lease length when a request gives no `ttl_ms`; at most `max_ttl`
    /// (`default_ttl_ms`).
    pub default_ttl: Ttl,
    /// Longest lease a request may ask for (`max_ttl_ms`).
    pub max_ttl: Ttl,
    /// Longest `wait_ms` a request may ask for (`max_wait_ms`).
    pub max_wait: Duration,
    /// Most requests waiting at once, for locks, permits and run starts
    /// together (`max_waiters`).
    pub max_waiters: NonZeroUsize,
    /// Most `/locks` acquires and inspects at once besides the waiting
    /// ones; also the room of extends and releases, kept apart
    /// (`max_requests`).
    pub max_requests: NonZeroUsize,
    /// Longest time a request (beyond its `wait_ms`) may take; at least
    /// 1 ms (`request_timeout_ms`).
    pub request_timeout: Duration,
    /// The largest `limit` a semaphore may have; at least 1
    /// (`max_semaphore_limit`).
    pub max_semaphore_limit: u32,
    /// Most watches (event streams) open at once (`max_watchers`).
    pub max_watchers: NonZeroUsize,
    /// How long a watch's stream may stay silent before a comment line
    /// keeps it open; at least 1 ms (`watch_keepalive_ms`).
    pub watch_keepalive: Duration,
    /// How long a done run's result is kept, and a pending run's record
    /// after its last attempt; 1 s to 30 days (`run_retention_ms`).
    pub run_retention: Duration,
    /// The largest result a run may store, in bytes of JSON; 1 to 65536
    /// (`max_result_bytes`).
    pub max_result_bytes: usize,
    /// The largest holder metadata an acquire, a permit or a run's start
    /// may give, in bytes of compact JSON; 1 to 65536 (`max_meta_bytes`).
    pub max_meta_bytes: usize,
}

/// API keys, or their absence (keys `auth_keys_file`, `insecure_no_auth`):
/// not both; neither only on a loopback `listen`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthSettings {
    /// The API keys file; `None`: no key needed (`auth_keys_file`).
    pub keys_file: Option<PathBuf>,
    /// Allow a non-loopback `listen` without API keys
    /// (`insecure_no_auth`).
    pub insecure_no_auth: bool,
}

/// The metrics listener and series (keys `metrics_listen`,
/// `metrics_max_namespaces`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Where `/metrics` is served when not on the main listener; not the
    /// main listener's address (`metrics_listen`).
    pub listen: Option<SocketAddr>,
    /// Most namespaces with their own metric series
    /// (`metrics_max_namespaces`).
    pub max_namespaces: usize,
}

/// The process itself (keys `log_format`, `shutdown_timeout_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSettings {
    /// Log line format (`log_format`).
    pub log_format: LogFormat,
    /// Longest time a graceful shutdown waits for requests in flight
    /// (`shutdown_timeout_ms`).
    pub shutdown_timeout: Duration,
}

/// `n` as a count of at least 1, for the defaults below: evaluated when
/// compiling, so a zero default fails the build.
const fn count(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => panic!("a count must be at least 1"),
    }
}

/// `ms` as a [`Ttl`], for the defaults below: evaluated when compiling, so
/// a default out of range fails the build.
const fn ttl(ms: u64) -> Ttl {
    match Ttl::new(ms) {
        Some(ttl) => ttl,
        None => panic!("a TTL must be from 1 ms to 365 days"),
    }
}

impl Default for ListenSettings {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tls: None,
            header_read_timeout: Duration::from_millis(5_000),
            max_header_bytes: 16_384,
            cors_allow_origins: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            dev: false,
            redis_urls: vec![RedisUrl::from("redis://127.0.0.1:6379")],
            redis_mode: None,
            sentinel_master: None,
            min_replicas_acked: 0,
            replica_ack_timeout: Duration::from_millis(200),
            redis_tls: RedisTlsFiles::default(),
            key_prefix: "lockd:".into(),
            redis_timeout: Duration::from_millis(1_000),
            pool_size: const { count(16) },
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            fence_retention: Duration::from_millis(3_600_000),
            history_length: HistoryLength::DEFAULT,
            redlock_restart_delay: None,
        }
    }
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            default_ttl: const { ttl(30_000) },
            max_ttl: const { ttl(3_600_000) },
            max_wait: Duration::from_millis(60_000),
            max_waiters: const { count(10_000) },
            max_requests: const { count(1024) },
            request_timeout: Duration::from_millis(10_000),
            max_semaphore_limit: 10_000,
            max_watchers: const { count(10_000) },
            watch_keepalive: Duration::from_millis(15_000),
            run_retention: Duration::from_secs(24 * 3600),
            max_result_bytes: 65_536,
            max_meta_bytes: Meta::DEFAULT_MAX_BYTES,
        }
    }
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            listen: None,
            max_namespaces: 100,
        }
    }
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Pretty,
            shutdown_timeout: Duration::from_millis(10_000),
        }
    }
}

/// The settings as users write them: flat, one field per key of the file,
/// each also a flag (`--KEY` with `-` for `_`) and an environment variable
/// (`LOCKD_KEY`), durations in whole milliseconds. figment extracts it;
/// [`Settings::try_from`] groups and checks it. Its default is the flat
/// form of [`Settings::default`]. `Debug` hides any password in the Redis
/// URLs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// PEM certificate chain to serve HTTPS with; with `tls_key`. Unset:
    /// plain HTTP.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Longest time a client may take to send a request head, in
    /// milliseconds; also how long an idle keep-alive connection stays open.
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// Web origins whose browser pages may call lockd. A TOML file may give
    /// one string or a list.
    #[serde(default, deserialize_with = "strings")]
    pub cors_allow_origin: Vec<String>,
    /// Host names a request to a loopback `listen` may name beside the
    /// loopback ones. A TOML file may give one string or a list.
    #[serde(default, deserialize_with = "strings")]
    pub allowed_host: Vec<String>,
    /// Redis URLs: one runs the single-instance backend, several run Redlock
    /// over them. A TOML file may give one string or a list.
    #[serde(deserialize_with = "redis_urls")]
    pub redis_url: Vec<RedisUrl>,
    /// What the Redis URLs are: `single`, `redlock`, `cluster` or
    /// `sentinel`; unset: single for one URL, redlock for several.
    #[serde(default)]
    pub redis_mode: Option<RedisMode>,
    /// Sentinel mode: the name the Sentinels monitor the master by.
    #[serde(default)]
    pub sentinel_master: Option<String>,
    /// Replicas that must acknowledge each grant, extend and release; 0: none.
    pub min_replicas_acked: usize,
    /// How long to wait for them, in milliseconds.
    pub replica_ack_timeout_ms: u64,
    /// PEM CA certificates to verify `rediss://` servers against; unset:
    /// the system's root certificates.
    #[serde(default)]
    pub redis_ca_cert: Option<PathBuf>,
    /// PEM client certificate chain for `rediss://` servers that require
    /// one; with `redis_client_key`.
    #[serde(default)]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key of `redis_client_cert`.
    #[serde(default)]
    pub redis_client_key: Option<PathBuf>,
    /// Prefix of every Redis key lockd writes.
    pub key_prefix: String,
    /// Lease length when a request gives no `ttl_ms`, in milliseconds.
    pub default_ttl_ms: u64,
    /// Longest lease a request may ask for, in milliseconds.
    pub max_ttl_ms: u64,
    /// Longest time one Redis operation may take, in milliseconds.
    pub redis_timeout_ms: u64,
    /// Most pooled Redis connections.
    pub pool_size: usize,
    /// Redlock: the longest one node may take to answer, in milliseconds.
    pub node_timeout_ms: u64,
    /// Redlock: clock drift allowed, as a fraction of the TTL.
    pub drift_factor: f64,
    /// How long a fencing counter is kept after its lock's last grant, in
    /// milliseconds (at least 1000).
    pub fence_retention_ms: u64,
    /// How many leases each name's history keeps.
    pub history_length: usize,
    /// Redlock: how long a restarted node counts toward no quorum, in
    /// milliseconds from its start; `None`: `max_ttl_ms`.
    #[serde(default)]
    pub redlock_restart_delay_ms: Option<u64>,
    /// Longest `wait_ms` a request may ask for, in milliseconds.
    pub max_wait_ms: u64,
    /// Most requests waiting at once (locks, permits and run starts together).
    pub max_waiters: usize,
    /// The largest `limit` a semaphore may have.
    pub max_semaphore_limit: u32,
    /// Most watches (event streams) open at once.
    pub max_watchers: usize,
    /// Silence in milliseconds after which a watch's stream gets a comment
    /// line.
    pub watch_keepalive_ms: u64,
    /// How long a done run's result (and a pending run's record) is kept,
    /// in milliseconds.
    pub run_retention_ms: u64,
    /// The largest result a run may store, in bytes of JSON.
    pub max_result_bytes: usize,
    /// The largest holder metadata, in bytes of compact JSON.
    pub max_meta_bytes: usize,
    /// Most `/locks` acquires and inspects at once besides the waiting
    /// ones; also the room of extends and releases, kept apart.
    pub max_requests: usize,
    /// Use the in-memory backend instead of Redis.
    pub dev: bool,
    /// Where `/metrics` is served when not on `listen`.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Most namespaces with their own metric series.
    pub metrics_max_namespaces: usize,
    /// Longest time a request (beyond its `wait_ms`) may take, in
    /// milliseconds.
    pub request_timeout_ms: u64,
    /// Longest time a graceful shutdown waits for requests in flight, in
    /// milliseconds.
    pub shutdown_timeout_ms: u64,
    /// Log line format.
    pub log_format: LogFormat,
    /// The API keys file; `None`: no key needed.
    #[serde(default)]
    pub auth_keys_file: Option<PathBuf>,
    /// Allow a non-loopback `listen` without API keys.
    pub insecure_no_auth: bool,
}

impl Default for RawSettings {
    fn default() -> Self {
        Self::from(&Settings::default())
    }
}

/// `duration` in whole milliseconds (`u64::MAX` for one longer than that
/// can count).
pub fn whole_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl From<&Settings> for RawSettings {
    /// The flat form of `settings`, key by key.
    fn from(settings: &Settings) -> Self {
        let Settings {
            listen,
            store,
            limits,
            auth,
            metrics,
            service,
        } = settings;
        Self {
            listen: listen.addr,
            tls_cert: listen.tls.as_ref().map(|tls| tls.cert.clone()),
            tls_key: listen.tls.as_ref().map(|tls| tls.key.clone()),
            header_read_timeout_ms: whole_millis(listen.header_read_timeout),
            max_header_bytes: listen.max_header_bytes,
            cors_allow_origin: listen.cors_allow_origins.clone(),
            allowed_host: listen.allowed_hosts.clone(),
            redis_url: store.redis_urls.clone(),
            redis_mode: store.redis_mode,
            sentinel_master: store.sentinel_master.clone(),
            min_replicas_acked: store.min_replicas_acked,
            replica_ack_timeout_ms: whole_millis(store.replica_ack_timeout),
            redis_ca_cert: store.redis_tls.ca_cert.clone(),
            redis_client_cert: store.redis_tls.client.as_ref().map(|c| c.cert.clone()),
            redis_client_key: store.redis_tls.client.as_ref().map(|c| c.key.clone()),
            key_prefix: store.key_prefix.clone(),
            default_ttl_ms: limits.default_ttl.as_millis(),
            max_ttl_ms: limits.max_ttl.as_millis(),
            redis_timeout_ms: whole_millis(store.redis_timeout),
            pool_size: store.pool_size.get(),
            node_timeout_ms: whole_millis(store.node_timeout),
            drift_factor: store.drift_factor,
            fence_retention_ms: whole_millis(store.fence_retention),
            history_length: store.history_length.get(),
            redlock_restart_delay_ms: store.redlock_restart_delay.map(whole_millis),
            max_wait_ms: whole_millis(limits.max_wait),
            max_waiters: limits.max_waiters.get(),
            max_semaphore_limit: limits.max_semaphore_limit,
            max_watchers: limits.max_watchers.get(),
            watch_keepalive_ms: whole_millis(limits.watch_keepalive),
            run_retention_ms: whole_millis(limits.run_retention),
            max_result_bytes: limits.max_result_bytes,
            max_meta_bytes: limits.max_meta_bytes,
            max_requests: limits.max_requests.get(),
            dev: store.dev,
            metrics_listen: metrics.listen,
            metrics_max_namespaces: metrics.max_namespaces,
            request_timeout_ms: whole_millis(limits.request_timeout),
            shutdown_timeout_ms: whole_millis(service.shutdown_timeout),
            log_format: service.log_format,
            auth_keys_file: auth.keys_file.clone(),
            insecure_no_auth: auth.insecure_no_auth,
        }
    }
}

/// The smallest `max_header_bytes`, in bytes: hyper's smallest HTTP/1 read
/// buffer.
pub const MIN_HEADER_BYTES: usize = 8192;

/// Why the settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A value has the wrong type, or a key is unknown. The message names
    /// the key as the file spells it, and the file; it never shows a Redis
    /// password, even when it quotes the line at fault.
    #[error("{}", redact_urls_in(&describe_figment(.0)))]
    Parse(#[from] Box<figment::Error>),
    /// The values do not fit together.
    #[error("invalid settings: {0}")]
    Invalid(String),
}

/// Every error in `error`, one per line, each naming the file and the key
/// as the user wrote it (figment's own message prefixes the key with its
/// profile, `default.`, which no file ever mentions).
fn describe_figment(error: &figment::Error) -> String {
    let lines: Vec<String> = error
        .clone()
        .into_iter()
        .map(|e| describe_one(&e))
        .collect();
    lines.join("\n")
}

/// One figment error in the user's words.
fn describe_one(e: &figment::Error) -> String {
    use figment::error::Kind;
    let source = match e.metadata.as_ref() {
        Some(m) => match &m.source {
            Some(figment::Source::File(path)) => format!("config file {}", path.display()),
            _ => m.name.to_string(),
        },
        None => "settings".to_owned(),
    };
    let key = e.path.join(".");
    let problem = match &e.kind {
        Kind::UnknownField(found, expected) => {
            let hint = closest(found, expected)
                .map(|k| format!("; did you mean {k}?"))
                .unwrap_or_default();
            return format!(
                "invalid settings in {source}: unknown key `{found}`{hint} \
                 (config/lockd.example.toml lists every key)"
            );
        }
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!("expected {}, found {actual}", plain_type(expected))
        }
        Kind::Message(message) if key == "listen" || key == "metrics_listen" => {
            format!("{message}: give an IP address and port, such as \"127.0.0.1:8080\"")
        }
        other => other.to_string(),
    };
    if key.is_empty() {
        format!("invalid settings in {source}: {problem}")
    } else {
        format!("invalid settings in {source}: `{key}`: {problem}")
    }
}

/// A Rust type name as a user would say it.
fn plain_type(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number (such as 5000)".to_owned(),
        "f32" | "f64" => "a number (such as 0.01)".to_owned(),
        "a boolean" | "bool" => "true or false".to_owned(),
        other => other.to_owned(),
    }
}

/// The known keys `found` likely meant, quoted: those that have it as a
/// word (`ttl`: `default_ttl_ms` or `max_ttl_ms`, at most three), else the
/// closest one (a typo), if one is close enough: within a quarter of its
/// length and 3 edits, and half of `found`'s length, so that a short word
/// is not taken for any other short key (`ttl` for `dev`).
fn closest(found: &str, known: &[&str]) -> Option<String> {
    let quoted = |k: &&str| format!("`{k}`");
    let words: Vec<String> = known
        .iter()
        .filter(|k| k.split('_').any(|w| w == found))
        .take(3)
        .map(quoted)
        .collect();
    if !words.is_empty() {
        return Some(words.join(" or "));
    }
    let most = |k: &str| 3.max(k.len() / 4).min(found.chars().count() / 2);
    known
        .iter()
        .map(|k| (edit_distance(found, k), k))
        .filter(|(d, k)| *d <= most(k))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| quoted(k))
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A Redis URL as given (`redis://[:PASSWORD@]HOST[:PORT][/DB]`, or
/// `rediss://` for TLS); the backend parses it when it connects. Its
/// `Debug` and `Display` hide the password (see [`redact_url`]);
/// [`RedisUrl::expose`] gives the URL itself, for making the connection.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as given, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for RedisUrl {
    fn from(raw: String) -> Self {
        Self(raw)
    }
}

impl From<&str> for RedisUrl {
    fn from(raw: &str) -> Self {
        Self(raw.to_owned())
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisUrl")
            .field(&redact_url(&self.0))
            .finish()
    }
}

/// The `host:port` a Redis URL points at (the URL itself when unparsable).
pub fn node_address(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port().unwrap_or(6379))))
        .unwrap_or_else(|| redact_url(url))
}

/// Accepts one URL or a list of them.
fn redis_urls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<RedisUrl>, D::Error> {
    one_or_many(d, "a Redis URL (a string) or a list of them")
}

fn strings<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    one_or_many(d, "a string or a list of strings")
}

/// One value of `T` or a list of them, as a list; refused with "expected
/// `what`".
fn one_or_many<'de, D, T>(d: D, what: &str) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        One(T),
        Many(Vec<T>),
    }
    // The untagged enum's own error ("data did not match any variant of
    // untagged enum OneOrMany") tells a user nothing.
    let values = OneOrMany::deserialize(d)
        .map_err(|_| serde::de::Error::custom(format!("expected {what}")))?;
    Ok(match values {
        OneOrMany::One(value) => vec![value],
        OneOrMany::Many(values) => values,
    })
}

/// `values` checked, each at most once, in their given order.
fn distinct(
    key: &str,
    values: impl Iterator<Item = Result<String, String>>,
) -> Result<Vec<String>, String> {
    let mut seen = Vec::new();
    for value in values {
        let value = value.map_err(|e| format!("{key}: {e}"))?;
        if seen.contains(&value) {
            return Err(format!("{key} lists {value} twice"));
        }
        seen.push(value);
    }
    Ok(seen)
}

/// A web origin as given to `cors_allow_origin`, in its serialized form
/// (RFC 6454 §6.2: `scheme://host[:port]`, lower case, no default port).
fn web_origin(raw: &str) -> Result<String, String> {
    let wrong = || {
        format!(
            "{raw:?} is not a web origin; give scheme://host[:port] with scheme http or https \
             and no path, such as https://dash.example.com or http://127.0.0.1:3000"
        )
    };
    let url = url::Url::parse(raw.trim()).map_err(|_| wrong())?;
    let plain_host = url.host_str().is_some_and(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'))
    });
    if !matches!(url.scheme(), "http" | "https")
        || !plain_host
        || !matches!(url.path(), "" | "/")
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(wrong());
    }
    Ok(url.origin().ascii_serialization())
}

/// A host name as given to `allowed_host`: a DNS name or an IP address,
/// lower case, without a port.
fn host_name(raw: &str) -> Result<String, String> {
    let name = raw.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && (name.parse::<std::net::IpAddr>().is_ok()
            || name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }));
    if ok {
        Ok(name)
    } else {
        Err(format!(
            "{raw:?} is not a host name; give a DNS name or an IP address without a port, \
             such as lockd.internal"
        ))
    }
}

impl Settings {
    /// Redlock's restart delay: `store.redlock_restart_delay`, or else the
    /// longest TTL (`limits.max_ttl`).
    pub fn redlock_restart_delay(&self) -> Duration {
        self.store
            .redlock_restart_delay
            .unwrap_or(self.limits.max_ttl.as_duration())
    }

    /// Merges defaults, the `--config` file and the flags (which clap has
    /// already merged with the environment), in that order of precedence
    /// from lowest to highest, then groups and checks the result (see
    /// [`Settings::try_from`]).
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read, has an unknown key or a
    /// value of the wrong type, or when the values are out of range or do
    /// not fit together.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(RawSettings::default()));
        if let Some(path) = &args.config {
            // figment skips a missing file silently; a named file must exist.
            std::fs::metadata(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            figment = figment.merge(Toml::file_exact(path));
        }
        let raw: RawSettings = figment
            .merge(Serialized::defaults(args))
            .extract()
            .map_err(Box::new)?;
        Self::try_from(raw)
    }
}

impl TryFrom<RawSettings> for Settings {
    type Error = ConfigError;

    /// Builds each group from `raw`, checking its values: limits, store,
    /// metrics, auth, listener and transport, in that order, so that the
    /// error names the first setting at fault.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting at fault.
    fn try_from(raw: RawSettings) -> Result<Self, ConfigError> {
        let grouped = || -> Result<Self, String> {
            let limits = LimitSettings::from_raw(&raw)?;
            let store = StoreSettings::from_raw(&raw)?;
            let metrics = MetricsSettings::from_raw(&raw)?;
            let auth = AuthSettings::from_raw(&raw)?;
            let listen = ListenSettings::from_raw(&raw)?;
            let service = ServiceSettings::from_raw(&raw);
            Ok(Self {
                listen,
                store,
                limits,
                auth,
                metrics,
                service,
            })
        };
        grouped().map_err(ConfigError::Invalid)
    }
}

impl LimitSettings {
    /// The limits a request is held to: TTLs, waits, admission, timeouts.
    fn from_raw(raw: &RawSettings) -> Result<Self, String> {
        let max_ttl = Ttl::new(raw.max_ttl_ms).ok_or_else(|| {
            format!(
                "max_ttl_ms must be from 1 to {} (365 days)",
                Ttl::CEILING_MS
            )
        })?;
        let default_ttl =
            Ttl::from_millis(raw.default_ttl_ms, max_ttl.as_millis(), "default_ttl_ms").map_err(
                |_| {
                    format!(
                        "default_ttl_ms (--default-ttl-ms, {}) must be from 1 to max_ttl_ms ({}); \
                     a lower --max-ttl-ms needs a --default-ttl-ms at most as long",
                        raw.default_ttl_ms, raw.max_ttl_ms
                    )
                },
            )?;
        Ok(Self {
            default_ttl,
            max_ttl,
            max_wait: match raw.max_wait_ms {
                ms if ms > Ttl::CEILING_MS => {
                    return Err(format!(
                        "max_wait_ms must be at most {} (365 days)",
                        Ttl::CEILING_MS
                    ));
                }
                ms => Duration::from_millis(ms),
            },
            max_waiters: at_least_one("max_waiters", raw.max_waiters)?,
            max_requests: at_least_one("max_requests", raw.max_requests)?,
            request_timeout: at_least_1_ms("request_timeout_ms", raw.request_timeout_ms)?,
            max_semaphore_limit: match raw.max_semaphore_limit {
                0 => return Err("max_semaphore_limit must be at least 1".into()),
                n => n,
            },
            max_watchers: at_least_one("max_watchers", raw.max_watchers)?,
            watch_keepalive: at_least_1_ms("watch_keepalive_ms", raw.watch_keepalive_ms)?,
            run_retention: match raw.run_retention_ms {
                ms if ms < 1000 => {
                    return Err("run_retention_ms must be at least 1000 (1 s)".into());
                }
                ms if ms > MAX_RETENTION_MS => {
                    return Err(format!(
                        "run_retention_ms must be at most {MAX_RETENTION_MS} (30 days)"
                    ));
                }
                ms => Duration::from_millis(ms),
            },
            max_result_bytes: match raw.max_result_bytes {
                n if n == 0 || n > MAX_RESULT_BYTES => {
                    return Err(format!(
                        "max_result_bytes must be from 1 to {MAX_RESULT_BYTES} (64 KiB)"
                    ));
                }
                n => n,
            },
            max_meta_bytes: match raw.max_meta_bytes {
                n if n == 0 || n > Meta::CEILING_BYTES => {
                    return Err(format!(
                        "max_meta_bytes must be from 1 to {} (64 KiB)",
                        Meta::CEILING_BYTES
                    ));
                }
                n => n,
            },
        })
    }
}

impl StoreSettings {
    /// What the Redis URLs are: the mode given, or single for one URL and
    /// Redlock for several.
    pub fn mode(&self) -> RedisMode {
        self.redis_mode
            .unwrap_or_else(|| RedisMode::inferred(self.redis_urls.len()))
    }

    /// The lock store: the Redis nodes, their connections and timeouts,
    /// Redlock's parameters, the fences and the key prefix.
    fn from_raw(raw: &RawSettings) -> Result<Self, String> {
        let redis_timeout = at_least_1_ms("redis_timeout_ms", raw.redis_timeout_ms)?;
        let pool_size = at_least_one("pool_size", raw.pool_size)?;
        if raw.redis_url.is_empty() {
            return Err("redis_url needs at least one URL".into());
        }
        raw.redis_url.iter().try_for_each(check_redis_url)?;
        let mode = raw
            .redis_mode
            .unwrap_or_else(|| RedisMode::inferred(raw.redis_url.len()));
        if mode == RedisMode::Cluster {
            let tls = |u: &&RedisUrl| is_tls(u.expose());
            if let (Some(plain), Some(secure)) = (
                raw.redis_url.iter().find(|u| !tls(u)),
                raw.redis_url.iter().find(tls),
            ) {
                return Err(format!(
                    "redis_url: the seeds of one Redis Cluster take one scheme, but {plain} is \
                     redis:// and {secure} is rediss://; lockd reaches every node of the cluster \
                     as it reaches the seeds"
                ));
            }
        }
        let redis_tls = RedisTlsFiles {
            ca_cert: raw.redis_ca_cert.clone(),
            client: match (&raw.redis_client_cert, &raw.redis_client_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                (Some(_), None) => {
                    return Err(
                        "redis_client_cert is set but redis_client_key is not: a client \
                         certificate needs its key; give --redis-client-key (or \
                         LOCKD_REDIS_CLIENT_KEY, or redis_client_key in the file) too"
                            .into(),
                    );
                }
                (None, Some(_)) => {
                    return Err(
                        "redis_client_key is set but redis_client_cert is not: a client \
                         certificate needs both; give --redis-client-cert (or \
                         LOCKD_REDIS_CLIENT_CERT, or redis_client_cert in the file) too"
                            .into(),
                    );
                }
                (None, None) => None,
            },
        };
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = raw
            .redis_url
            .iter()
            .find(|u| !seen.insert(node_address(u.expose())))
        {
            return Err(match mode {
                RedisMode::Cluster => format!("redis_url lists the seed {twice} twice"),
                RedisMode::Sentinel => format!("redis_url lists the Sentinel {twice} twice"),
                _ => format!("redis_url lists {twice} twice; Redlock masters must be independent"),
            });
        }
        let urls = raw.redis_url.len();
        match mode {
            RedisMode::Single if urls > 1 => {
                return Err(format!(
                    "redis_mode single (--redis-mode) takes one redis_url, not {urls}: \
                     for independent masters use --redis-mode redlock, for the nodes of \
                     one Redis Cluster --redis-mode cluster"
                ));
            }
            RedisMode::Redlock if urls < 2 => {
                return Err(
                    "redis_mode redlock (--redis-mode) needs two redis_url values or more \
                     (3 or 5 independent masters are recommended)"
                        .into(),
                );
            }
            _ => {}
        }
        if raw.min_replicas_acked > 0 && mode == RedisMode::Redlock {
            return Err(
                "min_replicas_acked (--min-replicas-acked) is for single, cluster and sentinel \
                 modes: Redlock's nodes are independent masters, and its quorum is what \
                 survives the loss of one"
                    .into(),
            );
        }
        let replica_ack_timeout =
            at_least_1_ms("replica_ack_timeout_ms", raw.replica_ack_timeout_ms)?;
        if replica_ack_timeout >= redis_timeout {
            return Err(format!(
                "replica_ack_timeout_ms (--replica-ack-timeout-ms) must be below \
                 redis_timeout_ms ({} ms): the wait for replicas is part of the operation",
                redis_timeout.as_millis()
            ));
        }
        match (mode, raw.sentinel_master.as_deref()) {
            (RedisMode::Sentinel, None | Some("")) => {
                return Err("redis_mode sentinel (--redis-mode) needs sentinel_master \
                     (--sentinel-master NAME): the name the Sentinels monitor the master by"
                    .into());
            }
            (RedisMode::Sentinel, _) | (_, None) => {}
            (other, Some(_)) => {
                return Err(format!(
                    "sentinel_master (--sentinel-master) is for --redis-mode sentinel, not {}",
                    other.as_str()
                ));
            }
        }
        let node_timeout = at_least_1_ms("node_timeout_ms", raw.node_timeout_ms)?;
        if !(0.0..0.5).contains(&raw.drift_factor) {
            return Err("drift_factor must be from 0 to below 0.5".into());
        }
        if !(1000..=Ttl::CEILING_MS).contains(&raw.fence_retention_ms) {
            return Err(format!(
                "fence_retention_ms (--fence-retention-ms) must be from 1000 (1 s) to {} (365 days)",
                Ttl::CEILING_MS
            ));
        }
        let history_length = HistoryLength::new(raw.history_length).ok_or_else(|| {
            format!(
                "history_length (--history-length) must be from 0 (no history) to {}",
                HistoryLength::MAX
            )
        })?;
        if raw
            .redlock_restart_delay_ms
            .is_some_and(|ms| ms > Ttl::CEILING_MS)
        {
            return Err(format!(
                "redlock_restart_delay_ms (--redlock-restart-delay-ms) must be at most {} (365 days)",
                Ttl::CEILING_MS
            ));
        }
        if raw.key_prefix.contains(['{', '}']) {
            return Err("key_prefix must not contain braces: they mark the hash tag".into());
        }
        Ok(Self {
            dev: raw.dev,
            redis_urls: raw.redis_url.clone(),
            redis_mode: raw.redis_mode,
            sentinel_master: raw.sentinel_master.clone(),
            min_replicas_acked: raw.min_replicas_acked,
            replica_ack_timeout,
            redis_tls,
            key_prefix: raw.key_prefix.clone(),
            redis_timeout,
            pool_size,
            node_timeout,
            drift_factor: raw.drift_factor,
            fence_retention: Duration::from_millis(raw.fence_retention_ms),
            history_length,
            redlock_restart_delay: raw.redlock_restart_delay_ms.map(Duration::from_millis),
        })
    }
}

/// Whether lockd can connect with `url`: a `redis://` or `rediss://` (or
/// `unix://`) URL the redis crate parses, and not one that asks to skip
/// verifying the server (`#insecure`). The message names the setting, and
/// shows the URL without its password.
fn check_redis_url(url: &RedisUrl) -> Result<(), String> {
    let info = redis::IntoConnectionInfo::into_connection_info(url.expose()).map_err(|e| {
        format!(
            "redis_url {url} (--redis-url) cannot be used: {}; write it as \
             redis://[:PASSWORD@]HOST[:PORT][/DB], or rediss://... for TLS",
            redact_urls_in(&e.to_string())
        )
    })?;
    if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
        return Err(format!(
            "redis_url {url} (--redis-url): #insecure would skip verifying the server's \
             certificate, which lockd always does; give the CA that signed it with \
             --redis-ca-cert instead"
        ));
    }
    Ok(())
}

impl MetricsSettings {
    /// The metrics listener, apart from the main one.
    fn from_raw(raw: &RawSettings) -> Result<Self, String> {
        if raw
            .metrics_listen
            .is_some_and(|m| m == raw.listen && m.port() != 0)
        {
            return Err("metrics_listen must differ from listen".into());
        }
        Ok(Self {
            listen: raw.metrics_listen,
            max_namespaces: raw.metrics_max_namespaces,
        })
    }
}

impl AuthSettings {
    /// API keys, or their absence: only on loopback unless insecure.
    fn from_raw(raw: &RawSettings) -> Result<Self, String> {
        if raw.auth_keys_file.is_some() && raw.insecure_no_auth {
            return Err(
                "insecure_no_auth and auth_keys_file contradict each other; give one".into(),
            );
        }
        if raw.auth_keys_file.is_none() && !raw.insecure_no_auth && !raw.listen.ip().is_loopback() {
            return Err(format!(
                "refusing to listen on {} without API keys: anyone who can reach it could \
                 take and release any lock. Give --auth-keys-file (see `lockd keygen`), \
                 listen on a loopback address, or, for development only, --insecure-no-auth",
                raw.listen
            ));
        }
        Ok(Self {
            keys_file: raw.auth_keys_file.clone(),
            insecure_no_auth: raw.insecure_no_auth,
        })
    }
}

impl ListenSettings {
    /// The main listener's transport: TLS files, limits on request heads.
    fn from_raw(raw: &RawSettings) -> Result<Self, String> {
        let tls = match (&raw.tls_cert, &raw.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (Some(_), None) => {
                return Err(
                    "tls_cert is set but tls_key is not: HTTPS needs both; give \
                     --tls-key (or LOCKD_TLS_KEY, or tls_key in the file) too"
                        .into(),
                );
            }
            (None, Some(_)) => {
                return Err(
                    "tls_key is set but tls_cert is not: HTTPS needs both; give \
                     --tls-cert (or LOCKD_TLS_CERT, or tls_cert in the file) too"
                        .into(),
                );
            }
            (None, None) => None,
        };
        let header_read_timeout =
            at_least_1_ms("header_read_timeout_ms", raw.header_read_timeout_ms)?;
        if raw.max_header_bytes < MIN_HEADER_BYTES {
            return Err(format!(
                "max_header_bytes must be at least {MIN_HEADER_BYTES} (hyper's smallest read buffer)"
            ));
        }
        let cors_allow_origins = distinct(
            "cors_allow_origin",
            raw.cors_allow_origin.iter().map(|o| web_origin(o)),
        )?;
        let allowed_hosts = distinct(
            "allowed_host",
            raw.allowed_host.iter().map(|h| host_name(h)),
        )?;
        Ok(Self {
            addr: raw.listen,
            tls,
            header_read_timeout,
            max_header_bytes: raw.max_header_bytes,
            cors_allow_origins,
            allowed_hosts,
        })
    }
}

impl ServiceSettings {
    /// The process's logs and shutdown: any value will do.
    fn from_raw(raw: &RawSettings) -> Self {
        Self {
            log_format: raw.log_format,
            shutdown_timeout: Duration::from_millis(raw.shutdown_timeout_ms),
        }
    }
}

/// `value` as a count, or `Err("KEY must be at least 1")` for zero.
fn at_least_one(key: &str, value: usize) -> Result<NonZeroUsize, String> {
    NonZeroUsize::new(value).ok_or_else(|| format!("{key} must be at least 1"))
}

/// `ms` milliseconds, or `Err("KEY must be at least 1")` for zero.
fn at_least_1_ms(key: &str, ms: u64) -> Result<Duration, String> {
    if ms == 0 {
        return Err(format!("{key} must be at least 1"));
    }
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mistyped key gets the key it likely meant; a word of several
    /// keys gets those keys; a short word is not taken for any other short
    /// key (a new-user trial's `ttl = 5` was told "did you mean `dev`?").
    #[test]
    fn an_unknown_key_is_told_the_keys_it_likely_meant() {
        let known = ["dev", "listen", "default_ttl_ms", "max_ttl_ms", "redis_url"];
        assert_eq!(
            closest("default_tll_ms", &known).as_deref(),
            Some("`default_ttl_ms`")
        );
        assert_eq!(closest("listn", &known).as_deref(), Some("`listen`"));
        assert_eq!(
            closest("ttl", &known).as_deref(),
            Some("`default_ttl_ms` or `max_ttl_ms`")
        );
        assert_eq!(closest("xyz", &known), None);
        assert_eq!(closest("colour", &known), None);
    }
    use std::collections::BTreeMap;
    use std::io::Write as _;

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        writeln!(
            file,
            "max_ttl_ms = 5000\ndefault_ttl_ms = 4000\npool_size = 3"
        )
        .expect("write");
        let args = ServeArgs {
            config: Some(file.path().to_path_buf()),
            pool_size: Some(7),
            ..ServeArgs::default()
        };
        let settings = Settings::load(&args).expect("valid settings");
        assert_eq!(settings.limits.max_ttl.as_millis(), 5000);
        assert_eq!(settings.limits.default_ttl.as_millis(), 4000);
        assert_eq!(settings.store.pool_size.get(), 7);
        assert_eq!(settings.store.key_prefix, "lockd:");
    }

    #[test]
    fn unknown_keys_and_missing_files_are_errors() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        writeln!(file, "max_ttl = 5000").expect("write");
        let args = ServeArgs {
            config: Some(file.path().to_path_buf()),
            ..ServeArgs::default()
        };
        assert!(matches!(Settings::load(&args), Err(ConfigError::Parse(_))));
        let args = ServeArgs {
            config: Some("/nonexistent/lockd.toml".into()),
            ..ServeArgs::default()
        };
        assert!(matches!(
            Settings::load(&args),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn the_same_redis_node_twice_is_refused() {
        let args = ServeArgs {
            redis_url: vec![
                "redis://127.0.0.1:6381".into(),
                "redis://:pw@127.0.0.1:6381/0".into(),
                "redis://127.0.0.1:6382".into(),
            ],
            ..ServeArgs::default()
        };
        assert!(matches!(
            Settings::load(&args),
            Err(ConfigError::Invalid(_))
        ));
    }

    #[test]
    fn default_ttl_above_max_is_refused() {
        let args = ServeArgs {
            default_ttl_ms: Some(10),
            max_ttl_ms: Some(5),
            ..ServeArgs::default()
        };
        assert!(matches!(
            Settings::load(&args),
            Err(ConfigError::Invalid(_))
        ));
    }

    #[test]
    fn the_example_file_documents_every_setting_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/lockd.example.toml");
        let args = ServeArgs {
            config: Some(path.into()),
            ..ServeArgs::default()
        };
        let from_file = Settings::load(&args).expect("example file loads");
        assert_eq!(from_file, Settings::default());
        let defaults = serde_json::to_value(RawSettings::default()).expect("serializes");
        let text = std::fs::read_to_string(path).expect("read example");
        for (key, default) in defaults.as_object().expect("an object") {
            // A setting with no default (or an empty list) is shown
            // commented out.
            let unset = default.is_null() || default.as_array().is_some_and(Vec::is_empty);
            let line = if unset {
                format!("\n# {key} = ")
            } else {
                format!("\n{key} = ")
            };
            assert!(text.contains(&line), "{key} is not documented");
        }
    }

    /// The settings table of docs/configuration.md: one row per key of
    /// [`RawSettings`], with its flag, its environment variable and its default
    /// (`none` for an unset one or an empty list, or the setting it falls back to; `off` and
    /// `on` for a switch; otherwise the value in backticks).
    #[test]
    fn the_configuration_doc_lists_every_setting_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let text = std::fs::read_to_string(path).expect("read docs/configuration.md");
        let defaults = serde_json::to_value(RawSettings::default()).expect("serializes");
        let defaults = defaults.as_object().expect("an object");
        let mut rows = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("| `--")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [_, flag, env, key, default, ..] = cells[..] else {
                panic!("a settings row with too few cells: {line}");
            };
            if key.is_empty() {
                assert_eq!(flag, "`--config`", "a row with no file key: {line}");
                continue;
            }
            let key = key.trim_matches('`');
            assert!(
                rows.insert(key.to_owned(), (flag, env, default)).is_none(),
                "{key} is listed twice"
            );
        }
        let code = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => format!("`{s}`"),
            other => format!("`{other}`"),
        };
        for (key, value) in defaults {
            let (flag, env, default) = rows
                .remove(key)
                .unwrap_or_else(|| panic!("{key} is not in docs/configuration.md"));
            assert_eq!(flag, format!("`--{}`", key.replace('_', "-")), "{key}");
            let var = format!("`LOCKD_{}`", key.to_uppercase());
            assert!(env.starts_with(&var), "{key}: {env} is not {var}");
            let documented = match value {
                serde_json::Value::Null => {
                    default == "none"
                        || (default.starts_with('`')
                            && defaults.contains_key(default.trim_matches('`')))
                }
                serde_json::Value::Bool(on) => default == if *on { "on" } else { "off" },
                serde_json::Value::Array(all) if all.is_empty() => default == "none",
                serde_json::Value::Array(all) => {
                    default == all.iter().map(code).collect::<Vec<_>>().join(", ")
                }
                other => default == code(other),
            };
            assert!(
                documented,
                "{key}: the default is {value}, the doc says {default}"
            );
        }
        assert!(rows.is_empty(), "not settings: {:?}", rows.keys());
    }

    #[test]
    fn tls_needs_both_files_and_a_head_limit_of_at_least_8192() {
        let only_cert = ServeArgs {
            tls_cert: Some("/etc/lockd/cert.pem".into()),
            ..ServeArgs::default()
        };
        let Err(ConfigError::Invalid(why)) = Settings::load(&only_cert) else {
            panic!("a certificate without a key was accepted");
        };
        assert!(why.contains("--tls-key"), "{why}");
        let only_key = ServeArgs {
            tls_key: Some("/etc/lockd/key.pem".into()),
            ..ServeArgs::default()
        };
        let Err(ConfigError::Invalid(why)) = Settings::load(&only_key) else {
            panic!("a key without a certificate was accepted");
        };
        assert!(why.contains("--tls-cert"), "{why}");
        let small = ServeArgs {
            max_header_bytes: Some(MIN_HEADER_BYTES - 1),
            ..ServeArgs::default()
        };
        assert!(matches!(
            Settings::load(&small),
            Err(ConfigError::Invalid(_))
        ));
        let smallest = ServeArgs {
            max_header_bytes: Some(MIN_HEADER_BYTES),
            ..ServeArgs::default()
        };
        assert!(Settings::load(&smallest).is_ok());
    }

    #[test]
    fn tls_files_may_come_from_the_file() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        writeln!(
            file,
            "tls_cert = \"/etc/lockd/cert.pem\"\ntls_key = \"/etc/lockd/key.pem\"\nmax_header_bytes = 32768"
        )
        .expect("write");
        let args = ServeArgs {
            config: Some(file.path().to_path_buf()),
            header_read_timeout_ms: Some(750),
            ..ServeArgs::default()
        };
        let settings = Settings::load(&args).expect("valid settings");
        assert_eq!(
            settings.listen.tls,
            Some(TlsFiles {
                cert: "/etc/lockd/cert.pem".into(),
                key: "/etc/lockd/key.pem".into(),
            })
        );
        assert_eq!(settings.listen.max_header_bytes, 32768);
        assert_eq!(
            settings.listen.header_read_timeout,
            Duration::from_millis(750)
        );
    }

    /// `rediss://` URLs are accepted in every mode, a Redlock set may mix
    /// schemes and a cluster's seeds may not, `#insecure` is refused, and a
    /// client certificate needs its key (and the other way round), each
    /// message naming the setting.
    #[test]
    fn redis_tls_settings_are_checked_and_named() {
        let load = |mode: Option<RedisMode>, urls: &[&str], edit: fn(&mut RawSettings)| {
            let mut raw = RawSettings {
                redis_mode: mode,
                redis_url: urls.iter().map(|u| RedisUrl::from(*u)).collect(),
                ..RawSettings::default()
            };
            edit(&mut raw);
            Settings::try_from(raw)
        };
        let why = |s: Result<Settings, ConfigError>| match s {
            Err(ConfigError::Invalid(why)) => why,
            other => panic!("accepted: {other:?}"),
        };
        let tls = ["rediss://:pw@a:6380", "rediss://b:6380", "rediss://c:6380"];
        assert!(load(None, &tls[..1], |_| {}).is_ok());
        assert!(load(None, &tls, |_| {}).is_ok());
        assert!(load(Some(RedisMode::Cluster), &tls, |_| {}).is_ok());
        let mixed = ["redis://a:6379", "rediss://b:6380", "rediss://c:6380"];
        assert!(
            load(None, &mixed, |_| {}).is_ok(),
            "Redlock may mix schemes"
        );
        let seeds = why(load(Some(RedisMode::Cluster), &mixed, |_| {}));
        assert!(seeds.starts_with("redis_url"), "{seeds}");
        let insecure = why(load(None, &["rediss://:hunter2@a:6380/#insecure"], |_| {}));
        assert!(insecure.contains("--redis-ca-cert"), "{insecure}");
        assert!(!insecure.contains("hunter2"), "{insecure}");
        let only_cert = why(load(None, &tls[..1], |r| {
            r.redis_client_cert = Some("client.pem".into());
        }));
        assert!(only_cert.contains("--redis-client-key"), "{only_cert}");
        let only_key = why(load(None, &tls[..1], |r| {
            r.redis_client_key = Some("client.key".into());
        }));
        assert!(only_key.contains("--redis-client-cert"), "{only_key}");
        let both = load(None, &tls[..1], |r| {
            r.redis_ca_cert = Some("ca.pem".into());
            r.redis_client_cert = Some("client.pem".into());
            r.redis_client_key = Some("client.key".into());
        })
        .expect("accepted");
        assert_eq!(
            both.store.redis_tls,
            RedisTlsFiles {
                ca_cert: Some("ca.pem".into()),
                client: Some(TlsFiles {
                    cert: "client.pem".into(),
                    key: "client.key".into(),
                }),
            }
        );
    }

    #[test]
    fn debug_hides_the_redis_password() {
        let mut settings = Settings::default();
        settings.store.redis_urls = vec!["redis://:hunter2@127.0.0.1:6379".into()];
        assert!(!format!("{settings:?}").contains("hunter2"));
        assert!(!format!("{:?}", RawSettings::from(&settings)).contains("hunter2"));
        let url = &settings.store.redis_urls[0];
        assert!(!url.to_string().contains("hunter2"), "{url}");
        assert_eq!(url.expose(), "redis://:hunter2@127.0.0.1:6379");
    }

    #[test]
    fn the_defaults_are_one_set_in_both_shapes() {
        let raw = RawSettings::default();
        let grouped = Settings::try_from(raw.clone()).expect("the defaults are valid");
        assert_eq!(grouped, Settings::default());
        assert_eq!(RawSettings::from(&grouped), raw);
        // Every key survives the round trip, set or not.
        let mut raw = raw;
        raw.tls_cert = Some("/etc/lockd/cert.pem".into());
        raw.tls_key = Some("/etc/lockd/key.pem".into());
        raw.redlock_restart_delay_ms = Some(0);
        raw.metrics_listen = Some("127.0.0.1:9464".parse().expect("address"));
        raw.auth_keys_file = Some("/etc/lockd/keys.toml".into());
        raw.redis_ca_cert = Some("/etc/lockd/redis-ca.pem".into());
        raw.redis_client_cert = Some("/etc/lockd/redis-client.pem".into());
        raw.redis_client_key = Some("/etc/lockd/redis-client.key".into());
        raw.max_wait_ms = 0;
        let grouped = Settings::try_from(raw.clone()).expect("valid");
        assert_eq!(RawSettings::from(&grouped), raw);
    }

    /// `redis_mode` is inferred from the number of URLs when unset, and a
    /// mode that does not fit them is refused with a message that names the
    /// fitting modes.
    #[test]
    fn the_redis_mode_is_inferred_and_must_fit_the_urls() {
        let load = |mode: Option<RedisMode>, urls: &[&str]| {
            Settings::try_from(RawSettings {
                redis_mode: mode,
                redis_url: urls.iter().map(|u| RedisUrl::from(*u)).collect(),
                ..RawSettings::default()
            })
        };
        let (one, three) = (
            ["redis://a:6379"],
            ["redis://a:6379", "redis://b:6379", "redis://c:6379"],
        );
        let mode = |s: Result<Settings, ConfigError>| s.expect("accepted").store.mode();
        assert_eq!(mode(load(None, &one)), RedisMode::Single);
        assert_eq!(mode(load(None, &three)), RedisMode::Redlock);
        assert_eq!(
            mode(load(Some(RedisMode::Cluster), &one)),
            RedisMode::Cluster
        );
        assert_eq!(
            mode(load(Some(RedisMode::Cluster), &three)),
            RedisMode::Cluster
        );
        let why = |s: Result<Settings, ConfigError>| match s {
            Err(ConfigError::Invalid(why)) => why,
            other => panic!("accepted: {other:?}"),
        };
        let single = why(load(Some(RedisMode::Single), &three));
        assert!(single.contains("--redis-mode cluster"), "{single}");
        assert!(single.contains("--redis-mode redlock"), "{single}");
        let redlock = why(load(Some(RedisMode::Redlock), &one));
        assert!(redlock.starts_with("redis_mode redlock"), "{redlock}");
        let twice = why(load(
            Some(RedisMode::Cluster),
            &["redis://a:6379", "redis://a:6379"],
        ));
        assert!(twice.contains("seed"), "{twice}");
    }

    /// `min_replicas_acked` is refused with Redlock, and the ack timeout
    /// must fit in the Redis timeout.
    #[test]
    fn replica_acks_fit_the_mode_and_the_timeout() {
        let load = |raw: RawSettings| match Settings::try_from(raw) {
            Err(ConfigError::Invalid(why)) => Some(why),
            Err(other) => panic!("{other}"),
            Ok(_) => None,
        };
        let three = ["redis://a:6379", "redis://b:6379", "redis://c:6379"]
            .map(RedisUrl::from)
            .to_vec();
        let redlock = load(RawSettings {
            redis_url: three,
            min_replicas_acked: 1,
            ..RawSettings::default()
        });
        assert!(
            redlock
                .as_deref()
                .is_some_and(|w| w.starts_with("min_replicas_acked")),
            "{redlock:?}"
        );
        let slow = load(RawSettings {
            min_replicas_acked: 1,
            replica_ack_timeout_ms: 1_000,
            redis_timeout_ms: 1_000,
            ..RawSettings::default()
        });
        assert!(
            slow.as_deref()
                .is_some_and(|w| w.starts_with("replica_ack_timeout_ms")),
            "{slow:?}"
        );
        assert_eq!(
            load(RawSettings {
                min_replicas_acked: 2,
                ..RawSettings::default()
            }),
            None
        );
    }

    #[test]
    fn each_group_names_its_setting_at_fault() {
        let refused = |edit: fn(&mut RawSettings)| {
            let mut raw = RawSettings::default();
            edit(&mut raw);
            match Settings::try_from(raw) {
                Err(ConfigError::Invalid(why)) => why,
                other => panic!("accepted: {other:?}"),
            }
        };
        assert!(refused(|r| r.max_ttl_ms = 0).starts_with("max_ttl_ms"));
        assert!(refused(|r| r.max_ttl_ms = Ttl::CEILING_MS + 1).starts_with("max_ttl_ms"));
        assert!(refused(|r| r.default_ttl_ms = 0).contains("--default-ttl-ms"));
        assert!(refused(|r| r.max_waiters = 0).starts_with("max_waiters"));
        assert!(refused(|r| r.max_requests = 0).starts_with("max_requests"));
        assert!(refused(|r| r.request_timeout_ms = 0).starts_with("request_timeout_ms"));
        assert!(refused(|r| r.redis_timeout_ms = 0).starts_with("redis_timeout_ms"));
        assert!(refused(|r| r.pool_size = 0).starts_with("pool_size"));
        assert!(refused(|r| r.redis_url.clear()).starts_with("redis_url"));
        assert!(refused(|r| r.node_timeout_ms = 0).starts_with("node_timeout_ms"));
        assert!(refused(|r| r.drift_factor = 0.5).starts_with("drift_factor"));
        assert!(refused(|r| r.fence_retention_ms = 999).contains("--fence-retention-ms"));
        assert!(refused(|r| r.history_length = 1001).contains("--history-length"));
        assert!(
            refused(|r| r.redlock_restart_delay_ms = Some(Ttl::CEILING_MS + 1))
                .contains("--redlock-restart-delay-ms")
        );
        assert!(refused(|r| r.key_prefix = "{x}".into()).starts_with("key_prefix"));
        assert!(refused(|r| r.metrics_listen = Some(r.listen)).starts_with("metrics_listen"));
        assert!(
            refused(|r| {
                r.auth_keys_file = Some("keys.toml".into());
                r.insecure_no_auth = true;
            })
            .contains("contradict")
        );
        assert!(
            refused(|r| r.listen = "0.0.0.0:8080".parse().expect("address"))
                .contains("--insecure-no-auth")
        );
        assert!(refused(|r| r.header_read_timeout_ms = 0).starts_with("header_read_timeout_ms"));
        // The first group at fault is the one named: limits before the
        // listener.
        assert!(
            refused(|r| {
                r.max_header_bytes = 0;
                r.max_waiters = 0;
            })
            .starts_with("max_waiters")
        );
    }

    #[test]
    fn allowed_origins_are_web_origins_and_hosts_are_names() {
        assert_eq!(
            web_origin("https://Dash.Example.com:443/"),
            Ok("https://dash.example.com".to_owned())
        );
        assert_eq!(
            web_origin("http://127.0.0.1:3000"),
            Ok("http://127.0.0.1:3000".to_owned())
        );
        for bad in [
            "dash.example.com",
            "ftp://dash.example.com",
            "https://dash.example.com/app",
            "https://user@dash.example.com",
            "https://dash.example.com?x",
            "*",
            "https://*.example.com",
            "null",
            "",
        ] {
            assert!(web_origin(bad).is_err(), "{bad}");
        }
        assert_eq!(
            host_name("Lockd.Internal."),
            Ok("lockd.internal".to_owned())
        );
        assert_eq!(host_name("10.0.0.5"), Ok("10.0.0.5".to_owned()));
        for bad in [
            "lockd.internal:8080",
            "",
            "a..b",
            "http://x",
            "a b",
            "-bad.test",
            "bad-.test",
        ] {
            assert!(host_name(bad).is_err(), "{bad}");
        }
        let twice = Settings::try_from(RawSettings {
            cors_allow_origin: vec!["https://a.example".into(), "https://A.example/".into()],
            ..RawSettings::default()
        });
        assert_eq!(
            twice.err().map(|e| e.to_string()),
            Some("invalid settings: cors_allow_origin lists https://a.example twice".to_owned())
        );
    }
}
