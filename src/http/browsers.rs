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
//! - **Origin.** A request with an `Origin` header that is neither lockd's
//!   own origin (a page lockd served itself, such as `/docs`) nor one of
//!   `--cors-allow-origin`: 403 `cross-origin`. Without `Origin`, a request
//!   with `Sec-Fetch-Site: cross-site`: 403 too. Browsers send `Origin` on
//!   every cross-origin request and on every `POST`, `PATCH` and `DELETE`;
//!   curl and the clients send neither header, and pass unchanged.
//!
//! A refused request writes nothing. For the allowed origins, tower-http's
//! CORS layer ([`Browsers::cors`]) answers the preflights and adds
//! `Access-Control-Allow-Origin` and the exposed headers to every answer;
//! with none allowed, it is not installed at all. See docs/security.md,
//! "Browsers".

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, Version, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_layer::Layer;
use tower_service::Service;

use super::problem::{ApiError, Kind};
use super::telemetry::X_REQUEST_ID;

/// The `Lock-Token` header.
const LOCK_TOKEN: HeaderName = HeaderName::from_static("lock-token");

/// The `Sec-Fetch-Site` header (Fetch Metadata).
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// How long a browser may keep a preflight's answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The most characters of a refused `Host` or `Origin` quoted back.
const MAX_QUOTED: usize = 100;

/// Who may call one listener from a browser, and by which names.
#[derive(Debug, Clone)]
pub struct Browsers {
    /// `http` or `https`: the scheme of lockd's own origin.
    scheme: &'static str,
    /// The serialized origins allowed besides lockd's own.
    allowed_origins: Arc<[String]>,
    /// On a loopback listener, the names allowed in `Host` besides the
    /// loopback ones; `None` on any other listener (any `Host` is taken).
    loopback_hosts: Option<Arc<[String]>>,
}

impl Browsers {
    /// The policy of a listener on `addr` (HTTPS when `tls`), with the
    /// origins of `--cors-allow-origin` (serialized, as the settings keep
    /// them) and the names of `--allowed-host` (lower case, no port).
    pub fn new(addr: SocketAddr, tls: bool, origins: &[String], hosts: &[String]) -> Self {
        Self {
            scheme: if tls { "https" } else { "http" },
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
        let mut hosts = request.headers().get_all(header::HOST).iter();
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
        if let (Some(allowed), Some(host)) = (&self.loopback_hosts, host)
            && !host_allowed(host, allowed)
        {
            return Some(ApiError::new(
                Kind::MisdirectedRequest,
                format!(
                    "this lockd listens on a loopback address and answers requests for a \
                     loopback name (localhost, 127.0.0.1, [::1]) only, not for Host {:?}: \
                     a page that rebinds its DNS name to this machine is refused so; \
                     start lockd with --allowed-host to serve another name",
                    quoted(host)
                ),
            ));
        }
        match request.headers().get(header::ORIGIN) {
            Some(origin) => {
                let origin = origin.to_str().unwrap_or("");
                let own = host.is_some_and(|host| same_origin(self.scheme, host, origin));
                if own || self.allowed_origins.iter().any(|o| o == origin) {
                    return None;
                }
                Some(ApiError::new(
                    Kind::CrossOrigin,
                    format!(
                        "a browser page of origin {:?} may not call this lockd; start lockd \
                         with --cors-allow-origin for an origin that may",
                        quoted(origin)
                    ),
                ))
            }
            None if request
                .headers()
                .get(SEC_FETCH_SITE)
                .is_some_and(|site| site.as_bytes().eq_ignore_ascii_case(b"cross-site")) =>
            {
                Some(ApiError::new(
                    Kind::CrossOrigin,
                    "a browser request from another site (Sec-Fetch-Site: cross-site) may not \
                     call this lockd; start lockd with --cors-allow-origin for an origin that may",
                ))
            }
            None => None,
        }
    }
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
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
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

/// Whether `origin` (an `Origin` value) is lockd's own: `scheme://host`,
/// compared in their serialized forms (so `http://localhost:80` is
/// `http://localhost`).
fn same_origin(scheme: &str, host: &str, origin: &str) -> bool {
    let own = url::Url::parse(&format!("{scheme}://{host}"));
    let theirs = url::Url::parse(origin);
    match (own, theirs) {
        (Ok(own), Ok(theirs)) => {
            own.origin().ascii_serialization() == theirs.origin().ascii_serialization()
                && theirs.origin().is_tuple()
        }
        _ => false,
    }
}

/// The layer of [`Browsers::guard`].
#[derive(Debug, Clone)]
pub struct Guard {
    policy: Arc<Browsers>,
}

impl<S> Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// The service [`Guard`] puts around another. A plain tower service, as
/// [`super::target`]'s is: the check needs no `await`, so a request that
/// passes costs no boxed future.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    policy: Arc<Browsers>,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.policy.refusal(&request) {
            Some(refused) => Either::Left(ready(Ok(refused.into_response()))),
            None => Either::Right(self.inner.call(request)),
        }
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
    fn lockds_own_origin_is_its_scheme_and_host() {
        assert!(same_origin(
            "http",
            "127.0.0.1:8080",
            "http://127.0.0.1:8080"
        ));
        assert!(same_origin("http", "localhost", "http://localhost:80"));
        assert!(same_origin(
            "https",
            "Lockd.example:443",
            "https://lockd.example"
        ));
        assert!(!same_origin(
            "http",
            "127.0.0.1:8080",
            "https://127.0.0.1:8080"
        ));
        assert!(!same_origin(
            "http",
            "127.0.0.1:8080",
            "http://127.0.0.1:3000"
        ));
        assert!(!same_origin("http", "localhost:8080", "null"));
        assert!(!same_origin(
            "http",
            "localhost:8080",
            "http://evil.example"
        ));
    }
}
