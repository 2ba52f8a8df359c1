//! Settings: the flags and environment variables of `lockd serve`
//! ([`crate::cli::ServeArgs`]) over an optional TOML file (`--config`, read
//! with figment) over defaults.
//! `config/lockd.example.toml` documents every setting.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::cli::ServeArgs;
use crate::lock::Ttl;
use crate::lock::redis::{redact_url, redact_urls_in};

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

/// The service's settings, after flags, environment, file and defaults are
/// merged. `Debug` hides any password in the Redis URLs (see [`RedisUrl`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
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
    /// Redis URLs: one runs the single-instance backend, several run Redlock
    /// over them. A TOML file may give one string or a list.
    #[serde(deserialize_with = "one_or_many")]
    pub redis_url: Vec<RedisUrl>,
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
    /// Redlock: how long a restarted node counts toward no quorum, in
    /// milliseconds from its start; `None`: `max_ttl_ms`.
    #[serde(default)]
    pub redlock_restart_delay_ms: Option<u64>,
    /// Longest `wait_ms` a request may ask for, in milliseconds.
    pub max_wait_ms: u64,
    /// Most requests waiting for locks at once.
    pub max_waiters: usize,
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

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tls_cert: None,
            tls_key: None,
            header_read_timeout_ms: 5_000,
            max_header_bytes: 16_384,
            redis_url: vec![RedisUrl::from("redis://127.0.0.1:6379")],
            key_prefix: "lockd:".into(),
            default_ttl_ms: 30_000,
            max_ttl_ms: 3_600_000,
            redis_timeout_ms: 1_000,
            pool_size: 16,
            node_timeout_ms: 50,
            drift_factor: 0.01,
            fence_retention_ms: 3_600_000,
            redlock_restart_delay_ms: None,
            max_wait_ms: 60_000,
            max_waiters: 10_000,
            max_requests: 1024,
            dev: false,
            metrics_listen: None,
            metrics_max_namespaces: 100,
            request_timeout_ms: 10_000,
            shutdown_timeout_ms: 10_000,
            log_format: LogFormat::Pretty,
            auth_keys_file: None,
            insecure_no_auth: false,
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
                .map(|k| format!("; did you mean `{k}`?"))
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

/// The known key closest to `found` (a typo's likely intent), if one is
/// close enough.
fn closest<'a>(found: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(found, k), *k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
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

/// A Redis URL as given (`redis://[:PASSWORD@]HOST[:PORT][/DB]`); the
/// backend parses it when it connects. Its `Debug` and `Display` hide the
/// password (see [`redact_url`]); [`RedisUrl::expose`] gives the URL itself,
/// for making the connection.
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
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<RedisUrl>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(RedisUrl),
        Many(Vec<RedisUrl>),
    }
    // The untagged enum's own error ("data did not match any variant of
    // untagged enum OneOrMany") tells a user nothing.
    let urls = OneOrMany::deserialize(d).map_err(|_| {
        serde::de::Error::custom("expected a Redis URL (a string) or a list of them")
    })?;
    Ok(match urls {
        OneOrMany::One(url) => vec![url],
        OneOrMany::Many(urls) => urls,
    })
}

impl Settings {
    /// Redlock's restart delay: `redlock_restart_delay_ms`, or `max_ttl_ms`.
    pub fn redlock_restart_delay(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.redlock_restart_delay_ms.unwrap_or(self.max_ttl_ms))
    }

    /// Merges defaults, the `--config` file and the flags (which clap has
    /// already merged with the environment), in that order of precedence
    /// from lowest to highest, then checks the result.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read, has an unknown key or a
    /// value of the wrong type, or when the values do not fit together.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(path) = &args.config {
            // figment skips a missing file silently; a named file must exist.
            std::fs::metadata(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            figment = figment.merge(Toml::file_exact(path));
        }
        let settings: Settings = figment
            .merge(Serialized::defaults(args))
            .extract()
            .map_err(Box::new)?;
        settings.check()?;
        Ok(settings)
    }

    /// Checks the values that each parse alone but must fit together: each
    /// concern in turn (limits, store, metrics, auth, listener and
    /// transport), each naming the setting at fault.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting at fault.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_limits()
            .and_then(|()| self.check_store())
            .and_then(|()| self.check_metrics())
            .and_then(|()| self.check_auth())
            .and_then(|()| self.check_listen())
            .map_err(ConfigError::Invalid)
    }

    /// The limits a request is held to: TTLs, waits, admission, timeouts.
    fn check_limits(&self) -> Result<(), String> {
        if !(1..=Ttl::CEILING_MS).contains(&self.max_ttl_ms) {
            return Err(format!(
                "max_ttl_ms must be from 1 to {} (365 days)",
                Ttl::CEILING_MS
            ));
        }
        if !(1..=self.max_ttl_ms).contains(&self.default_ttl_ms) {
            return Err(format!(
                "default_ttl_ms (--default-ttl-ms, {}) must be from 1 to max_ttl_ms ({}); \
                 a lower --max-ttl-ms needs a --default-ttl-ms at most as long",
                self.default_ttl_ms, self.max_ttl_ms
            ));
        }
        at_least_one("max_waiters", self.max_waiters)?;
        at_least_one("max_requests", self.max_requests)?;
        at_least_one("request_timeout_ms", self.request_timeout_ms)
    }

    /// The lock store: the Redis nodes, their connections and timeouts,
    /// Redlock's parameters, the fences and the key prefix.
    fn check_store(&self) -> Result<(), String> {
        at_least_one("redis_timeout_ms", self.redis_timeout_ms)?;
        at_least_one("pool_size", self.pool_size)?;
        if self.redis_url.is_empty() {
            return Err("redis_url needs at least one URL".into());
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = self
            .redis_url
            .iter()
            .find(|u| !seen.insert(node_address(u.expose())))
        {
            return Err(format!(
                "redis_url lists {twice} twice; Redlock masters must be independent"
            ));
        }
        at_least_one("node_timeout_ms", self.node_timeout_ms)?;
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err("drift_factor must be from 0 to below 0.5".into());
        }
        if !(1000..=Ttl::CEILING_MS).contains(&self.fence_retention_ms) {
            return Err(format!(
                "fence_retention_ms (--fence-retention-ms) must be from 1000 (1 s) to {} (365 days)",
                Ttl::CEILING_MS
            ));
        }
        if self
            .redlock_restart_delay_ms
            .is_some_and(|ms| ms > Ttl::CEILING_MS)
        {
            return Err(format!(
                "redlock_restart_delay_ms (--redlock-restart-delay-ms) must be at most {} (365 days)",
                Ttl::CEILING_MS
            ));
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err("key_prefix must not contain braces: they mark the hash tag".into());
        }
        Ok(())
    }

    /// The metrics listener, apart from the main one.
    fn check_metrics(&self) -> Result<(), String> {
        if self
            .metrics_listen
            .is_some_and(|m| m == self.listen && m.port() != 0)
        {
            return Err("metrics_listen must differ from listen".into());
        }
        Ok(())
    }

    /// API keys, or their absence: only on loopback unless insecure.
    fn check_auth(&self) -> Result<(), String> {
        if self.auth_keys_file.is_some() && self.insecure_no_auth {
            return Err(
                "insecure_no_auth and auth_keys_file contradict each other; give one".into(),
            );
        }
        if self.auth_keys_file.is_none()
            && !self.insecure_no_auth
            && !self.listen.ip().is_loopback()
        {
            return Err(format!(
                "refusing to listen on {} without API keys: anyone who can reach it could \
                 take and release any lock. Give --auth-keys-file (see `lockd keygen`), \
                 listen on a loopback address, or, for development only, --insecure-no-auth",
                self.listen
            ));
        }
        Ok(())
    }

    /// The main listener's transport: TLS files, limits on request heads.
    fn check_listen(&self) -> Result<(), String> {
        match (&self.tls_cert, &self.tls_key) {
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
            _ => {}
        }
        at_least_one("header_read_timeout_ms", self.header_read_timeout_ms)?;
        if self.max_header_bytes < MIN_HEADER_BYTES {
            return Err(format!(
                "max_header_bytes must be at least {MIN_HEADER_BYTES} (hyper's smallest read buffer)"
            ));
        }
        Ok(())
    }
}

/// `Err("KEY must be at least 1")` for a zero `value`.
fn at_least_one<N: Default + PartialEq>(key: &str, value: N) -> Result<(), String> {
    if value == N::default() {
        return Err(format!("{key} must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(settings.max_ttl_ms, 5000);
        assert_eq!(settings.default_ttl_ms, 4000);
        assert_eq!(settings.pool_size, 7);
        assert_eq!(settings.key_prefix, "lockd:");
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
        let as_json = |s: &Settings| serde_json::to_value(s).expect("serializes");
        let defaults = as_json(&Settings::default());
        assert_eq!(as_json(&from_file), defaults);
        let text = std::fs::read_to_string(path).expect("read example");
        for (key, default) in defaults.as_object().expect("an object") {
            // A setting with no default is shown commented out.
            let line = if default.is_null() {
                format!("\n# {key} = ")
            } else {
                format!("\n{key} = ")
            };
            assert!(text.contains(&line), "{key} is not documented");
        }
    }

    /// The settings table of docs/configuration.md: one row per key of
    /// `Settings`, with its flag, its environment variable and its default
    /// (`none` for an unset one, or the setting it falls back to; `off` and
    /// `on` for a switch; otherwise the value in backticks).
    #[test]
    fn the_configuration_doc_lists_every_setting_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let text = std::fs::read_to_string(path).expect("read docs/configuration.md");
        let defaults = serde_json::to_value(Settings::default()).expect("serializes");
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
            settings.tls_cert.as_deref(),
            Some(std::path::Path::new("/etc/lockd/cert.pem"))
        );
        assert_eq!(
            settings.tls_key.as_deref(),
            Some(std::path::Path::new("/etc/lockd/key.pem"))
        );
        assert_eq!(settings.max_header_bytes, 32768);
        assert_eq!(settings.header_read_timeout_ms, 750);
    }

    #[test]
    fn debug_hides_the_redis_password() {
        let settings = Settings {
            redis_url: vec!["redis://:hunter2@127.0.0.1:6379".into()],
            ..Settings::default()
        };
        assert!(!format!("{settings:?}").contains("hunter2"));
        let url = &settings.redis_url[0];
        assert!(!url.to_string().contains("hunter2"), "{url}");
        assert_eq!(url.expose(), "redis://:hunter2@127.0.0.1:6379");
    }
}
