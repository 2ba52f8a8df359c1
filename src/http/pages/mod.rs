//! The pages lockd serves to a person's browser, outside the OpenAPI
//! document: `/docs` ([`docs`]: the document rendered by Scalar) and the
//! console at `/ui` ([`console`]: locks, semaphores and runs, live). Each is
//! HTML, scripts and styles compiled into the binary: nothing comes from
//! another site, and a browser with no network but lockd shows them.
//!
//! [`router`] is the one list of their routes: it builds them and declares
//! each one's metric series, as `routes::declare_routes` does for the API.
//! They need no API key (they hold no data: the console's own requests to
//! the API carry the key), and pass the same browser checks as every route
//! ([`super::browsers`]; lockd's own pages are its own origin).
//!
//! Every answer under their paths (`/ui`, `/ui/...`, `/docs`,
//! `/docs/...`), refusals included (a path that is no page, a request from
//! another site, a bad `Host`, whatever layer answers it), carries
//! [`SECURITY_HEADERS`] and its page's `Content-Security-Policy`
//! ([`dress`], which the router gives its telemetry layer, the one that
//! sees every answer): the
//! console's is strict (`script-src 'self'`, `style-src 'self'`, no inline
//! script or style, nothing from elsewhere); the docs page's allows what
//! Scalar needs (inline styles, one inline script by its hash), no more.
//! docs/security.md, "Browser pages", says so for users.

pub mod console;
pub mod docs;

use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;
use axum::routing::MethodRouter;
use utoipa::openapi::OpenApi;

use crate::metrics::Metrics;

/// The headers of every answer of a page route, beside its
/// `Content-Security-Policy`: no MIME sniffing (a script is run only as
/// what its `Content-Type` says), no `Referer` sent from the pages (a link
/// out of them does not tell lockd's address), never framed (clickjacking;
/// `frame-ancestors 'none'` says it again to browsers that read CSP), and
/// a browsing context of its own.
pub const SECURITY_HEADERS: [(HeaderName, &str); 5] = [
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (
        HeaderName::from_static("cross-origin-opener-policy"),
        "same-origin",
    ),
    (
        HeaderName::from_static("cross-origin-resource-policy"),
        "same-origin",
    ),
];

/// One page route: its path and its handler (a `GET`, which answers `HEAD`
/// too). Its headers come from [`dress`], by path.
struct Page<S> {
    path: &'static str,
    get: MethodRouter<S>,
}

/// Every page route, in one list: the docs page and its script, then the
/// console and its files.
fn pages<S: Clone + Send + Sync + 'static>(doc: &OpenApi) -> Vec<Page<S>> {
    let docs = docs::Docs::new(doc);
    let mut all = vec![
        Page {
            path: docs::PAGE,
            get: docs.page(),
        },
        Page {
            path: docs::SCRIPT,
            get: docs::script(),
        },
    ];
    all.extend(
        console::files()
            .into_iter()
            .map(|(path, get)| Page { path, get }),
    );
    all
}

/// The router of every page route (their headers: [`dress`]); their metric
/// series are declared in `metrics` (`GET`, 200; the redirect `/ui/`, 308).
pub fn router<S: Clone + Send + Sync + 'static>(doc: &OpenApi, metrics: &Metrics) -> Router<S> {
    let mut router = Router::new();
    for page in pages(doc) {
        let status = if page.path == console::SLASHED {
            "308"
        } else {
            "200"
        };
        metrics.declare_route("GET", page.path, status);
        router = router.route(page.path, page.get);
    }
    router
}

/// What the answers to a request for `path` must carry: under `/ui`, the
/// console's headers; under `/docs`, the docs page's; `None` for every
/// other path (the API's answers are JSON, not pages). For
/// `telemetry::wrap`.
pub fn dress(path: &str) -> Option<fn(&mut Response)> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if under(console::PAGE) {
        Some(|response| secure(response, console::CSP))
    } else if under(docs::PAGE) {
        Some(|response| secure(response, docs::CSP))
    } else {
        None
    }
}

/// Puts [`SECURITY_HEADERS`] and the policy `csp` on `response`.
fn secure(response: &mut Response, csp: &'static str) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
}
