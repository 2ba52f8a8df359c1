//! Input that a lenient parser would take in some patched form, refused
//! instead with a 400 problem document that writes nothing: bytes that are
//! not UTF-8 once percent-decoded, a transfer coding other than `chunked`,
//! a `#fragment` in the request target, and a JSON body with a key given
//! twice. The framing cases are sent raw over a `TcpStream`, since an HTTP
//! client would normalise them away.

use std::time::Duration;

use crate::support::{PROBLEM_JSON, TestApp};
use reqwest::Method;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// An answer read off a raw connection.
#[derive(Debug)]
struct RawReply {
    status: u16,
    /// The head, lower-cased, for header checks.
    head: String,
    body: String,
}

impl RawReply {
    /// Asserts a 400 `invalid-request` problem document whose detail
    /// contains `needle`, and returns the detail.
    #[track_caller]
    fn expect_invalid(&self, needle: &str) -> String {
        assert_eq!(self.status, 400, "{self:?}");
        assert!(
            self.head.contains(&format!("content-type: {PROBLEM_JSON}")),
            "{self:?}"
        );
        let body: Value = serde_json::from_str(&self.body).unwrap();
        assert_eq!(body["type"], "urn:lockd:problem:invalid-request", "{body}");
        let detail = body["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
        detail
    }
}

/// A raw HTTP/1.1 connection to `app`.
async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.addr).await.unwrap()
}

/// Sends `request` as is and reads one answer (its body by
/// `Content-Length`), leaving the connection open for the next.
async fn exchange(stream: &mut TcpStream, request: &str) -> RawReply {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]);
                    let status = head[9..12].parse().unwrap();
                    return RawReply {
                        status,
                        head,
                        body: body.into_owned(),
                    };
                }
            }
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed mid-answer: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("an answer within 5 s")
}

/// One request on a fresh connection.
async fn once(app: &TestApp, request: &str) -> RawReply {
    exchange(&mut connect(app).await, request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_utf8_once_percent_decoded_are_refused() {
    let app = TestApp::redis().await;
    for path in [
        "/locks/utf:a?owner=%FF%FE",
        "/locks/utf:a?ttl_ms=1000&owner=ok%C3",
        "/locks/utf:a?wait_ms=%FF",
        "/locks/utf:a?%FF=1",
        "/locks/%FF%FE",
        "/locks/utf:%C3",
    ] {
        let r = app.send(Method::POST, path, &[], None).await;
        let problem = r.expect_problem(400, "invalid-request");
        assert!(
            problem["detail"].as_str().unwrap().contains("UTF-8"),
            "{path}: {problem}"
        );
    }
    app.send(Method::GET, "/healthz?x=%FF", &[], None)
        .await
        .expect_problem(400, "invalid-request");
    assert_eq!(app.lock_key_count().await, 0, "a refused request wrote");

    // UTF-8 that is percent-encoded is taken, and stored as sent.
    app.send(
        Method::POST,
        "/locks/utf:a?owner=caf%C3%A9+au+lait",
        &[],
        None,
    )
    .await
    .expect_status(201);
    assert_eq!(app.inspect("utf:a").await.str("owner"), "café au lait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coding_other_than_plain_chunked_is_refused() {
    let app = TestApp::redis().await;
    let body = r#"{"ttl_ms":5000}"#;
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for coding in ["gzip, chunked", "identity, chunked", "chunked, chunked"] {
        let request = format!(
            "POST /locks/te:a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: {coding}\r\n\r\n{chunked}"
        );
        let r = once(&app, &request).await;
        r.expect_invalid("chunked");
        assert!(r.head.contains("connection: close"), "{coding}: {r:?}");
    }
    // Two Transfer-Encoding fields are two codings.
    let request = format!(
        "POST /locks/te:a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"
    );
    once(&app, &request).await.expect_invalid("chunked");
    assert_eq!(app.lock_key_count().await, 0, "a refused request wrote");

    // `chunked` alone is served.
    let request = format!(
        "POST /locks/te:a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: Chunked\r\n\r\n{chunked}"
    );
    let r = once(&app, &request).await;
    assert_eq!(r.status, 201, "{r:?}");
    let (_, pttl) = app.holder("te:a").await.unwrap();
    assert!(pttl <= 5000, "the body was not read: PTTL {pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragment_in_the_request_target_is_refused() {
    let app = TestApp::redis().await;
    for target in [
        "/locks/frag:a#x",
        "/locks/frag:a?ttl_ms=1000#x",
        "/locks/frag:a#",
    ] {
        let request =
            format!("POST {target} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
        once(&app, &request).await.expect_invalid("fragment");
    }
    once(&app, "GET /healthz#top HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect_invalid("fragment");
    assert_eq!(app.lock_key_count().await, 0, "a refused request wrote");

    // On a keep-alive connection, after requests with bodies of both
    // framings (whose bytes hold a `#` too), the right request is refused.
    let mut stream = connect(&app).await;
    let body = r##"{"ttl_ms":30000,"owner":"build #7"}"##;
    let grant = exchange(
        &mut stream,
        &format!(
            "POST /locks/frag:b HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert_eq!(grant.status, 201, "{grant:?}");
    let token = serde_json::from_str::<Value>(&grant.body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let extend = r##"{"ttl_ms":20000}"##;
    let extended = exchange(
        &mut stream,
        &format!(
            "PATCH /locks/frag:b HTTP/1.1\r\nHost: localhost\r\nLock-Token: {token}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{extend}\r\n0\r\n\r\n",
            extend.len()
        ),
    )
    .await;
    assert_eq!(extended.status, 200, "{extended:?}");
    exchange(
        &mut stream,
        &format!(
            "DELETE /locks/frag:b#x HTTP/1.1\r\nHost: localhost\r\nLock-Token: {token}\r\n\r\n"
        ),
    )
    .await
    .expect_invalid("fragment");
    assert_eq!(
        app.holder_token("frag:b").await.as_deref(),
        Some(token.as_str()),
        "a refused release wrote"
    );
    let released = exchange(
        &mut stream,
        &format!("DELETE /locks/frag:b HTTP/1.1\r\nHost: localhost\r\nLock-Token: {token}\r\n\r\n"),
    )
    .await;
    assert_eq!(released.status, 204, "{released:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_key_given_twice_is_refused_naming_the_key() {
    let app = TestApp::redis().await;
    let json = [("Content-Type", "application/json")];
    for body in [
        r#"{"ttl_ms":1000,"ttl_ms":2000}"#,
        r#"{"owner":"a","ttl_ms":1000,"owner":"b"}"#,
    ] {
        let r = app
            .send(Method::POST, "/locks/dup:a", &json, Some(body.into()))
            .await;
        let problem = r.expect_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("duplicate key `"), "{body}: {detail}");
        let key = if body.contains("owner\":\"b") {
            "owner"
        } else {
            "ttl_ms"
        };
        assert!(detail.contains(&format!("`{key}`")), "{body}: {detail}");
    }
    assert_eq!(app.lock_key_count().await, 0, "a refused acquire wrote");

    // Extend and release bodies too, even with the same value twice.
    let grant = app.acquire_ttl("dup:b", 30_000).await;
    grant.expect_status(201);
    let token = grant.token();
    let lock_token = [("Lock-Token", token.as_str()), json[0]];
    let r = app
        .send(
            Method::PATCH,
            "/locks/dup:b",
            &lock_token,
            Some(br#"{"ttl_ms":1000,"ttl_ms":1000}"#.to_vec()),
        )
        .await;
    assert!(
        r.expect_problem(400, "invalid-request")["detail"]
            .as_str()
            .unwrap()
            .contains("duplicate key `ttl_ms`"),
        "{}",
        r.text
    );
    let (_, pttl) = app.holder("dup:b").await.unwrap();
    assert!(pttl > 20_000, "a refused extend wrote: PTTL {pttl}");
    let twice = format!(r#"{{"token":"{token}","token":"{token}"}}"#);
    let r = app
        .send(Method::DELETE, "/locks/dup:b", &json, Some(twice.into()))
        .await;
    assert!(
        r.expect_problem(400, "invalid-request")["detail"]
            .as_str()
            .unwrap()
            .contains("duplicate key `token`"),
        "{}",
        r.text
    );
    assert_eq!(app.holder_token("dup:b").await, Some(token));
}

#[tokio::test]
async fn a_malformed_percent_escape_in_the_query_is_refused() {
    let app = TestApp::memory().await;
    for query in [
        "owner=%",
        "owner=%G0",
        "owner=a%2",
        "ttl_ms=1000&owner=%2",
        "%=1",
    ] {
        let path = format!("/locks/esc?{query}");
        let r = app.send(Method::POST, &path, &[], None).await;
        let problem = r.expect_problem(400, "invalid-request");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("percent-escape"),
            "{path}: {problem}"
        );
        app.inspect("esc")
            .await
            .expect_problem(404, "lock-not-held");
    }
    // `%25` is a literal `%`.
    let granted = app
        .send(Method::POST, "/locks/esc?owner=100%25", &[], None)
        .await;
    granted.expect_status(201);
    assert_eq!(app.inspect("esc").await.str("owner"), "100%");
}

#[tokio::test]
async fn a_slash_in_a_name_is_a_400_that_names_the_rule() {
    let app = TestApp::memory().await;
    for path in [
        "/locks/a/b",
        "/locks/a/b/c",
        "/semaphores/a/b",
        "/locks/a/",
        "/locks/a/b/events",
    ] {
        for method in [Method::POST, Method::GET, Method::DELETE] {
            let r = app.send(method.clone(), path, &[], None).await;
            let problem = r.expect_problem(400, "invalid-request");
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap()
                    .contains("cannot contain `/`"),
                "{method} {path}: {problem}"
            );
        }
    }
    app.inspect("a").await.expect_problem(404, "lock-not-held");
    // The sub-resources are routes still.
    let watch = TestApp::client_with_timeout(std::time::Duration::from_secs(5))
        .get(app.url("/locks/a/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
}

#[tokio::test]
async fn a_refused_value_says_what_is_allowed_and_names_its_field() {
    let app = TestApp::memory().await;
    let says = |reply: crate::support::Reply, words: &str| {
        let problem = reply.expect_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(words), "{detail}");
        assert!(
            !detail.contains("u64") && !detail.contains("Failed to"),
            "{detail}"
        );
    };
    for (body, words) in [
        (
            r#"{"ttl_ms": -1}"#,
            "ttl_ms must be an integer number of milliseconds from 1 to",
        ),
        (
            r#"{"ttl_ms": "5"}"#,
            "ttl_ms must be an integer number of milliseconds from 1 to",
        ),
        (
            r#"{"ttl_ms": 1000, "wait_ms": 1.5}"#,
            "wait_ms must be an integer number of milliseconds from 0 to",
        ),
        (r#"{"owner": 5}"#, "`owner`"),
    ] {
        let r = app
            .send(
                Method::POST,
                "/locks/msg",
                &[],
                Some(body.as_bytes().to_vec()),
            )
            .await;
        says(r, words);
    }
    let r = app
        .send(
            Method::POST,
            "/semaphores/msg",
            &[],
            Some(br#"{"limit": -1}"#.to_vec()),
        )
        .await;
    says(r, "limit must be an integer from 1 to");
    let r = app
        .send(Method::POST, "/locks/msg?ttl_ms=1&ttl_ms=2", &[], None)
        .await;
    says(r, "the query parameter `ttl_ms` is given twice");
    let r = app
        .send(Method::POST, "/locks/msg?colour=red", &[], None)
        .await;
    says(r, "unknown query parameter `colour`; this route takes");
    app.inspect("msg")
        .await
        .expect_problem(404, "lock-not-held");
}
