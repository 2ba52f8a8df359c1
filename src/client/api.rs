//! [`LockClient`]: the lockd HTTP API as a client calls it, with reqwest
//! (rustls for `https://` servers). Tokens travel in the `Lock-Token`
//! header, never in a URL.

use std::path::{Path, PathBuf};
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
}

/// The server's answer: its status and body, as sent.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body (JSON, a problem document, or empty for 204).
    pub body: String,
}

/// A granted lease, from the body of a 201 or 200 acquire.
#[derive(Debug, Clone, Deserialize)]
pub struct Grant {
    /// The token that proves the grant.
    pub token: String,
    /// The fencing token; absent only for locks written by foreign clients.
    pub fence: Option<u64>,
    /// The lease length granted, in milliseconds.
    pub ttl_ms: u64,
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

impl Answer {
    /// The problem document's detail and retry hint (empty when the body
    /// is not one).
    pub fn problem(&self) -> ProblemInfo {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server could not be reached, or did not answer in time.
    #[error("{0}")]
    Unreachable(String),
}

/// The server URL, or the CA certificates to trust, are not usable.
#[derive(Debug, thiserror::Error)]
pub enum BadServer {
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
        let base = url::Url::parse(server).map_err(|e| bad(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
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
        Ok(Self { http, base })
    }

    /// The URL of the lock `name`: the server's path, then `locks/<name>`
    /// with the name percent-encoded as one path segment.
    fn lock_url(&self, name: &str) -> url::Url {
        let mut url = self.base.clone();
        url.set_query(None);
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push("locks").push(name);
        }
        url
    }

    /// `POST /locks/{name}`. `timeout` bounds the whole call; give it more
    /// than `wait_ms`.
    ///
    /// # Errors
    /// [`CallError`] when no answer came.
    pub async fn acquire(
        &self,
        name: &str,
        params: &AcquireParams<'_>,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        let mut body = Map::new();
        if let Some(ttl) = params.ttl_ms {
            body.insert("ttl_ms".into(), json!(ttl));
        }
        if params.wait_ms > 0 {
            body.insert("wait_ms".into(), json!(params.wait_ms));
        }
        if let Some(owner) = params.owner {
            body.insert("owner".into(), json!(owner));
        }
        let mut request = self.http.post(self.lock_url(name)).json(&body);
        if let Some(token) = params.token {
            request = request.header("Lock-Token", token);
        }
        send(request, timeout).await
    }

    /// `PATCH /locks/{name}`: resets the lease to `ttl_ms` (the server's
    /// default when `None`).
    ///
    /// # Errors
    /// [`CallError`] when no answer came within `timeout`.
    pub async fn extend(
        &self,
        name: &str,
        token: &str,
        ttl_ms: Option<u64>,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        let body = ttl_ms.map_or_else(|| json!({}), |ttl| json!({ "ttl_ms": ttl }));
        let request = self
            .http
            .patch(self.lock_url(name))
            .header("Lock-Token", token)
            .json(&body);
        send(request, timeout).await
    }

    /// `DELETE /locks/{name}`.
    ///
    /// # Errors
    /// [`CallError`] when no answer came within `timeout`.
    pub async fn release(
        &self,
        name: &str,
        token: &str,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        let request = self
            .http
            .delete(self.lock_url(name))
            .header("Lock-Token", token);
        send(request, timeout).await
    }

    /// `GET /locks/{name}`.
    ///
    /// # Errors
    /// [`CallError`] when no answer came within `timeout`.
    pub async fn status(&self, name: &str, timeout: Duration) -> Result<Answer, CallError> {
        send(self.http.get(self.lock_url(name)), timeout).await
    }
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

async fn send(request: reqwest::RequestBuilder, timeout: Duration) -> Result<Answer, CallError> {
    let unreachable = |e: reqwest::Error| {
        // The innermost cause says what happened ("Connection refused");
        // reqwest's own message adds only the URL.
        let mut cause: &dyn std::error::Error = &e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let why = if e.is_timeout() {
            "timed out".to_owned()
        } else {
            cause.to_string()
        };
        CallError::Unreachable(why)
    };
    let response = request.timeout(timeout).send().await.map_err(unreachable)?;
    let status = response.status();
    let body = response.text().await.map_err(unreachable)?;
    Ok(Answer { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_urls_encode_the_name_as_one_segment() {
        let client = LockClient::new("http://127.0.0.1:8080", None, None).expect("valid");
        assert_eq!(
            client.lock_url("orders:1").as_str(),
            "http://127.0.0.1:8080/locks/orders:1"
        );
        let client = LockClient::new("https://locks.example/lockd/", None, None).expect("valid");
        assert_eq!(
            client.lock_url("a b/c").as_str(),
            "https://locks.example/lockd/locks/a%20b%2Fc"
        );
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
}
