//! The command line: `lockd`'s subcommands, and the flags of `lockd serve`
//! (each with its environment variable), which [`crate::config::Settings`]
//! merges over the `--config` file and the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::client::args::{
    AcquireArgs, BreakArgs, ExecArgs, ExtendArgs, HistoryArgs, ReleaseArgs, RunCommand, StatusArgs,
    WatchArgs,
};

/// A listening address: an IP address and a port. A host name is refused
/// with the rule, since which of its addresses to bind would be a guess.
///
/// # Errors
/// The rule, for any other text.
pub fn socket_address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        "an IP address and a port are needed, such as 127.0.0.1:8080, 0.0.0.0:8080 or \
         [::1]:8080 (a host name such as localhost is not resolved: use 127.0.0.1 for it)"
            .to_owned()
    })
}

/// Parses the command line as [`Cli::parse`] does; a refused value that
/// came from an environment variable (the flag not given) is said to be
/// that variable's, not the flag's.
pub fn parse() -> Cli {
    use clap::CommandFactory as _;
    use clap::error::{ContextKind, ContextValue};
    let error = match Cli::try_parse() {
        Ok(cli) => return cli,
        Err(error) => error,
    };
    let flag = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.split(' ').next().unwrap_or_default().to_owned(),
        _ => error.exit(),
    };
    let given = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let command = Cli::command();
    let env = command
        .get_subcommands()
        .flat_map(clap::Command::get_arguments)
        .find(|a| a.get_long().is_some_and(|l| format!("--{l}") == flag))
        .and_then(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned());
    match env {
        Some(var) if !given && std::env::var_os(&var).is_some() => {
            let text = error.to_string();
            let from = text
                .split_once(&format!("'{flag}"))
                .and_then(|(_, rest)| rest.split_once('\''))
                .map(|(tail, _)| format!("'{flag}{tail}'"));
            let text = match from {
                Some(quoted) => {
                    text.replacen(&quoted, &format!("{var} (the variable of {flag})"), 1)
                }
                None => text,
            };
            eprint!("{text}");
            std::process::exit(2);
        }
        _ => error.exit(),
    }
}

/// `lockd`: a distributed lock service over HTTP, with locks held in Redis.
#[derive(Debug, Parser)]
#[command(name = "lockd", version, about, long_about = LONG_ABOUT)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What `lockd --help` and the manual page lockd(1) say of lockd.
const LONG_ABOUT: &str = "\
A distributed lock service over HTTP, with locks held in Redis.

`lockd serve` runs the service. The other subcommands are its clients, for \
shell scripts and cron: `lockd exec` runs a command while holding a lock \
(or a semaphore's permit, or once per key), `lockd acquire`, `extend`, \
`release` and `status` manage a lock, `lockd run` a run, `lockd watch` \
follows a lock's changes, and `lockd history` and `lockd break` are for \
operators: who held a lock, and ending a stuck holder's lease. `lockd \
keygen` mints API keys.

Each subcommand's --help (or its manual page, such as lockd-serve(1)) tells \
its flags.";

/// Headings of `lockd serve --help`, one per group of flags; its manual
/// page, lockd-serve(1), has a section for each.
pub mod heading {
    /// Where and how lockd listens.
    pub const LISTENING: &str = "Listening";
    /// Who may call: API keys, browsers, host names.
    pub const ACCESS: &str = "Access";
    /// The Redis servers and how lockd talks to them.
    pub const REDIS: &str = "Redis";
    /// Leases, waits, runs and the caps on requests.
    pub const LIMITS: &str = "Leases and limits";
    /// Metrics and logs.
    pub const OBSERVABILITY: &str = "Metrics and logs";
}

/// What `lockd serve --help` says after the flags, and the manual page
/// lockd-serve(1) in sections of its own: a heading and its text.
pub const SERVE_SECTIONS: [(&str, &str); 5] = [
    (
        "Settings",
        "Each flag has an environment variable (named with it above) and a key \
of the --config file: its name without the dashes and with _ for -, such as \
max_ttl_ms. Precedence, highest first: flag, environment variable, file, \
built-in default. An unknown key in the file is an error.",
    ),
    (
        "Environment",
        "LOCKD_LOG, or else RUST_LOG, sets the log filter, such as info, warn \
or lockd=debug [default: info,redis::cluster_handling=error]; an empty one \
counts as unset. Every flag's variable is named with the flag.",
    ),
    (
        "Signals",
        "SIGTERM or SIGINT stops lockd: /readyz turns 503 and the listener \
closes, requests waiting for a lock are answered 503 with Retry-After, and \
the requests in flight get --shutdown-timeout-ms to finish. SIGHUP reads \
the --auth-keys-file again, and lockd goes on.",
    ),
    (
        "Exit status",
        "0: stopped by SIGTERM or SIGINT. 1: a failure while starting or \
running, such as a listening address in use; the log says which. 2: a flag, \
variable or file setting that cannot be used, named on stderr.",
    ),
    (
        "Files",
        "/etc/lockd/lockd.toml: the settings file that the Debian package \
installs, with every key at its default and documented, and that its unit \
lockd.service passes with --config.",
    ),
];

/// [`SERVE_SECTIONS`] as `lockd serve --help` prints them.
fn serve_after_long_help() -> String {
    let mut text = String::new();
    for (heading, body) in SERVE_SECTIONS {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(heading);
        text.push_str(":\n  ");
        text.push_str(body);
        text.push('\n');
    }
    text
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service.
    ///
    /// lockd serves the HTTP API (locks, semaphores, runs, watches, /healthz,
    /// /readyz, /metrics, /openapi.json) on --listen, with its locks held in
    /// Redis: one server, Redlock over independent masters, a Redis Cluster
    /// or a master under Sentinel (--redis-url, --redis-mode), or, with
    /// --dev, in its own memory.
    #[command(
        override_usage = "lockd serve [OPTIONS]",
        after_long_help = serve_after_long_help()
    )]
    Serve(Box<ServeArgs>),
    /// Print the OpenAPI document (JSON) that `/openapi.json` serves.
    Openapi,
    /// Run a command while holding a lock, like flock(1) across machines:
    /// `lockd exec [OPTIONS] NAME -- CMD [ARGS...]`.
    Exec(Box<ExecArgs>),
    /// Take a lock; print the server's JSON answer.
    Acquire(AcquireArgs),
    /// Extend a lease you hold; print the server's JSON answer.
    Extend(ExtendArgs),
    /// Release a lock you hold.
    Release(ReleaseArgs),
    /// Show who holds a lock (exit 1 when it is free).
    Status(StatusArgs),
    /// Start, complete, abandon, extend or show a run (a job that runs
    /// once per key); print the server's JSON answer.
    #[command(subcommand)]
    Run(RunCommand),
    /// Break a lock (or a semaphore's permits, or a run's attempt): end its
    /// live lease whatever the token, with an API key that has the `admin`
    /// permission; print whose leases ended. The holder's next extend or
    /// release is refused (`lockd exec` stops its command at its next
    /// renewal, within a third of its TTL), and the next grant's fence is
    /// larger.
    Break(BreakArgs),
    /// Print a lock's (or a semaphore's, a run's) last leases as JSON,
    /// newest first: fence, owner, meta, when granted, and how each ended.
    History(HistoryArgs),
    /// Print a lock's changes as JSON lines, as they happen (`state` first,
    /// then `acquired`, `extended`, `released`, `expired`, `broken`), reconnecting
    /// with backoff when the stream is lost.
    Watch(WatchArgs),
    /// Mint an API key: prints the secret (once) and adds the key's SHA-256
    /// to the keys file given by --keys-file.
    Keygen(crate::keygen::KeygenArgs),
    /// Write the manual pages (lockd.1, lockd-serve.1, ...) into a
    /// directory, for packaging; hidden from the help.
    #[command(hide = true)]
    Manpages(ManpagesArgs),
}

/// Flags of the hidden `lockd manpages`.
#[derive(Debug, Args)]
pub struct ManpagesArgs {
    /// The directory to write the pages into (it must exist).
    pub dir: PathBuf,
}

/// Flags of `lockd serve`. Each one overrides the same setting from the
/// `--config` file; unset flags leave the file's value or the default.
#[derive(Debug, Default, Args, Serialize)]
pub struct ServeArgs {
    /// A TOML file of settings, each keyed by its flag's name with _ for -
    /// (config/lockd.example.toml in the source, installed as
    /// /etc/lockd/lockd.toml by the Debian package, documents every key)
    /// [default: none].
    #[arg(long, env = "LOCKD_CONFIG", value_name = "PATH")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(help_heading = heading::LISTENING)]
    #[arg(long, env = "LOCKD_LISTEN", value_parser = crate::cli::socket_address)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Serve HTTPS with this certificate chain: a PEM file, the server's
    /// certificate first, then any intermediates. Needs --tls-key
    /// [default: plain HTTP].
    #[arg(help_heading = heading::LISTENING)]
    #[arg(long, env = "LOCKD_TLS_CERT", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert: a PEM file (PKCS#8, PKCS#1 or SEC1,
    /// not encrypted). Needs --tls-cert.
    #[arg(help_heading = heading::LISTENING)]
    #[arg(long, env = "LOCKD_TLS_KEY", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Longest time a client may take to send a request's head (request
    /// line and headers), in ms, counted from the connection's start or the
    /// previous answer; then the connection is closed. It also closes a
    /// keep-alive connection left idle that long [default: 5000].
    #[arg(help_heading = heading::LISTENING)]
    #[arg(long, env = "LOCKD_HEADER_READ_TIMEOUT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_read_timeout_ms: Option<u64>,
    /// Largest request head (request line and headers) accepted, in bytes;
    /// a longer one is answered 431 and the connection closed. At least
    /// 8192 [default: 16384].
    #[arg(help_heading = heading::LISTENING)]
    #[arg(long, env = "LOCKD_MAX_HEADER_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_header_bytes: Option<usize>,
    /// A web origin (`scheme://host[:port]`, such as
    /// `https://dash.example.com`) whose pages may call lockd from a browser:
    /// its CORS preflights are answered and its answers carry
    /// Access-Control-Allow-Origin. Give it more than once (or
    /// comma-separated in LOCKD_CORS_ALLOW_ORIGIN) for several. A browser
    /// request from any other origin (its Origin header, or
    /// Sec-Fetch-Site: cross-site) is refused 403 and writes nothing
    /// [default: none; pages served by lockd itself are always allowed].
    #[arg(help_heading = heading::ACCESS)]
    #[arg(
        long,
        env = "LOCKD_CORS_ALLOW_ORIGIN",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cors_allow_origin: Vec<String>,
    /// On a loopback --listen, a host name that a request's Host may name
    /// beside the loopback names and addresses (localhost, *.localhost,
    /// 127.0.0.0/8, `[::1]`); any other is refused 421, which stops DNS
    /// rebinding. Give it more than once (or comma-separated in
    /// LOCKD_ALLOWED_HOST) for several [default: none].
    #[arg(help_heading = heading::ACCESS)]
    #[arg(
        long,
        env = "LOCKD_ALLOWED_HOST",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_host: Vec<String>,
    /// Redis URL, e.g. redis://:password@host:6379/0, or rediss://... for TLS
    /// [default: redis://127.0.0.1:6379].
    /// Give it more than once (or comma-separated in LOCKD_REDIS_URL) to run
    /// Redlock over those independent masters (3 or 5 are recommended), or,
    /// with --redis-mode, the seeds of a cluster or the Sentinels.
    #[arg(help_heading = heading::REDIS)]
    #[arg(
        long,
        env = "LOCKD_REDIS_URL",
        value_delimiter = ',',
        hide_env_values = true
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redis_url: Vec<String>,
    /// What the --redis-url values are: one server (single), independent
    /// masters (redlock), seed nodes of a Redis Cluster (cluster), or
    /// Sentinels (sentinel, with --sentinel-master) [default: single with
    /// one URL, redlock with several].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_REDIS_MODE", value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_mode: Option<RedisMode>,
    /// After each grant, extend and release, wait (Redis `WAIT`) until this many
    /// replicas acknowledged it; fewer within --replica-ack-timeout-ms undo
    /// a grant and answer 503 replication-lagging. Single, cluster and
    /// sentinel modes; 0 waits for none [default: 0].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_MIN_REPLICAS_ACKED")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_replicas_acked: Option<usize>,
    /// How long a grant or extend waits for --min-replicas-acked replicas,
    /// in ms; below --redis-timeout-ms [default: 200].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_REPLICA_ACK_TIMEOUT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_ack_timeout_ms: Option<u64>,
    /// The name the Sentinels monitor the master by (as in `sentinel
    /// monitor NAME ...`); needed with --redis-mode sentinel, refused
    /// without it.
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_SENTINEL_MASTER", value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel_master: Option<String>,
    /// CA certificates (a PEM file) to verify the certificates of rediss://
    /// servers against, instead of the system's root certificates; a
    /// self-signed server certificate given here is accepted as itself
    /// (pinned, its name still checked) [default: the system's roots].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_REDIS_CA_CERT", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_ca_cert: Option<PathBuf>,
    /// A client certificate chain (a PEM file) for rediss:// servers that
    /// require one (tls-auth-clients). Needs --redis-client-key
    /// [default: none].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_REDIS_CLIENT_CERT", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_client_cert: Option<PathBuf>,
    /// The private key of --redis-client-cert: a PEM file (PKCS#8, PKCS#1
    /// or SEC1, not encrypted). Needs --redis-client-cert.
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_REDIS_CLIENT_KEY", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_client_key: Option<PathBuf>,
    /// Prefix of every Redis key lockd writes [default: lockd:].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_KEY_PREFIX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// Lease length when a request gives no ttl_ms, in ms [default: 30000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_DEFAULT_TTL_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_ttl_ms: Option<u64>,
    /// Longest lease a request may ask for, in ms [default: 3600000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_TTL_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ttl_ms: Option<u64>,
    /// Longest time one Redis operation may take, connecting included, in ms;
    /// past it the request gets 503 [default: 1000].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_REDIS_TIMEOUT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_timeout_ms: Option<u64>,
    /// Most pooled Redis connections [default: 16].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_POOL_SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<usize>,
    /// Redlock: the longest one node may take to answer, in ms; far below
    /// the TTL [default: 50].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_NODE_TIMEOUT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_timeout_ms: Option<u64>,
    /// Redlock: clock drift allowed, as a fraction of the TTL (plus 2 ms)
    /// [default: 0.01].
    #[arg(help_heading = heading::REDIS)]
    #[arg(long, env = "LOCKD_DRIFT_FACTOR", allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_factor: Option<f64>,
    /// How long a lock's fencing counter is kept in Redis after its last
    /// grant, in ms; at least 1000. A lock released that long ago leaves
    /// nothing in Redis; its next fence still comes out larger (see the
    /// guarantees in docs/design.md) [default: 3600000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_FENCE_RETENTION_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_retention_ms: Option<u64>,
    /// How many leases each name's history keeps (GET
    /// /locks/{name}/history, and a semaphore's or a run's), newest first,
    /// from 0 (no history) to 1000; kept in Redis beside the name, gone
    /// with it after --fence-retention-ms [default: 20].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_HISTORY_LENGTH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_length: Option<usize>,
    /// Redlock: how long a node that restarted counts toward no quorum, in
    /// ms, counted from its start; lockd still writes to it meanwhile
    /// (the delayed restart) [default: max_ttl_ms].
    #[arg(help_heading = heading::REDIS)]
    #[arg(
        long,
        env = "LOCKD_REDLOCK_RESTART_DELAY_MS",
        allow_negative_numbers = true,
        value_parser = crate::client::args::millis
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redlock_restart_delay_ms: Option<u64>,
    /// Longest wait_ms a request may ask for, in ms [default: 60000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_WAIT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// Most requests waiting at once (locks, permits and run starts together); beyond it, 503 [default: 10000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_WAITERS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_waiters: Option<usize>,
    /// The largest limit a semaphore may have [default: 10000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_SEMAPHORE_LIMIT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_semaphore_limit: Option<u32>,
    /// Most watches (GET .../events streams) open at once; beyond it, 503
    /// [default: 10000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_WATCHERS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_watchers: Option<usize>,
    /// Silence in ms after which a watch's stream gets a comment line, so
    /// that proxies keep it open [default: 15000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_WATCH_KEEPALIVE_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_keepalive_ms: Option<u64>,
    /// How long a done run's result is kept, in ms, and a pending run's
    /// record after its last attempt; a request's retention_ms may shorten
    /// it; 1000 to 2592000000 (30 days) [default: 86400000, 24 h].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_RUN_RETENTION_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_retention_ms: Option<u64>,
    /// The largest result a run may store, in bytes of JSON, from 1 to
    /// 65536; a larger one gets 413 [default: 65536].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_RESULT_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_result_bytes: Option<usize>,
    /// The largest holder metadata (`meta`) an acquire, a permit or a
    /// run's start may give, in bytes of compact JSON, from 1 to 65536; a
    /// larger one gets 400 [default: 1024].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_META_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_meta_bytes: Option<usize>,
    /// Most /locks acquires and inspects served at once besides the
    /// max_waiters waiting ones; extends and releases get as many again of
    /// their own, which acquires cannot take; beyond, 503 overloaded
    /// [default: 1024].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_MAX_REQUESTS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<usize>,
    /// Keep locks in this process's memory instead of Redis, to try lockd
    /// without Redis. Locks are not shared between processes.
    /// LOCKD_DEV takes 1/0, true/false, yes/no, on/off.
    /// `--dev=false` (or LOCKD_DEV=0) turns off `dev = true` of the file.
    #[arg(help_heading = heading::REDIS)]
    #[arg(
        long,
        env = "LOCKD_DEV",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<bool>,
    /// Serve /metrics (with /healthz and /readyz) on this address instead of
    /// the main one, e.g. 127.0.0.1:9464 [default: on the main listener].
    #[arg(help_heading = heading::OBSERVABILITY)]
    #[arg(long, env = "LOCKD_METRICS_LISTEN", value_parser = crate::cli::socket_address)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Most lock-name namespaces with their own metric series; the rest are
    /// counted as `other` [default: 100].
    #[arg(help_heading = heading::OBSERVABILITY)]
    #[arg(long, env = "LOCKD_METRICS_MAX_NAMESPACES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_max_namespaces: Option<usize>,
    /// Longest time a request other than a waiting acquire may take, in ms;
    /// an acquire may take its wait_ms on top. Past it: 503 [default: 10000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_REQUEST_TIMEOUT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// On SIGTERM, longest time to finish the requests in flight before
    /// exiting, in ms [default: 10000].
    #[arg(help_heading = heading::LIMITS)]
    #[arg(long, env = "LOCKD_SHUTDOWN_TIMEOUT_MS", allow_negative_numbers = true, value_parser = crate::client::args::millis)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_timeout_ms: Option<u64>,
    /// A TOML file of API keys (see `lockd keygen`); every /locks request,
    /// and /metrics on the main listener, then needs
    /// `Authorization: Bearer <secret>`. Reloaded on SIGHUP [default: none].
    #[arg(help_heading = heading::ACCESS)]
    #[arg(long, env = "LOCKD_AUTH_KEYS_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_keys_file: Option<PathBuf>,
    /// Serve without API keys on a non-loopback address: anyone who can
    /// reach lockd can take and release any lock. For development only.
    /// Without keys, lockd otherwise listens only on loopback addresses.
    /// `--insecure-no-auth=false` (or LOCKD_INSECURE_NO_AUTH=0) turns off
    /// `insecure_no_auth = true` of the file.
    #[arg(help_heading = heading::ACCESS)]
    #[arg(
        long,
        env = "LOCKD_INSECURE_NO_AUTH",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_no_auth: Option<bool>,
    /// Log line format: pretty (one human-readable line per event) or json
    /// (one JSON object per line) [default: pretty]. RUST_LOG sets the level.
    #[arg(help_heading = heading::OBSERVABILITY)]
    #[arg(long, env = "LOCKD_LOG_FORMAT", value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Pretty,
    /// One JSON object per line, with the span's fields.
    Json,
}

/// What the Redis URLs are (`--redis-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One Redis server: one URL.
    Single,
    /// Redlock over independent masters: two URLs or more (3 or 5
    /// recommended).
    Redlock,
    /// A Redis Cluster: the URLs are seed nodes, and lockd discovers the
    /// rest. Each lock lives on the master of its name's slot.
    Cluster,
    /// A master with replicas under Redis Sentinel: the URLs are
    /// Sentinels, which name the master (`--sentinel-master`).
    Sentinel,
}

impl RedisMode {
    /// The mode `urls` URLs mean when none is given: one is single, several
    /// are Redlock.
    pub fn inferred(urls: usize) -> Self {
        if urls > 1 {
            Self::Redlock
        } else {
            Self::Single
        }
    }

    /// The mode's name, as `--redis-mode` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Redlock => "redlock",
            Self::Cluster => "cluster",
            Self::Sentinel => "sentinel",
        }
    }
}
