//! The pages lockd serves to browsers: `/docs`, with its Scalar script
//! served by lockd itself. Each answer has its Content-Type, its
//! Content-Security-Policy and the security headers; none needs an API
//! key; the script is the file `docs.html` names by its integrity hash,
//! gzipped for the clients that take it.

use base64::Engine as _;
use lockd::http::pages::docs;
use reqwest::Method;
use sha2::Digest as _;

use crate::support::{Reply, TestApp};

#[track_caller]
fn assert_page_headers(reply: &Reply, csp: &str, what: &str) {
    assert_eq!(
        reply.header("content-security-policy").as_deref(),
        Some(csp),
        "{what}"
    );
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
    ] {
        assert_eq!(reply.header(name).as_deref(), Some(value), "{what}: {name}");
    }
}

#[tokio::test]
async fn docs_answers_carry_their_type_policy_and_security_headers() {
    let app = TestApp::memory().await;
    for (path, content_type) in [
        ("/docs", "text/html; charset=utf-8"),
        (docs::SCRIPT, "text/javascript"),
    ] {
        let reply = app.get(path).await;
        reply.expect_status(200);
        let got = reply.header("content-type").unwrap_or_default();
        assert!(got.starts_with(content_type), "{path}: {got}");
        assert_page_headers(&reply, docs::CSP, path);
        let head = app.send(Method::HEAD, path, &[], None).await;
        head.expect_status(200);
        assert!(head.text.is_empty(), "{path}: HEAD sent a body");
        assert_page_headers(&head, docs::CSP, path);
    }
    let refused = app.send(Method::POST, "/docs", &[], None).await;
    refused.expect_problem(405, "method-not-allowed");
    assert_page_headers(&refused, docs::CSP, "POST /docs");
    let html = app.get("/docs").await.text;
    assert!(
        !html.contains("cdn.jsdelivr.net"),
        "/docs still names a CDN"
    );
}

/// `/docs` loads the script from lockd, at the path that names its
/// version, with the SHA-384 of the file lockd serves there.
#[tokio::test]
async fn docs_loads_its_script_from_lockd_by_its_integrity_hash() {
    let app = TestApp::memory().await;
    let html = app.get("/docs").await.text;
    let plain = app.get(docs::SCRIPT).await;
    plain.expect_status(200);
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.header("vary").as_deref(), Some("accept-encoding"));
    assert_eq!(
        plain.header("cache-control").as_deref(),
        Some("public, max-age=31536000, immutable")
    );
    let digest = base64::engine::general_purpose::STANDARD
        .encode(sha2::Sha384::digest(plain.text.as_bytes()));
    let tag = format!(
        "<script src=\"{}\"\n        integrity=\"sha384-{digest}\">",
        docs::SCRIPT
    );
    assert!(html.contains(&tag), "/docs does not load {tag}");
    assert!(
        docs::SCRIPT.starts_with("/docs/scalar/") && docs::SCRIPT.ends_with("/standalone.js"),
        "{}",
        docs::SCRIPT
    );
    // A browser gets the gzipped file (reqwest here inflates nothing).
    let response = app
        .client
        .get(app.url(docs::SCRIPT))
        .header("accept-encoding", "gzip, deflate, br, zstd")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(headers["vary"], "accept-encoding");
    let gzipped = response.bytes().await.unwrap();
    assert!(
        gzipped.len() * 3 < plain.text.len(),
        "{} bytes gzipped, {} plain",
        gzipped.len(),
        plain.text.len()
    );
    let mut inflated = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(&gzipped[..]),
        &mut inflated,
    )
    .unwrap();
    assert!(inflated == plain.text, "the gzipped file is another file");
}
