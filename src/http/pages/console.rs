//! The console at `/ui`: a page that shows the locks, semaphores and runs
//! under a prefix, their holders and leases counting down, and one of them
//! in detail with its history and its watch followed live; an admin key
//! may break a lease from it. docs/console.md describes it.
//!
//! Three files in `src/http/pages/console/`, compiled in: `index.html`,
//! `app.js` (plain JavaScript, an ES module: no framework, no build step)
//! and `app.css`. They hold no data and need no key: the page asks the
//! API for everything (`GET /locks`, `GET /locks/{name}/events`, ...),
//! with the key the user gives it, from `sessionStorage`, in an
//! `Authorization` header (never in a URL). The page and its files name
//! each other by relative URLs (`ui/app.js`, `locks?...`), so that lockd
//! behind a proxy under a path prefix serves them as well.
//!
//! Each answer has an `ETag` (a hash of the file) and `Cache-Control:
//! no-cache`: a browser asks again each time and gets 304 while the file is
//! the same, so a new lockd's console is never mixed with an old one's.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{MethodRouter, get};
use sha2::{Digest as _, Sha256};

/// The console's Content-Security-Policy: scripts, styles and requests
/// from lockd alone, no inline script or style attribute, images from
/// lockd or `data:` (the empty favicon), nothing else; never framed; no
/// `<base>`; no form submitted (the key form is handled by the script, and
/// were the script missing, the browser would send nothing rather than put
/// the key in a URL).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
    form-action 'none'";

/// The console's path with a trailing slash, which redirects to [`PAGE`].
pub const SLASHED: &str = "/ui/";

/// The console's page.
pub const PAGE: &str = "/ui";

/// One file of the console.
struct File {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// The console's files, by path.
const FILES: [File; 3] = [
    File {
        path: PAGE,
        content_type: "text/html; charset=utf-8",
        body: include_str!("console/index.html"),
    },
    File {
        path: "/ui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("console/app.js"),
    },
    File {
        path: "/ui/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("console/app.css"),
    },
];

/// The console's routes: each file, and [`SLASHED`], a permanent redirect
/// (308) to the page by a relative `Location` (`../ui`), which keeps a
/// proxy's path prefix.
pub fn files<S: Clone + Send + Sync + 'static>() -> Vec<(&'static str, MethodRouter<S>)> {
    let mut routes: Vec<(&'static str, MethodRouter<S>)> =
        FILES.iter().map(|file| (file.path, serve(file))).collect();
    routes.push((
        SLASHED,
        get(|| async {
            (
                StatusCode::PERMANENT_REDIRECT,
                [(header::LOCATION, "../ui")],
            )
                .into_response()
        }),
    ));
    routes
}

/// The handler of `file`: the file, or 304 when `If-None-Match` names its
/// `ETag`.
fn serve<S: Clone + Send + Sync + 'static>(file: &File) -> MethodRouter<S> {
    let etag = etag(file.body);
    let (content_type, body) = (file.content_type, file.body);
    get(move |request: HeaderMap| async move {
        let fresh = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|tag| {
                let tag = tag.trim();
                tag == "*" || tag.trim_start_matches("W/") == etag.to_str().unwrap_or("")
            });
        let mut response = if fresh {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            let mut response = Response::new(body.into());
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        };
        let headers = response.headers_mut();
        headers.insert(header::ETAG, etag.clone());
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    })
}

/// A strong `ETag` of `body`: the first 16 bytes of its SHA-256, in hex,
/// quoted.
fn etag(body: &str) -> HeaderValue {
    let digest = Sha256::digest(body.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    HeaderValue::from_str(&format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_differ_by_content_and_are_quoted() {
        let (a, b) = (etag("a"), etag("b"));
        assert_ne!(a, b);
        let a = a.to_str().expect("ASCII");
        assert!(
            a.starts_with('"') && a.ends_with('"') && a.len() == 34,
            "{a}"
        );
    }
}
