//! `/docs`: the OpenAPI document rendered for a person by Scalar
//! (`@scalar/api-reference`), with Scalar's script served by lockd itself
//! at [`SCRIPT`], so that the page works with no network but lockd.
//!
//! The script is the npm package's `dist/browser/standalone.js`, vendored
//! gzipped in `src/http/pages/scalar/` (its README says where it came from
//! and how `scripts/update-scalar.sh` moves it to another version). It is
//! kept and served gzipped: 1.4 MB in the binary and on the wire rather
//! than 4.9 MB (a stripped release binary is about 18 MB with it); a
//! client that does not take gzip gets it inflated, once per process, on
//! its first such request.
//! Its path names its version, so it can be cached for a year
//! (`immutable`): another version is another path. The page still names it
//! with its Subresource Integrity hash, which the browser checks, and a
//! unit test checks the embedded file against it.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{MethodRouter, get};
use utoipa::openapi::OpenApi;

/// The page's path.
pub const PAGE: &str = "/docs";

/// The path of Scalar's script: the version of the vendored file, as in
/// the npm package's path. `docs.html` loads it from there (a test checks
/// that both say the same).
pub const SCRIPT: &str = "/docs/scalar/1.76.0/standalone.js";

/// The Content-Security-Policy of `/docs` and its script: only lockd's own
/// scripts, and the one inline script of `docs.html` ([`INLINE_SCRIPT`], by
/// its SHA-256; a test checks the hash); styles from lockd or inline, as
/// Scalar sets them (it sets `style` attributes, which a nonce does not
/// cover); images and fonts from lockd or `data:`; requests to lockd alone
/// (Scalar's "Test Request" calls the API; its fonts, telemetry and AI
/// agent would call Scalar's servers, which the page turns off and this
/// policy refuses); never framed; no `<base>`; no form submitted.
pub const CSP: &str = "default-src 'none'; \
    script-src 'self' 'sha256-b9xsC5yGGg9UwGVYBjAHv7CSGQashucmetli6PBHOzQ='; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; \
    connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The one inline script of `docs.html`, run before Scalar's: it tells
/// Zod (bundled in Scalar) not to probe for `eval` with `new Function`,
/// which `script-src` refuses, and each refusal is a CSP violation report
/// in the browser. Zod then validates without compiled code, as it does
/// where `eval` is refused.
pub const INLINE_SCRIPT: &str = "globalThis.__zod_globalConfig = { jitless: true };";

/// The page's template: `$spec` is replaced with the document.
const TEMPLATE: &str = include_str!("docs.html");

/// Scalar's script, gzipped (`gzip -9 -n` of the npm package's file).
const SCRIPT_GZ: &[u8] = include_bytes!("scalar/standalone.js.gz");

/// One year, and `immutable`: the script's path names its version.
const SCRIPT_CACHE: &str = "public, max-age=31536000, immutable";

/// The `/docs` page, made once from the document.
#[derive(Clone)]
pub struct Docs {
    html: Arc<str>,
}

impl Docs {
    /// The page of `doc`: the template with the document as JSON in place
    /// of `$spec`, every `<` escaped as `\u003c` (the same JSON), so that no
    /// text of the document can end the `<script>` element that holds it.
    pub fn new(doc: &OpenApi) -> Self {
        let json = serde_json::to_string(doc)
            .unwrap_or_else(|e| {
                serde_json::json!({ "error": format!("the document did not serialize: {e}") })
                    .to_string()
            })
            .replace('<', "\\u003c");
        Self {
            html: TEMPLATE.replace("$spec", &json).into(),
        }
    }

    /// The handler of [`PAGE`]: the page, never cached (it holds the
    /// document of this server's settings).
    pub fn page<S: Clone + Send + Sync + 'static>(&self) -> MethodRouter<S> {
        let html = self.html.clone();
        get(move || {
            let html = html.clone();
            async move {
                (
                    [
                        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (header::CACHE_CONTROL, "no-cache"),
                    ],
                    html.to_string(),
                )
                    .into_response()
            }
        })
    }
}

/// The handler of [`SCRIPT`]: gzipped when the client takes gzip, else
/// inflated ([`inflated`]); with `Vary: Accept-Encoding` either way.
pub fn script<S: Clone + Send + Sync + 'static>() -> MethodRouter<S> {
    get(|headers: HeaderMap| async move {
        let mut response = if takes_gzip(&headers) {
            let mut response = Response::new(Body::from(SCRIPT_GZ));
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            response
        } else {
            match inflated() {
                Some(script) => Response::new(Body::from(script)),
                None => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
        };
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/javascript; charset=utf-8"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(SCRIPT_CACHE),
        );
        headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        response
    })
}

/// Whether `Accept-Encoding` takes gzip (RFC 9110 §12.5.3): `gzip` (or
/// `x-gzip`) with a weight above 0, or else `*` with one. Without the
/// header, no: a client that says nothing (curl) gets the file as it is.
fn takes_gzip(headers: &HeaderMap) -> bool {
    let (mut named, mut any) = (None, None);
    let codings = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','));
    for coding in codings {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or("");
        let weighted_out = parts.any(|param| {
            param
                .split_once('=')
                .filter(|(key, _)| key.trim().eq_ignore_ascii_case("q"))
                .is_some_and(|(_, q)| q.trim().parse::<f32>().is_ok_and(|q| q <= 0.0))
        });
        if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            named = Some(named.unwrap_or(false) || !weighted_out);
        } else if name == "*" {
            any = Some(!weighted_out);
        }
    }
    named.or(any).unwrap_or(false)
}

/// Scalar's script as it is, inflated on first use and kept: `None` if the
/// embedded file does not inflate (a test makes sure it does).
pub fn inflated() -> Option<&'static [u8]> {
    static SCRIPT: OnceLock<Option<Box<[u8]>>> = OnceLock::new();
    SCRIPT
        .get_or_init(|| {
            use std::io::Read as _;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(SCRIPT_GZ)
                .read_to_end(&mut out)
                .map_err(
                    |e| tracing::error!(error = %e, "the vendored Scalar script does not inflate"),
                )
                .ok()?;
            Some(out.into_boxed_slice())
        })
        .as_deref()
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use sha2::Digest as _;

    use super::*;

    fn base64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn the_page_loads_the_embedded_script_and_its_integrity_hash_is_that_files() {
        let script = inflated().expect("the vendored script inflates");
        let digest = base64(&sha2::Sha384::digest(script));
        let tag =
            format!("<script src=\"{SCRIPT}\"\n        integrity=\"sha384-{digest}\"></script>");
        assert!(
            TEMPLATE.contains(&tag),
            "docs.html does not load {SCRIPT} with the hash of the embedded file (sha384-{digest})"
        );
    }

    #[test]
    fn the_policy_allows_the_one_inline_script_by_its_hash() {
        assert!(TEMPLATE.contains(&format!("<script>{INLINE_SCRIPT}</script>")));
        let hash = base64(&sha2::Sha256::digest(INLINE_SCRIPT.as_bytes()));
        assert!(
            CSP.contains(&format!("'sha256-{hash}'")),
            "CSP lacks 'sha256-{hash}'"
        );
    }

    #[test]
    fn gzip_is_sent_to_the_clients_that_take_it() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_str(value).expect("ASCII"),
            );
            takes_gzip(&headers)
        };
        for yes in [
            "gzip",
            "gzip, deflate, br, zstd",
            "br;q=1.0, GZIP;q=0.5",
            "*",
            "x-gzip",
        ] {
            assert!(with(yes), "{yes}");
        }
        for no in [
            "identity",
            "br",
            "gzip;q=0",
            "gzip; q=0.0",
            "*;q=0",
            "gzipx",
            "gzip;q=0, *",
        ] {
            assert!(!with(no), "{no}");
        }
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_document_cannot_end_its_script_element() {
        let mut doc = OpenApi::default();
        doc.info.description = Some("</script><script>alert(1)</script>".into());
        let html = Docs::new(&doc).html;
        assert!(!html.contains("</script><script>alert"), "{html}");
        assert!(html.contains("\\u003c/script>"));
    }
}
