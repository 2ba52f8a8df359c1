//! The single-instance Redis backend.
//!
//! Data model (documented in the README so other clients can interoperate),
//! for lock name `N` and key prefix `P` (default `lockd:`):
//! - `P{N}`: the lock. Its value is exactly the holder's token and its TTL is
//!   the lease.
//! - `P{N}:fence`: the fencing counter, incremented by every grant. It has no
//!   TTL, so fences never go backwards while Redis keeps its data.
//! - `P{N}:meta`: a hash with `fence`, `owner` and `granted_at_ms`, written
//!   with the lock, with the same TTL, and deleted with it.
//! - The channel `P{N}:released` gets an empty message at every release
//!   and every extend (which may shorten the lease).
//!   Each lockd instance listens with one `PSUBSCRIBE P{*}:released`
//!   connection and wakes its first waiter for that lock.
//!
//! The braces are a Redis Cluster hash tag: all three keys of a lock live in
//! one slot, so each script touches a single node.
//!
//! Every operation is one Lua script (see `scripts/`), run by SHA through
//! [`redis::Script`], which loads the script again after `NOSCRIPT` (Redis
//! restarted, or `SCRIPT FLUSH`). A single Redis loses locks that were not
//! yet replicated when it fails over; use Redlock for that.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool::Runtime;
use redis::{AsyncConnectionConfig, FromRedisValue, Script, ScriptInvocation};

use super::pool::{Connection, Connector, Pool, PoolError};
use futures_util::StreamExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    AcquireRequest, Acquired, Lease, LockBackend, LockError, LockInfo, LockName, ReleaseListener,
    Released, Token, Ttl, unix_millis,
};

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/extend.lua")));
static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/raise_fence.lua")));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));

/// How to reach one Redis server.
#[derive(Clone)]
pub struct RedisConfig {
    /// A `redis://` or `rediss://` URL. It may carry a password: never log it
    /// (see [`redact_url`]).
    pub url: String,
    /// The prefix of every key lockd writes, such as `lockd:`.
    pub key_prefix: String,
    /// The longest time one operation may take, connecting included. Past it
    /// the operation fails with [`LockError::Unavailable`].
    pub timeout: Duration,
    /// The most pooled connections.
    pub pool_size: usize,
}

/// The Redis keys of one lock.
struct Keys {
    lock: String,
    fence: String,
    meta: String,
    released: String,
}

impl Keys {
    fn new(prefix: &str, name: &LockName) -> Self {
        let lock = format!("{prefix}{{{name}}}");
        Self {
            fence: format!("{lock}:fence"),
            meta: format!("{lock}:meta"),
            released: format!("{lock}:released"),
            lock,
        }
    }
}

/// Locks held in one Redis server, through a deadpool connection pool.
pub struct RedisBackend {
    pool: Pool,
    /// For the release-event connection, which is not pooled.
    client: redis::Client,
    prefix: String,
    timeout: Duration,
}

impl RedisBackend {
    /// Builds the backend. No connection is opened until the first
    /// operation, so lockd starts while Redis is down and recovers when it
    /// comes back.
    ///
    /// # Errors
    /// When the URL cannot be parsed or the pool cannot be built.
    pub fn new(config: &RedisConfig) -> Result<Self, LockError> {
        let connection = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout));
        let bad_url = |e: redis::RedisError| {
            LockError::Backend(format!(
                "cannot use Redis URL {}: {e}",
                redact_url(&config.url)
            ))
        };
        let client = redis::Client::open(config.url.as_str()).map_err(bad_url)?;
        let pool = Pool::builder(Connector::new(client.clone(), connection))
            .max_size(config.pool_size)
            .wait_timeout(Some(config.timeout))
            .create_timeout(Some(config.timeout))
            .recycle_timeout(Some(config.timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| LockError::Backend(format!("cannot build the Redis pool: {e}")))?;
        Ok(Self {
            pool,
            client,
            prefix: config.key_prefix.clone(),
            timeout: config.timeout,
        })
    }

    /// The pool, for gauges read at scrape time.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs a script within the operation timeout. A connection that broke
    /// (Redis restarted) is thrown away and the script is sent once more on a
    /// fresh one; every script here is safe to repeat.
    async fn run<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> Result<T, LockError> {
        let attempt = async {
            let mut retried = false;
            loop {
                let mut conn = self.pool.get().await.map_err(pool_error)?;
                match call.invoke_async(&mut *conn).await {
                    Ok(value) => return Ok(value),
                    Err(e) if !retried && (e.is_io_error() || e.is_connection_dropped()) => {
                        // Redis went away: the idle connections are as dead
                        // as this one. Throw them all out, so that the retry
                        // connects afresh.
                        drop(Connection::take(conn));
                        self.pool.retain(|_, _| false);
                        retried = true;
                    }
                    Err(e) => return Err(redis_error(&e)),
                }
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| {
                LockError::Unavailable(format!("no answer from Redis in {:?}", self.timeout))
            })?
    }
}

/// Sorts a Redis error: could not reach or hear from Redis (retry may cure
/// it), or Redis refused (it will not).
fn redis_error(e: &redis::RedisError) -> LockError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.code(),
            Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN")
        );
    if transient {
        LockError::Unavailable(e.to_string())
    } else {
        LockError::Backend(e.to_string())
    }
}

fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Backend(e) => redis_error(&e),
        other => LockError::Unavailable(other.to_string()),
    }
}

/// The lease from a grant whose script was sent at `sent` (wall clock
/// `sent_wall`): the lease began after that, so counting from it errs early.
fn lease(fence: i64, ttl: Ttl, sent_wall: SystemTime) -> Lease {
    Lease {
        fence: u64::try_from(fence).ok(),
        ttl,
        expires_at: sent_wall + ttl.as_duration(),
    }
}

fn positive_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1))
}

#[async_trait]
impl LockBackend for RedisBackend {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        let keys = Keys::new(&self.prefix, &req.name);
        let sent_wall = SystemTime::now();
        let mut call = ACQUIRE.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.meta)
            .arg(req.token.expose())
            .arg(req.ttl.as_millis())
            .arg(req.owner.as_ref().map_or("", |o| o.as_str()))
            .arg(unix_millis(sent_wall));
        let (status, value): (i64, i64) = self.run(&call).await?;
        match status {
            1 => Ok(Acquired::Granted(lease(value, req.ttl, sent_wall))),
            2 => Ok(Acquired::Renewed(lease(value, req.ttl, sent_wall))),
            // PTTL is -1 only for a key a foreign client set without a TTL:
            // there is no expiry to wait for, so suggest one second.
            _ if value < 0 => Err(LockError::Held {
                retry_after: Duration::from_secs(1),
            }),
            _ => Err(LockError::Held {
                retry_after: positive_ms(value),
            }),
        }
    }

    async fn extend(&self, name: &LockName, token: &Token, ttl: Ttl) -> Result<Lease, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let sent_wall = SystemTime::now();
        let mut call = EXTEND.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .arg(token.expose())
            .arg(ttl.as_millis())
            .arg(&keys.released);
        let (status, fence): (i64, i64) = self.run(&call).await?;
        match status {
            1 => Ok(lease(fence, ttl, sent_wall)),
            0 => Err(LockError::NotHeld),
            _ => Err(LockError::NotOwner),
        }
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = RELEASE.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .arg(token.expose())
            .arg(&keys.released);
        let (verdict, granted_at): (i64, String) = self.run(&call).await?;
        match verdict {
            1 => Ok(Released {
                granted_at: parse_unix_millis(&granted_at),
            }),
            0 => Err(LockError::NotHeld),
            _ => Err(LockError::NotOwner),
        }
    }

    async fn holder(&self, name: &LockName) -> Result<Option<(Token, LockInfo)>, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let read_at = Instant::now();
        let mut call = INSPECT.prepare_invoke();
        call.key(&keys.lock).key(&keys.meta);
        let (pttl, token, fence, owner, granted_at): (i64, String, String, String, String) =
            self.run(&call).await?;
        if pttl == -2 {
            return Ok(None);
        }
        // A foreign client may have stored any value: kept as it is, so that
        // Redlock can still find the holder a majority of nodes agrees on.
        let token = Token::from_stored(token);
        // The PTTL was read somewhere during the round trip; count the time
        // since the request was sent against it, so the answer errs early.
        let remaining = u64::try_from(pttl)
            .ok()
            .map(|ms| Duration::from_millis(ms).saturating_sub(read_at.elapsed()));
        Ok(Some((
            token,
            LockInfo {
                fence: fence.parse().ok(),
                remaining,
                owner: Some(owner).filter(|o| !o.is_empty()),
                granted_at: parse_unix_millis(&granted_at),
            },
        )))
    }

    async fn raise_fence(
        &self,
        name: &LockName,
        token: &Token,
        fence: u64,
    ) -> Result<bool, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = RAISE_FENCE.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.meta)
            .arg(token.expose())
            .arg(fence);
        Ok(self.run::<i64>(&call).await? == 1)
    }

    async fn ping(&self) -> Result<(), LockError> {
        let attempt = async {
            let mut conn = self.pool.get().await.map_err(pool_error)?;
            redis::cmd("PING")
                .query_async::<String>(&mut *conn)
                .await
                .map_err(|e| redis_error(&e))
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| LockError::Unavailable("PING timed out".into()))?
            .map(drop)
    }

    fn watch_releases(&self, listener: Arc<dyn ReleaseListener>, stop: CancellationToken) {
        let events = ReleaseEvents {
            client: self.client.clone(),
            pattern: format!("{}{{*}}:released", glob_escape(&self.prefix)),
            prefix: format!("{}{{", self.prefix),
            timeout: self.timeout,
            listener,
        };
        tokio::spawn(async move {
            tokio::select! {
                () = events.run() => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

/// The release-event subscriber: one connection per lockd instance.
struct ReleaseEvents {
    client: redis::Client,
    pattern: String,
    /// `P{`, stripped from a channel name to find the lock name.
    prefix: String,
    timeout: Duration,
    listener: Arc<dyn ReleaseListener>,
}

impl ReleaseEvents {
    /// Subscribes and dispatches events for ever, reconnecting with capped
    /// exponential backoff when the connection is lost. After every
    /// (re)subscription all waiters retry once, since releases may have been
    /// missed meanwhile.
    async fn run(self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.subscribe().await {
                Ok(mut stream) => {
                    backoff = Duration::from_millis(50);
                    self.listener.resync();
                    while let Some(msg) = stream.next().await {
                        if let Some(name) = self.lock_name(msg.get_channel_name()) {
                            self.listener.released(name);
                        }
                    }
                    tracing::warn!(
                        node = %self.client.get_connection_info().addr(),
                        "release-event connection to Redis lost; waiters fall back to lease expiry until it is back"
                    );
                }
                Err(e) => tracing::debug!(error = %e, "cannot subscribe to release events"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn subscribe(&self) -> Result<redis::aio::PubSubStream, String> {
        let connect = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.psubscribe(&self.pattern).await?;
            Ok::<_, redis::RedisError>(pubsub.into_on_message())
        };
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// `P{name}:released` → `name`.
    fn lock_name<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel
            .strip_prefix(&self.prefix)?
            .strip_suffix("}:released")
    }
}

/// Escapes the glob characters of Redis patterns (`*?[]\`).
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A Redis URL with any password replaced by `***`, for logs and errors.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                // Cannot fail: a URL with a password has a host.
                let _ = url.set_password(Some("***"));
            }
            // `?password=...` (or `pass`, `pwd`, `secret`, `token`).
            if url.query().is_some() {
                let pairs: Vec<(String, String)> = url
                    .query_pairs()
                    .map(|(k, v)| {
                        let key = k.to_ascii_lowercase();
                        let secret = ["pass", "pwd", "secret", "token", "auth"]
                            .iter()
                            .any(|word| key.contains(word));
                        let value = if secret { "***".into() } else { v.into_owned() };
                        (k.into_owned(), value)
                    })
                    .collect();
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
            url.to_string()
        }
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

/// `text` with every `redis://` or `rediss://` URL in it passed through
/// [`redact_url`]: for messages that may quote a setting, such as a TOML
/// syntax error showing the line at fault.
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = ["redis://", "rediss://"]
        .iter()
        .filter_map(|scheme| rest.find(scheme))
        .min()
    {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ']' | '`'))
            .unwrap_or(tail.len());
        out.push_str(&redact_url(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// A wall-clock time stored as Unix milliseconds; `None` when empty or
/// not a number (a foreign client's key).
fn parse_unix_millis(stored: &str) -> Option<SystemTime> {
    stored
        .parse::<u64>()
        .ok()
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_use_the_name_as_a_hash_tag() {
        let name = LockName::parse("orders:1").expect("valid");
        let keys = Keys::new("lockd:", &name);
        assert_eq!(keys.lock, "lockd:{orders:1}");
        assert_eq!(keys.fence, "lockd:{orders:1}:fence");
        assert_eq!(keys.meta, "lockd:{orders:1}:meta");
        assert_eq!(keys.released, "lockd:{orders:1}:released");
    }

    #[test]
    fn glob_characters_in_the_prefix_are_escaped() {
        assert_eq!(glob_escape("lockd:"), "lockd:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn redacted_urls_hide_the_password() {
        let shown = redact_url("redis://user:s3cret@127.0.0.1:6379/0");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("127.0.0.1:6379"));
        assert_eq!(redact_url("not a url"), "<unparsable URL>");
        let query = redact_url("redis://127.0.0.1:6379/0?password=s3cret&protocol=resp3");
        assert!(!query.contains("s3cret"), "{query}");
        assert!(query.contains("protocol=resp3"), "{query}");
    }

    #[test]
    fn urls_quoted_in_a_message_are_redacted() {
        let message =
            "TOML parse error at line 1\n  |\n1 | redis_url = \"redis://:hunter2@h:6379\n  |";
        let shown = redact_urls_in(message);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("TOML parse error"), "{shown}");
        assert_eq!(redact_urls_in("no url here"), "no url here");
    }
}
