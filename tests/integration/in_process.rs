//! The router called in-process, with no port bound and no Redis: the
//! in-memory backend (the `--dev` settings) and `tower::ServiceExt::oneshot`.
//! For answers that depend on the HTTP layers alone: validation and the
//! shape of problem documents.

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use lockd::app::build_router;
use lockd::config::Settings;
use serde_json::Value;
use tower::ServiceExt as _;

fn router() -> Router {
    let mut settings = Settings::default();
    settings.store.dev = true;
    build_router(&settings).unwrap()
}

/// `request` with the `Host` an HTTP/1.1 client sends (a loopback
/// listener answers loopback names only).
fn on_localhost(mut request: Request<Body>) -> Request<Body> {
    request
        .headers_mut()
        .insert(header::HOST, "localhost".parse().unwrap());
    request
}

/// Sends `request` to a fresh router; the status, the `Content-Type` and
/// the body as JSON.
async fn send(request: Request<Body>) -> (StatusCode, String, Value) {
    let response = router().oneshot(on_localhost(request)).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, content_type, body)
}

/// Asserts a problem document of `status` and `slug`, with a request ID.
#[track_caller]
fn assert_problem(answer: &(StatusCode, String, Value), status: u16, slug: &str) {
    let (got, content_type, body) = answer;
    assert_eq!(got.as_u16(), status, "{body}");
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(body["type"], format!("urn:lockd:problem:{slug}"), "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(body["title"].is_string(), "{body}");
    assert!(body["detail"].is_string(), "{body}");
    assert!(body["request_id"].is_string(), "{body}");
}

#[tokio::test]
async fn a_bad_lock_name_is_a_400_problem() {
    let request = Request::post("/locks/bad%20name")
        .body(Body::empty())
        .unwrap();
    let answer = send(request).await;
    assert_problem(&answer, 400, "invalid-request");
}

#[tokio::test]
async fn a_token_in_the_query_is_a_400_problem() {
    let request = Request::delete("/locks/jobs:1?token=0123456789abcdef")
        .body(Body::empty())
        .unwrap();
    let answer = send(request).await;
    assert_problem(&answer, 400, "invalid-request");
    let detail = answer.2["detail"].as_str().unwrap();
    assert!(detail.contains("never be sent in the URL"), "{detail}");
}

#[tokio::test]
async fn an_unknown_route_is_a_404_problem() {
    let request = Request::get("/nowhere").body(Body::empty()).unwrap();
    let answer = send(request).await;
    assert_problem(&answer, 404, "route-not-found");
}

#[tokio::test]
async fn a_method_the_route_lacks_is_a_405_problem_with_allow() {
    let request = Request::put("/locks/jobs:1").body(Body::empty()).unwrap();
    let response = router().oneshot(on_localhost(request)).await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        response.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/problem+json"
    );
    let allow = response
        .headers()
        .get(header::ALLOW)
        .unwrap()
        .to_str()
        .unwrap();
    for method in ["GET", "POST", "PATCH", "DELETE"] {
        assert!(allow.contains(method), "{allow}");
    }
}

#[tokio::test]
async fn an_out_of_range_ttl_is_a_400_problem() {
    let request = Request::post("/locks/jobs:1")
        .body(Body::from(r#"{"ttl_ms":0}"#))
        .unwrap();
    let answer = send(request).await;
    assert_problem(&answer, 400, "invalid-request");
}

#[tokio::test]
async fn an_acquire_is_granted_in_process() {
    let request = Request::post("/locks/jobs:1")
        .body(Body::from(r#"{"ttl_ms":1500}"#))
        .unwrap();
    let (status, content_type, body) = send(request).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(content_type, "application/json");
    assert_eq!(body["name"], "jobs:1");
    assert!(body["fence"].as_u64().unwrap() >= 1, "{body}");
}
