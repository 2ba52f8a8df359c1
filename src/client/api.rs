//! [`LockClient`]: the lockd HTTP API as a client calls it, with reqwest
//! (rustls for `https://` servers). Tokens travel in the `Lock-Token`
//! header, never in a URL.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{Map, json};

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of one lockd server.
#[derive(Clone)]
pub struct LockClient {
    http: reqwest::Client,
    base: url::Url,
    /// The server URL as the user gave it, for messages (with any password
    /// in it hidden).
    server: String,
}

/// An open Server-Sent Events stream (see [`LockClient::open_events`]),
/// taken once by its reader. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct EventStream(pub Arc<tokio::sync::Mutex<Option<reqwest::Response>>>);

/// A successful answer: what it says, with its status and body as sent
/// (the shell commands print the body; `lockd-bench` counts the status).
#[derive(Debug, Clone)]
pub struct Reply<T> {
    /// What the answer says.
    pub value: T,
    /// The HTTP status (2xx).
    pub status: StatusCode,
    /// The body, as sent (JSON, or empty for 204).
    pub body: String,
}

/// A granted lease, from the body of a 201 or 200 acquire. `Debug` hides
/// the token.
#[derive(Clone, Deserialize)]
pub struct Lease {
    /// The token that proves the grant.
    pub token: String,
    /// The fencing token; absent only for locks written by foreign clients.
    pub fence: Option<u64>,
    /// The lease length granted, in milliseconds.
    pub ttl_ms: u64,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("token", &"<hidden>")
            .field("fence", &self.fence)
            .field("ttl_ms", &self.ttl_ms)
            .finish()
    }
}

/// What a run's start answered (`POST /runs/{key}`): an attempt to run the
/// job under (201, or 200 `running` for a renewal), or the done run's
/// result (200 `done`).
#[derive(Debug, Clone)]
pub enum RunStart {
    /// An attempt: run the job, then complete or abandon it.
    Attempt(Lease),
    /// The job ran already.
    Done {
        /// When it completed (RFC 3339).
        completed_at: String,
        /// The completing attempt's number.
        attempt: u64,
        /// What it stored.
        result: serde_json::Value,
    },
}

/// The body of a run's start, read by its `state`.
#[derive(Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
enum RunStartBody {
    Running(Lease),
    Done {
        completed_at: String,
        attempt: u64,
        result: serde_json::Value,
    },
}

/// A renewed lease, from the body of a 200 extend. Fields the server did
/// not send are `None`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Extended {
    /// The holder's fencing token (unchanged by an extend).
    #[serde(default)]
    pub fence: Option<u64>,
    /// What is left of the new lease, in milliseconds.
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// What anyone may see of a held lock (never its token), from the body of
/// a 200 status. Fields the server did not send are `None`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LockStatus {
    /// The holder's fencing token.
    #[serde(default)]
    pub fence: Option<u64>,
    /// The holder's remaining lease in milliseconds.
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// The holder's label, if it gave one.
    #[serde(default)]
    pub owner: Option<String>,
}

/// A refusal as the server sent it: its status, its body (a problem
/// document, as a rule) and what that document says.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The HTTP status (4xx or 5xx).
    pub status: StatusCode,
    /// The body, as sent.
    pub body: String,
    /// What the problem document says (empty when the body is not one).
    pub problem: ProblemInfo,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.problem.detail)
    }
}

/// Why a call did not give what it asked for. The problem document's type
/// (its slug) decides the variant; an answer without a known slug (from a
/// proxy, say) falls back on its status.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// 409 `lock-held`: another holder has the lock (or `semaphore-full`:
    /// every permit is held; `run-in-progress`: another attempt runs the
    /// job).
    #[error("{answer}")]
    Held {
        /// When the lock frees at the latest, if the server said.
        retry_after: Option<Duration>,
        /// The answer.
        answer: Refusal,
    },
    /// 404 `lock-not-held`: the lock is free, or the lease is gone (or
    /// `permit-not-held`, `semaphore-free` for a semaphore, `run-not-found`
    /// for a run).
    #[error("{answer}")]
    NotHeld {
        /// The answer.
        answer: Refusal,
    },
    /// 409 `not-lock-owner`: the token does not hold the lock (or
    /// `not-run-owner`: the run's live attempt).
    #[error("{answer}")]
    NotOwner {
        /// The answer.
        answer: Refusal,
    },
    /// 429 `rate-limited`: the API key is over its rate.
    #[error("{answer}")]
    RateLimited {
        /// When to try again, if the server said.
        retry_after: Option<Duration>,
        /// The answer.
        answer: Refusal,
    },
    /// 503 (`backend-unavailable`, `quorum-unavailable`,
    /// `replication-lagging`, `too-many-waiters`, `shutting-down`, `timeout`,
    /// `overloaded`): try again later.
    #[error("{answer}")]
    Unavailable {
        /// When to try again, if the server said.
        retry_after: Option<Duration>,
        /// The answer.
        answer: Refusal,
    },
    /// 500 (`backend-error`, `internal`) or another 5xx: the server failed.
    #[error("{answer}")]
    ServerError {
        /// The answer.
        answer: Refusal,
    },
    /// Any other 4xx (400 `invalid-request`, 401 `unauthorized`, 403
    /// `forbidden`, 404 `route-not-found`, ...): the request itself is
    /// refused, and asking again will not help.
    #[error("{answer}")]
    Refused {
        /// The answer.
        answer: Refusal,
    },
    /// A 2xx whose body is not what the call expects.
    #[error("unexpected answer from the server: {why}")]
    Unexpected {
        /// The HTTP status (2xx).
        status: StatusCode,
        /// The body, as sent.
        body: String,
        /// Why it cannot be read.
        why: String,
    },
    /// No answer: the server could not be reached, or the TLS handshake
    /// failed (the message says which, and what to do).
    #[error(transparent)]
    Unreachable(#[from] CallError),
}

impl ClientError {
    /// The error for the refusal `answer`, by its problem type (then its
    /// status, when the type is not one of lockd's).
    pub fn from_refusal(answer: Refusal) -> Self {
        let retry_after = answer.problem.retry_after_ms.map(Duration::from_millis);
        match answer.problem.slug() {
            "lock-held" | "semaphore-full" | "run-in-progress" => Self::Held {
                retry_after,
                answer,
            },
            "lock-not-held" | "permit-not-held" | "semaphore-free" | "run-not-found" => {
                Self::NotHeld { answer }
            }
            "not-lock-owner" | "not-run-owner" => Self::NotOwner { answer },
            "rate-limited" => Self::RateLimited {
                retry_after,
                answer,
            },
            "backend-unavailable"
            | "quorum-unavailable"
            | "replication-lagging"
            | "too-many-waiters"
            | "shutting-down"
            | "timeout"
            | "overloaded" => Self::Unavailable {
                retry_after,
                answer,
            },
            "backend-error" | "internal" => Self::ServerError { answer },
            "invalid-request"
            | "unauthorized"
            | "forbidden"
            | "route-not-found"
            | "method-not-allowed"
            | "payload-too-large"
            | "unsupported-media-type"
            | "limit-mismatch"
            | "mode-mismatch"
            | "fingerprint-mismatch"
            | "not-implemented" => Self::Refused { answer },
            _ => match answer.status {
                StatusCode::CONFLICT => Self::Held {
                    retry_after,
                    answer,
                },
                StatusCode::TOO_MANY_REQUESTS => Self::RateLimited {
                    retry_after,
                    answer,
                },
                StatusCode::SERVICE_UNAVAILABLE => Self::Unavailable {
                    retry_after,
                    answer,
                },
                s if s.is_server_error() => Self::ServerError { answer },
                _ => Self::Refused { answer },
            },
        }
    }

    /// The server's refusal, when it answered with one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Self::Held { answer, .. }
            | Self::NotHeld { answer }
            | Self::NotOwner { answer }
            | Self::RateLimited { answer, .. }
            | Self::Unavailable { answer, .. }
            | Self::ServerError { answer }
            | Self::Refused { answer } => Some(answer),
            Self::Unexpected { .. } | Self::Unreachable(_) => None,
        }
    }

    /// When to try again, as the server said (`Held`, `RateLimited`,
    /// `Unavailable`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Held { retry_after, .. }
            | Self::RateLimited { retry_after, .. }
            | Self::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status of the answer; `None` when no answer came.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Unexpected { status, .. } => Some(*status),
            Self::Unreachable(_) => None,
            other => other.refusal().map(|a| a.status),
        }
    }
}

/// What a problem document (RFC 9457) says, as far as a client needs it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProblemInfo {
    /// `urn:lockd:problem:<slug>`.
    #[serde(default, rename = "type")]
    pub problem_type: String,
    /// What went wrong.
    #[serde(default)]
    pub detail: String,
    /// For a held lock and the 503 kinds: when to try again, in ms.
    pub retry_after_ms: Option<u64>,
}

impl ProblemInfo {
    /// The slug of the problem type (`lock-not-held`), or "".
    pub fn slug(&self) -> &str {
        self.problem_type
            .strip_prefix("urn:lockd:problem:")
            .unwrap_or("")
    }
}

/// Why a call got no answer. The message names the server and says what
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server could not be reached, or did not answer in time.
    #[error("no answer from {server}: {why}")]
    Unreachable {
        /// The server URL.
        server: String,
        /// What happened ("Connection refused (os error 111)", "timed out").
        why: String,
    },
    /// The server answered, but the TLS handshake failed: most often its
    /// certificate could not be verified.
    #[error("{server} answered, but {why}")]
    Tls {
        /// The server URL.
        server: String,
        /// What failed, and what to do about it.
        why: String,
    },
}

/// The server URL, or the CA certificates to trust, are not usable.
#[derive(Debug, thiserror::Error)]
pub enum BadServer {
    /// No server URL at all (an empty `--server` or `LOCKD_SERVER`).
    #[error(
        "no server given: --server URL, or LOCKD_SERVER with one URL or several, comma-separated"
    )]
    NoServer,
    /// The URL cannot be parsed, or is not http(s).
    #[error("invalid server URL {url:?}: {why}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The API key cannot be sent in an HTTP header.
    #[error(
        "invalid API key (LOCKD_API_KEY or --api-key): it has characters an HTTP header cannot carry"
    )]
    ApiKey,
    /// The `--ca-cert` file cannot be read or holds no certificate.
    #[error("cannot use --ca-cert {}: {why}", path.display())]
    CaCert {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// What a call names: a lock (`/locks/{name}`), a semaphore
/// (`/semaphores/{name}`, whose acquire takes one permit), or a run
/// (`/runs/{key}`, whose extend and release are its attempt's extend and
/// abandon). A `&str` is a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// The lock of this name.
    Lock(&'a str),
    /// The semaphore of this name.
    Semaphore(&'a str),
    /// The run of this key.
    Run(&'a str),
}

impl<'a> Target<'a> {
    /// `name` as a semaphore when `semaphore`, else as a lock.
    pub fn new(name: &'a str, semaphore: bool) -> Self {
        if semaphore {
            Self::Semaphore(name)
        } else {
            Self::Lock(name)
        }
    }

    /// The name.
    pub fn name(self) -> &'a str {
        match self {
            Self::Lock(name) | Self::Semaphore(name) | Self::Run(name) => name,
        }
    }

    /// "lock", "semaphore" or "run", for messages.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Lock(_) => "lock",
            Self::Semaphore(_) => "semaphore",
            Self::Run(_) => "run",
        }
    }
}

impl<'a> From<&'a str> for Target<'a> {
    fn from(name: &'a str) -> Self {
        Self::Lock(name)
    }
}

impl<'a> From<&'a String> for Target<'a> {
    fn from(name: &'a String) -> Self {
        Self::Lock(name)
    }
}

/// What an acquire asks for.
#[derive(Debug, Clone, Default)]
pub struct AcquireParams<'a> {
    /// The token to hold the lock under; the server generates one when
    /// `None`.
    pub token: Option<&'a str>,
    /// The lease length in ms; the server's default when `None`.
    pub ttl_ms: Option<u64>,
    /// How long the server may wait for a held lock, in ms.
    pub wait_ms: u64,
    /// A label for the holder.
    pub owner: Option<&'a str>,
    /// Holder metadata, a JSON object.
    pub meta: Option<&'a Map<String, serde_json::Value>>,
    /// For a semaphore: its limit, the most holders at once.
    pub limit: Option<u32>,
    /// For a run: the fingerprint of the job's input.
    pub fingerprint: Option<&'a str>,
    /// For a lock: take a shared lease (`mode: "shared"`, many holders at
    /// once) rather than an exclusive one.
    pub shared: bool,
}

impl LockClient {
    /// A client of the server at `server` (`http://` or `https://`),
    /// sending `api_key` (a secret) as `Authorization: Bearer` when given.
    /// An `https://` server's certificate is checked against the system's
    /// CA certificates and those in the PEM file `ca_cert`, if given.
    ///
    /// # Errors
    /// [`BadServer`] when the URL cannot be parsed or has another scheme,
    /// the key cannot be sent in a header, or `ca_cert` cannot be read or
    /// holds no certificate.
    pub fn new(
        server: &str,
        api_key: Option<&str>,
        ca_cert: Option<&Path>,
    ) -> Result<Self, BadServer> {
        let bad = |why: &str| BadServer::Url {
            url: server.to_owned(),
            why: why.to_owned(),
        };
        let base = match url::Url::parse(server) {
            // `127.0.0.1:8080` does not parse; `localhost:8080` parses with
            // the scheme `localhost`. Either way the scheme is missing.
            Ok(url) if server.contains("://") || matches!(url.scheme(), "http" | "https") => url,
            Ok(_) | Err(url::ParseError::RelativeUrlWithoutBase) => {
                return Err(bad(&format!(
                    "it needs http:// or https:// in front, as in http://{server}"
                )));
            }
            Err(e) => return Err(bad(&e.to_string())),
        };
        if !matches!(base.scheme(), "http" | "https") {
            return Err(bad(&format!(
                "lockd speaks http:// or https://, not {}://",
                base.scheme()
            )));
        }
        if base.cannot_be_a_base() || base.host_str().is_none_or(str::is_empty) {
            return Err(bad("use http://host:port or https://host:port"));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        // Surrounding white space (a trailing newline from a file) is not
        // part of a key; an empty key is no key.
        if let Some(key) = api_key.map(str::trim).filter(|k| !k.is_empty()) {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| BadServer::ApiKey)?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("lockd/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = ca_cert {
            for cert in ca_certificates(path)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| bad(&e.to_string()))?;
        Ok(Self {
            http,
            server: shown(server, &base),
            base,
        })
    }

    /// The server URL as the user gave it, for messages: a password in it
    /// (`http://user:secret@host`) shows as `***`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The URL of `target`: the server's path, then `locks/<name>` (or
    /// `semaphores/<name>`) with the name percent-encoded as one path
    /// segment.
    fn lock_url(&self, target: Target<'_>) -> url::Url {
        let mut url = self.base.clone();
        url.set_query(None);
        let collection = match target {
            Target::Lock(_) => "locks",
            Target::Semaphore(_) => "semaphores",
            Target::Run(_) => "runs",
        };
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push(collection).push(target.name());
        }
        url
    }

    /// `POST /locks/{name}`: the lease (201 granted, 200 when the token
    /// already held it). `timeout` bounds the whole call; give it more than
    /// `wait_ms`.
    ///
    /// # Errors
    /// [`ClientError`]: `Held` when another holder kept the lock, the other
    /// refusals, `Unexpected` for a 2xx without a lease, `Unreachable`
    /// when no answer came.
    pub async fn acquire<'a>(
        &self,
        target: impl Into<Target<'a>>,
        params: &AcquireParams<'_>,
        timeout: Duration,
    ) -> Result<Reply<Lease>, ClientError> {
        self.acquire_as(target.into(), params, timeout).await
    }

    /// [`Self::acquire`], its 2xx body read as `T`.
    async fn acquire_as<T: serde::de::DeserializeOwned>(
        &self,
        target: Target<'_>,
        params: &AcquireParams<'_>,
        timeout: Duration,
    ) -> Result<Reply<T>, ClientError> {
        let mut body = Map::new();
        if let Some(limit) = params.limit {
            body.insert("limit".into(), json!(limit));
        }
        if let Some(ttl) = params.ttl_ms {
            body.insert("ttl_ms".into(), json!(ttl));
        }
        if params.wait_ms > 0 {
            body.insert("wait_ms".into(), json!(params.wait_ms));
        }
        if let Some(owner) = params.owner {
            body.insert("owner".into(), json!(owner));
        }
        if let Some(meta) = params.meta {
            body.insert("meta".into(), serde_json::Value::Object(meta.clone()));
        }
        if let Some(fingerprint) = params.fingerprint {
            body.insert("fingerprint".into(), json!(fingerprint));
        }
        if params.shared {
            body.insert("mode".into(), json!("shared"));
        }
        let mut request = self.http.post(self.lock_url(target)).json(&body);
        if let Some(token) = params.token {
            request = request.header("Lock-Token", token);
        }
        let (status, body) = self.send(request, timeout).await?;
        match serde_json::from_str(&body) {
            Ok(value) => Ok(Reply {
                value,
                status,
                body,
            }),
            Err(e) => Err(ClientError::Unexpected {
                status,
                body,
                why: e.to_string(),
            }),
        }
    }

    /// `POST /runs/{key}`: an attempt of the run, or its result when it is
    /// done. `timeout` bounds the whole call; give it more than `wait_ms`.
    ///
    /// # Errors
    /// As for [`Self::acquire`]: `Held` while another attempt runs the job
    /// (after `wait_ms`).
    pub async fn start_run(
        &self,
        key: &str,
        params: &AcquireParams<'_>,
        timeout: Duration,
    ) -> Result<Reply<RunStart>, ClientError> {
        let reply = self
            .acquire_as::<RunStartBody>(Target::Run(key), params, timeout)
            .await?;
        let value = match reply.value {
            RunStartBody::Running(lease) => RunStart::Attempt(lease),
            RunStartBody::Done {
                completed_at,
                attempt,
                result,
            } => RunStart::Done {
                completed_at,
                attempt,
                result,
            },
        };
        Ok(Reply {
            value,
            status: reply.status,
            body: reply.body,
        })
    }

    /// `PUT /runs/{key}/result`: completes the run whose attempt `token`
    /// holds with `result`.
    ///
    /// # Errors
    /// [`ClientError`]: `NotOwner` when the token does not hold the live
    /// attempt, `NotHeld` when the run is unknown, the other refusals,
    /// `Unreachable` when no answer came within `timeout`.
    pub async fn complete_run(
        &self,
        key: &str,
        token: &str,
        result: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Reply<()>, ClientError> {
        self.complete_run_keeping(key, token, result, None, timeout)
            .await
    }

    /// [`Self::complete_run`], keeping the result `retention_ms` (the
    /// server's `--run-retention-ms` when `None`) rather than the longest
    /// the server allows.
    ///
    /// # Errors
    /// As for [`Self::complete_run`]; 400 when `retention_ms` is 0 or over
    /// the server's `--run-retention-ms`.
    pub async fn complete_run_keeping(
        &self,
        key: &str,
        token: &str,
        result: &serde_json::Value,
        retention_ms: Option<u64>,
        timeout: Duration,
    ) -> Result<Reply<()>, ClientError> {
        let mut url = self.lock_url(Target::Run(key));
        if let Ok(mut path) = url.path_segments_mut() {
            path.push("result");
        }
        let body = match retention_ms {
            Some(ms) => json!({ "result": result, "retention_ms": ms }),
            None => json!({ "result": result }),
        };
        let request = self.http.put(url).header("Lock-Token", token).json(&body);
        let (status, body) = self.send(request, timeout).await?;
        Ok(Reply {
            value: (),
            status,
            body,
        })
    }

    /// `PATCH /locks/{name}`: resets the lease to `ttl_ms` (the server's
    /// default when `None`).
    ///
    /// # Errors
    /// [`ClientError`]: `NotHeld` when the lease is gone, `NotOwner` when
    /// another holder has the lock, the other refusals, `Unreachable` when
    /// no answer came within `timeout`.
    pub async fn extend<'a>(
        &self,
        target: impl Into<Target<'a>>,
        token: &str,
        ttl_ms: Option<u64>,
        timeout: Duration,
    ) -> Result<Reply<Extended>, ClientError> {
        let body = ttl_ms.map_or_else(|| json!({}), |ttl| json!({ "ttl_ms": ttl }));
        let request = self
            .http
            .patch(self.lock_url(target.into()))
            .header("Lock-Token", token)
            .json(&body);
        let (status, body) = self.send(request, timeout).await?;
        Ok(lenient(status, body))
    }

    /// `DELETE /locks/{name}`.
    ///
    /// # Errors
    /// [`ClientError`]: `NotHeld` when the lease is gone, `NotOwner` when
    /// another holder has the lock, the other refusals, `Unreachable` when
    /// no answer came within `timeout`.
    pub async fn release<'a>(
        &self,
        target: impl Into<Target<'a>>,
        token: &str,
        timeout: Duration,
    ) -> Result<Reply<()>, ClientError> {
        let request = self
            .http
            .delete(self.lock_url(target.into()))
            .header("Lock-Token", token);
        let (status, body) = self.send(request, timeout).await?;
        Ok(Reply {
            value: (),
            status,
            body,
        })
    }

    /// `GET /locks/{name}`: who holds the lock.
    ///
    /// # Errors
    /// [`ClientError`]: `NotHeld` when the lock is free, the other
    /// refusals, `Unreachable` when no answer came within `timeout`.
    pub async fn status<'a>(
        &self,
        target: impl Into<Target<'a>>,
        timeout: Duration,
    ) -> Result<Reply<LockStatus>, ClientError> {
        let (status, body) = self
            .send(self.http.get(self.lock_url(target.into())), timeout)
            .await?;
        Ok(lenient(status, body))
    }

    /// `DELETE /locks/{name}?force=true` (or a semaphore's, a run's, with
    /// `&fence=F` for one lease): an admin's break, whose answer says
    /// whose leases ended.
    ///
    /// # Errors
    /// [`ClientError`]: `NotHeld` when no live lease matched, `Refused`
    /// for a key without `admin` (403), the other refusals, `Unreachable`
    /// when no answer came.
    pub async fn break_leases(
        &self,
        target: Target<'_>,
        fence: Option<u64>,
        timeout: Duration,
    ) -> Result<Reply<serde_json::Value>, ClientError> {
        let mut url = self.lock_url(target);
        url.query_pairs_mut().append_pair("force", "true");
        if let Some(fence) = fence {
            url.query_pairs_mut()
                .append_pair("fence", &fence.to_string());
        }
        let (status, body) = self.send(self.http.delete(url), timeout).await?;
        Ok(lenient(status, body))
    }

    /// `GET /locks/{name}/history` (or a semaphore's, a run's): its last
    /// leases, newest first.
    ///
    /// # Errors
    /// [`ClientError`]: a refusal, or `Unreachable` when no answer came.
    pub async fn history(
        &self,
        target: Target<'_>,
        timeout: Duration,
    ) -> Result<Reply<serde_json::Value>, ClientError> {
        let mut url = self.lock_url(target);
        if let Ok(mut path) = url.path_segments_mut() {
            path.push("history");
        }
        let (status, body) = self.send(self.http.get(url), timeout).await?;
        Ok(lenient(status, body))
    }

    /// `GET /locks/{name}/events` (or a semaphore's): the open stream,
    /// once its status and headers came within `timeout` (the stream
    /// itself has no time limit).
    ///
    /// # Errors
    /// [`ClientError`]: a refusal (503 `too-many-watchers`, 501 in Redlock
    /// mode, ...), or `Unreachable` when no answer came within `timeout`.
    pub async fn open_events(
        &self,
        target: Target<'_>,
        timeout: Duration,
    ) -> Result<Reply<EventStream>, ClientError> {
        let mut url = self.lock_url(target);
        if let Ok(mut path) = url.path_segments_mut() {
            path.push("events");
        }
        let request = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        let failed = |e: reqwest::Error| call_error(&self.server, &e);
        let response = match tokio::time::timeout(timeout, request.send()).await {
            Ok(sent) => sent.map_err(failed)?,
            Err(_) => {
                return Err(ClientError::Unreachable(CallError::Unreachable {
                    server: self.server.clone(),
                    why: "timed out".to_owned(),
                }));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Reply {
                value: EventStream(Arc::new(tokio::sync::Mutex::new(Some(response)))),
                status,
                body: String::new(),
            });
        }
        let body = response.text().await.map_err(failed)?;
        let problem = serde_json::from_str(&body).unwrap_or_default();
        Err(ClientError::from_refusal(Refusal {
            status,
            body,
            problem,
        }))
    }

    /// `GET /metrics`: the server's metrics, in the Prometheus text format.
    ///
    /// # Errors
    /// [`ClientError`]: a refusal, or `Unreachable` when no answer came
    /// within `timeout`.
    pub async fn metrics(&self, timeout: Duration) -> Result<String, ClientError> {
        let mut url = self.base.clone();
        url.set_query(None);
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push("metrics");
        }
        let (_, body) = self.send(self.http.get(url), timeout).await?;
        Ok(body)
    }
}

/// `given` (which parsed as `url`) as messages show it: as given, unless
/// it carries a password, which shows as `***`.
fn shown(given: &str, url: &url::Url) -> String {
    if url.password().is_none() {
        return given.to_owned();
    }
    let mut hidden = url.clone();
    // Cannot fail: a URL with a password has a host.
    let _ = hidden.set_password(Some("***"));
    hidden.to_string()
}

/// The certificates in the PEM file at `path` (at least one).
fn ca_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, BadServer> {
    let bad = |why: String| BadServer::CaCert {
        path: path.to_owned(),
        why,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(
            "no certificate in it (a PEM \"CERTIFICATE\" block)".into()
        ));
    }
    Ok(certs)
}

impl LockClient {
    /// Sends `request`, bounded by `timeout`, and reads the answer: its
    /// status and body when it is a 2xx, the refusal's error otherwise.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<(StatusCode, String), ClientError> {
        let failed = |e: reqwest::Error| call_error(&self.server, &e);
        let response = request.timeout(timeout).send().await.map_err(failed)?;
        let status = response.status();
        let body = response.text().await.map_err(failed)?;
        if status.is_success() {
            return Ok((status, body));
        }
        let problem = serde_json::from_str(&body).unwrap_or_default();
        Err(ClientError::from_refusal(Refusal {
            status,
            body,
            problem,
        }))
    }
}

/// A 2xx answer whose body is read as far as it goes: fields it lacks (or
/// a body that is not JSON) leave the value's defaults, as the status alone
/// says the call worked.
fn lenient<T: serde::de::DeserializeOwned + Default>(status: StatusCode, body: String) -> Reply<T> {
    Reply {
        value: serde_json::from_str(&body).unwrap_or_default(),
        status,
        body,
    }
}

/// What a failed call means for the user: a TLS failure (the server
/// answered, its certificate could not be verified) or no answer.
fn call_error(server: &str, e: &reqwest::Error) -> CallError {
    let mut innermost: &(dyn std::error::Error + 'static) = e;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = as_rustls(c) {
            return CallError::Tls {
                server: server.to_owned(),
                why: explain_tls(tls),
            };
        }
        innermost = c;
        cause = c.source();
    }
    // The innermost cause says what happened ("Connection refused");
    // reqwest's own message adds only the URL.
    let why = if e.is_timeout() {
        "timed out".to_owned()
    } else {
        innermost.to_string()
    };
    CallError::Unreachable {
        server: server.to_owned(),
        why,
    }
}

/// The rustls error in `e`: itself, or wrapped in `io::Error`s (whose
/// `source()` skips the error they wrap; the TLS connector wraps it twice).
fn as_rustls<'a>(mut e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    loop {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner = e.downcast_ref::<std::io::Error>()?.get_ref()?;
        e = inner;
    }
}

/// What to tell the user, in words, for a failed TLS handshake.
fn explain_tls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    const TRUST: &str = "if it is self-signed or from a private CA, \
        give that certificate (or the CA's) with --ca-cert PATH or LOCKD_CA_CERT";
    let not_verified = "its certificate could not be verified";
    match e {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer
            | C::BadSignature
            | C::UnsupportedSignatureAlgorithmContext { .. }
            | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                format!("{not_verified}: it is not signed by a CA this client trusts; {TRUST}")
            }
            C::Expired | C::ExpiredContext { .. } => {
                format!("{not_verified}: it has expired; the server needs a renewed one")
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                format!("{not_verified}: it is not valid yet (check the clocks of both hosts)")
            }
            C::NotValidForName => {
                format!("{not_verified}: it is not valid for the host name in --server")
            }
            C::NotValidForNameContext {
                expected,
                presented,
            } if !presented.is_empty() => format!(
                "{not_verified}: it is not valid for {}, only for {}; use one of those \
                 names in --server, or a certificate that lists this one",
                expected.to_str(),
                presented.join(", ")
            ),
            other if format!("{other:?}").contains("CaUsedAsEndEntity") => format!(
                "{not_verified}: it says it is a CA (CA:TRUE), which a server's \
                 certificate must not; make it with basicConstraints=critical,CA:FALSE \
                 (see TLS in docs/security.md)"
            ),
            other => format!("{not_verified} ({other}); {TRUST}"),
        },
        rustls::Error::InvalidMessage(_) => "not in TLS: if it serves plain HTTP, use an \
             http:// URL"
            .to_owned(),
        other => format!("the TLS handshake failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_urls_encode_the_name_as_one_segment() {
        let client = LockClient::new("http://127.0.0.1:8080", None, None).expect("valid");
        assert_eq!(
            client.lock_url("orders:1".into()).as_str(),
            "http://127.0.0.1:8080/locks/orders:1"
        );
        assert_eq!(
            client.lock_url(Target::Semaphore("pool")).as_str(),
            "http://127.0.0.1:8080/semaphores/pool"
        );
        let client = LockClient::new("https://locks.example/lockd/", None, None).expect("valid");
        assert_eq!(
            client.lock_url("a b/c".into()).as_str(),
            "https://locks.example/lockd/locks/a%20b%2Fc"
        );
    }

    #[test]
    fn a_password_in_the_server_url_is_hidden_from_messages() {
        let client =
            LockClient::new("http://ops:s3cret@127.0.0.1:8080", None, None).expect("valid");
        assert_eq!(client.server(), "http://ops:***@127.0.0.1:8080/");
        let plain = LockClient::new("http://127.0.0.1:8080", None, None).expect("valid");
        assert_eq!(plain.server(), "http://127.0.0.1:8080");
    }

    #[test]
    fn a_ca_cert_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let missing = dir.path().join("missing.pem");
        for path in [&empty, &missing] {
            let refused = LockClient::new("https://127.0.0.1:8443", None, Some(path));
            assert!(matches!(refused, Err(BadServer::CaCert { .. })), "{path:?}");
        }
    }

    #[test]
    fn other_schemes_are_refused() {
        assert!(LockClient::new("redis://127.0.0.1:6379", None, None).is_err());
        // A trailing newline is trimmed, an empty key is no key, and a key
        // a header cannot carry is named as the problem.
        assert!(LockClient::new("http://127.0.0.1:8080", Some("key\n"), None).is_ok());
        assert!(LockClient::new("http://127.0.0.1:8080", Some("  "), None).is_ok());
        assert!(matches!(
            LockClient::new("http://127.0.0.1:8080", Some("a\nb"), None),
            Err(BadServer::ApiKey)
        ));
        assert!(LockClient::new("127.0.0.1:8080", None, None).is_err());
    }

    fn refusal(status: StatusCode, body: &str) -> ClientError {
        ClientError::from_refusal(Refusal {
            status,
            body: body.to_owned(),
            problem: serde_json::from_str(body).unwrap_or_default(),
        })
    }

    #[test]
    fn the_problem_type_decides_the_variant_then_the_status() {
        let held =
            r#"{"type":"urn:lockd:problem:lock-held","detail":"held","retry_after_ms":2500}"#;
        assert!(matches!(
            refusal(StatusCode::CONFLICT, held),
            ClientError::Held { retry_after: Some(d), .. } if d == Duration::from_millis(2500)
        ));
        let owner = r#"{"type":"urn:lockd:problem:not-lock-owner"}"#;
        assert!(matches!(
            refusal(StatusCode::CONFLICT, owner),
            ClientError::NotOwner { .. }
        ));
        let gone = r#"{"type":"urn:lockd:problem:lock-not-held"}"#;
        assert!(matches!(
            refusal(StatusCode::NOT_FOUND, gone),
            ClientError::NotHeld { .. }
        ));
        // An upgrade refused: not a held lock to retry on, a usage error.
        let mode = r#"{"type":"urn:lockd:problem:mode-mismatch"}"#;
        assert!(matches!(
            refusal(StatusCode::CONFLICT, mode),
            ClientError::Refused { .. }
        ));
        let route = r#"{"type":"urn:lockd:problem:route-not-found"}"#;
        assert!(matches!(
            refusal(StatusCode::NOT_FOUND, route),
            ClientError::Refused { .. }
        ));
        let quorum = r#"{"type":"urn:lockd:problem:quorum-unavailable","retry_after_ms":100}"#;
        assert!(matches!(
            refusal(StatusCode::SERVICE_UNAVAILABLE, quorum),
            ClientError::Unavailable {
                retry_after: Some(_),
                ..
            }
        ));
        let key = r#"{"type":"urn:lockd:problem:unauthorized","detail":"no key"}"#;
        let refused = refusal(StatusCode::UNAUTHORIZED, key);
        assert!(matches!(refused, ClientError::Refused { .. }));
        assert_eq!(refused.to_string(), "401 Unauthorized: no key");
        // Without a problem document (a proxy's answer), the status says.
        assert!(matches!(
            refusal(StatusCode::NOT_FOUND, ""),
            ClientError::Refused { .. }
        ));
        assert!(matches!(
            refusal(StatusCode::CONFLICT, ""),
            ClientError::Held { .. }
        ));
        assert!(matches!(
            refusal(StatusCode::TOO_MANY_REQUESTS, ""),
            ClientError::RateLimited { .. }
        ));
        assert!(matches!(
            refusal(StatusCode::BAD_GATEWAY, "<html>"),
            ClientError::ServerError { .. }
        ));
        assert_eq!(
            refusal(StatusCode::BAD_GATEWAY, "").status(),
            Some(StatusCode::BAD_GATEWAY)
        );
    }

    #[test]
    fn a_lease_hides_its_token_from_debug() {
        let lease: Lease =
            serde_json::from_str(r#"{"token":"secret-token-1234","fence":3,"ttl_ms":1000}"#)
                .expect("a lease");
        assert!(!format!("{lease:?}").contains("secret"));
    }
}
