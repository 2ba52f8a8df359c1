//! What keeps a web page the user happens to visit from using a lockd it
//! can reach: a lockd without API keys (`--dev`, or `--insecure-no-auth`
//! on loopback) would otherwise take a lock for any page that sends it a
//! `fetch` (a `text/plain` POST is a "simple" request, sent without a
//! preflight), and a page that rebinds its own DNS name to 127.0.0.1
//! reaches a loopback lockd by name. On every route, before anything reads
//! the body:
//!
//! - **`Host`.** An HTTP/1.1 request without exactly one `Host` header: 400
//!   (RFC 9112 §3.2). On a loopback listener, a `Host` that is not a
//!   loopback name or address (`localhost`, `*.localhost`, `127.0.0.0/8`,
//!   `[::1]`) or a name given with `--allowed-host`: 421
//!   `misdirected-request`. A DNS-rebinding page's requests carry its own
//!   name, so they stop here.
//!   An absolute-form target's host wins over `Host` (RFC 9112 §3.2.2).
//! - **Origin.** A request with an `Origin` header that is neither lockd's
//!   own origin (the `Host` it names, by either scheme: a page lockd served
//!   itself, such as `/docs`, behind a proxy or not) nor one of
//!   `--cors-allow-origin`: 403 `cross-origin`; two `Origin` headers: 400.
//!   Without `Origin`, a request with `Sec-Fetch-Site: cross-site` (in any
//!   of its values): 403 too, but for a link followed from another site (a
//!   top-level `GET` navigation, which that site cannot read). Browsers
//!   send `Origin` on every cross-origin request and on every `POST`,
//!   `PATCH` and `DELETE`; curl and the clients send neither header, and
//!   pass unchanged.
//!
//! A refused request writes nothing. For the allowed origins, tower-http's
//! CORS layer ([`Browsers::cors`]) answers the preflights and adds
//! `Access-Control-Allow-Origin` and the exposed headers to every answer;
//! with none allowed, it is not installed at all. See docs/security.md,
//! "Browsers".

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, Version, header};
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_layer::Layer;

use super::problem::{ApiError, Kind};
use super::target::{Check, Refusing};
use super::telemetry::X_REQUEST_ID;

/// The `Lock-Token` header.
const LOCK_TOKEN: HeaderName = HeaderName::from_static("lock-token");

/// The `Sec-Fetch-Site` header (Fetch Metadata).
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// The `Sec-Fetch-Mode` header (Fetch Metadata).
const SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");

/// The `Sec-Fetch-Dest` header (Fetch Metadata).
const SEC_FETCH_DEST: HeaderName = HeaderName::from_static("sec-fetch-dest");

/// How long a browser may keep a preflight's answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The most characters of a refused `Host` or `Origin` quoted back.
const MAX_QUOTED: usize = 100;

/// Who may call one listener from a browser, and by which names.
#[derive(Debug, Clone)]
pub struct Browsers {
    /// The serialized origins allowed besides lockd's own.
    allowed_origins: Arc<[String]>,
    /// On a loopback listener, the names allowed in `Host` besides the
    /// loopback ones; `None` on any other listener (any `Host` is taken).
    loopback_hosts: Option<Arc<[String]>>,
}

impl Browsers {
    /// The policy of a listener on `addr`, with the
    /// origins of `--cors-allow-origin` (serialized, as the settings keep
    /// them) and the names of `--allowed-host` (lower case, no port).
    pub fn new(addr: SocketAddr, origins: &[String], hosts: &[String]) -> Self {
        Self {
            allowed_origins: origins.into(),
            loopback_hosts: addr.ip().is_loopback().then(|| hosts.into()),
        }
    }

    /// The layer that refuses what this policy refuses.
    pub fn guard(&self) -> Guard {
        Guard {
            policy: Arc::new(self.clone()),
        }
    }

    /// tower-http's CORS layer for the allowed origins, or `None` when none
    /// is (lockd's own pages need no CORS).
    pub fn cors(&self) -> Option<CorsLayer> {
        if self.allowed_origins.is_empty() {
            return None;
        }
        let origins: Vec<HeaderValue> = self
            .allowed_origins
            .iter()
            .filter_map(|o| HeaderValue::from_str(o).ok())
            .collect();
        Some(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([
                    Method::GET,
                    Method::HEAD,
                    Method::POST,
                    Method::PATCH,
                    Method::DELETE,
                ])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    LOCK_TOKEN,
                    X_REQUEST_ID,
                    HeaderName::from_static("last-event-id"),
                ])
                .expose_headers([
                    header::RETRY_AFTER,
                    header::WWW_AUTHENTICATE,
                    header::ALLOW,
                    header::LOCATION,
                    X_REQUEST_ID,
                ])
                .max_age(PREFLIGHT_MAX_AGE),
        )
    }

    /// Why `request` is refused, if it is.
    fn refusal(&self, request: &Request) -> Option<ApiError> {
        let headers = request.headers();
        let mut hosts = headers.get_all(header::HOST).iter();
        let host = hosts.next();
        if hosts.next().is_some() {
            return Some(ApiError::invalid(
                "the request has more than one Host header; send exactly one (RFC 9112 §3.2)",
            ));
        }
        let host = match host.map(|h| h.to_str()) {
            Some(Ok(host)) => Some(host),
            Some(Err(_)) => return Some(ApiError::invalid("the Host header is not ASCII")),
            None if request.version() == Version::HTTP_11 => {
                return Some(ApiError::invalid(
                    "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)",
                ));
            }
            None => None,
        };
        // An absolute-form target names the host; Host is then ignored
        // (RFC 9112 §3.2.2).
        let host = request.uri().authority().map(|a| a.as_str()).or(host);
        if let (Some(allowed), Some(host)) = (&self.loopback_hosts, host)
            && !host_allowed(host, allowed)
        {
            return Some(ApiError::new(
                Kind::MisdirectedRequest,
                format!(
                    "this lockd listens on a loopback address and answers requests for a \
                     loopback name only (localhost, *.localhost, 127.0.0.0/8, [::1]), not for \
                     Host {:?}: a page that rebinds its DNS name to this machine is refused \
                     so; start lockd with --allowed-host to serve another name",
                    quoted(host)
                ),
            ));
        }
        let mut origins = headers.get_all(header::ORIGIN).iter();
        let origin = origins.next();
        if origins.next().is_some() {
            return Some(ApiError::invalid(
                "the request has more than one Origin header; a browser sends one",
            ));
        }
        if let Some(origin) = origin {
            let origin = origin.to_str().unwrap_or("");
            let own = host.is_some_and(|host| same_origin(host, origin));
            if own || self.allowed_origins.iter().any(|o| o == origin) {
                return None;
            }
            return Some(ApiError::new(
                Kind::CrossOrigin,
                format!(
                    "a browser page of origin {:?} may not call this lockd; start lockd \
                     with --cors-allow-origin for an origin that may",
                    quoted(origin)
                ),
            ));
        }
        let said = |name: &HeaderName, value: &[u8]| {
            headers.get_all(name).iter().any(|v| {
                v.as_bytes()
                    .split(|b| *b == b',')
                    .any(|part| unquoted(part.trim_ascii()).eq_ignore_ascii_case(value))
            })
        };
        // A link followed from another site opens a page (top-level, GET),
        // which its page cannot read: let it through, so that a dashboard's
        // link to /docs or /metrics works. Any other request from another
        // site is refused.
        let navigation = matches!(*request.method(), Method::GET | Method::HEAD)
            && said(&SEC_FETCH_MODE, b"navigate")
            && said(&SEC_FETCH_DEST, b"document");
        if said(&SEC_FETCH_SITE, b"cross-site") && !navigation {
            return Some(ApiError::new(
                Kind::CrossOrigin,
                "a browser request from another site (Sec-Fetch-Site: cross-site) may not \
                 call this lockd; start lockd with --cors-allow-origin for an origin that may",
            ));
        }
        None
    }
}

/// `part` without the double quotes around it, if any.
fn unquoted(part: &[u8]) -> &[u8] {
    part.strip_prefix(b"\"")
        .and_then(|p| p.strip_suffix(b"\""))
        .unwrap_or(part)
}

/// `text` cut to [`MAX_QUOTED`] characters.
fn quoted(text: &str) -> &str {
    text.char_indices()
        .nth(MAX_QUOTED)
        .map_or(text, |(at, _)| &text[..at])
}

/// The host part of a `Host` value (`name`, `name:port`, `[v6]:port`),
/// lower case, without a trailing dot; `None` when it is malformed.
fn host_part(host: &str) -> Option<String> {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        format!("[{v6}]")
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name.to_owned(),
            Some(_) => return None,
            None => host.to_owned(),
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

fn is_port(port: &str) -> bool {
    port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok()
}

/// Whether `host` (a `Host` value) names this machine's loopback, or one
/// of `allowed`.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let Some(name) = host_part(host) else {
        return false;
    };
    let address = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(&name);
    name == "localhost"
        || name.ends_with(".localhost")
        || address.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        || allowed.iter().any(|a| *a == name || *a == address)
}

/// Whether `origin` (an `Origin` value) is lockd's own: the host and port
/// of `host` (a `Host` value), by either scheme (a proxy in front may serve
/// lockd over HTTPS while it listens on HTTP), compared in their
/// serialized forms (so `http://localhost:80` is `http://localhost`).
fn same_origin(host: &str, origin: &str) -> bool {
    let Ok(theirs) = url::Url::parse(origin) else {
        return false;
    };
    if !matches!(theirs.scheme(), "http" | "https") || !theirs.origin().is_tuple() {
        return false;
    }
    let own = url::Url::parse(&format!("{}://{host}", theirs.scheme()));
    own.is_ok_and(|own| own.origin().ascii_serialization() == theirs.origin().ascii_serialization())
}

/// The layer of [`Browsers::guard`]: its policy as a [`Check`], in front
/// of each route.
#[derive(Debug, Clone)]
pub struct Guard {
    policy: Arc<Browsers>,
}

impl<S> Layer<S> for Guard {
    type Service = Refusing<S, Arc<Browsers>>;

    fn layer(&self, inner: S) -> Self::Service {
        Refusing::new(inner, self.policy.clone())
    }
}

impl Check for Arc<Browsers> {
    fn refusal(&self, request: &Request) -> Option<Response> {
        Browsers::refusal(self, request).map(IntoResponse::into_response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_are_allowed_and_others_are_not() {
        let none: [String; 0] = [];
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "a.localhost:1",
            "127.0.0.1",
            "127.8.9.10:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(host_allowed(host, &none), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "[::2]:1",
            "127.0.0.1:port",
            "",
            "[::1",
            "localhost:99999999",
        ] {
            assert!(!host_allowed(host, &none), "{host}");
        }
        let allowed = ["lockd.internal".to_owned(), "192.168.1.5".to_owned()];
        assert!(host_allowed("lockd.internal:8080", &allowed));
        assert!(host_allowed("LOCKD.internal", &allowed));
        assert!(host_allowed("192.168.1.5:80", &allowed));
        assert!(!host_allowed("x.lockd.internal", &allowed));
    }

    #[test]
    fn lockds_own_origin_is_its_host_and_port_by_either_scheme() {
        assert!(same_origin("127.0.0.1:8080", "http://127.0.0.1:8080"));
        assert!(same_origin("localhost", "http://localhost:80"));
        assert!(same_origin("Lockd.example:443", "https://lockd.example"));
        // Behind a proxy that serves HTTPS.
        assert!(same_origin("lockd.example", "https://lockd.example"));
        assert!(!same_origin("127.0.0.1:8080", "http://127.0.0.1:3000"));
        assert!(!same_origin("localhost:8080", "null"));
        assert!(!same_origin("localhost:8080", "http://evil.example"));
        assert!(!same_origin("localhost:8080", "ftp://localhost:8080"));
    }
}
