//! Browser requests (issue 28, item 1): a page of another origin cannot
//! take a lock, a DNS-rebinding page cannot reach a loopback lockd by its
//! own name, and the origins given with `--cors-allow-origin` get CORS.
//! Each refusal writes nothing: the lock stays free.

use std::net::SocketAddr;

use crate::support::TestApp;
use reqwest::Method;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const DASHBOARD: &str = "https://dash.example.com";

/// The `fetch` of the issue: a `text/plain` POST, which a browser sends
/// without a preflight, with the `headers` the browser adds.
async fn simple_post(app: &TestApp, name: &str, headers: &[(&str, &str)]) -> crate::support::Reply {
    let mut all = vec![("content-type", "text/plain")];
    all.extend_from_slice(headers);
    app.send(
        Method::POST,
        &format!("/locks/{name}"),
        &all,
        Some(br#"{"ttl_ms":60000}"#.to_vec()),
    )
    .await
}

async fn assert_free(app: &TestApp, name: &str) {
    app.inspect(name).await.expect_problem(404, "lock-not-held");
}

#[tokio::test]
async fn a_page_of_another_origin_cannot_take_a_lock() {
    let app = TestApp::memory().await;
    for (name, headers) in [
        (
            "x1",
            vec![
                ("origin", "http://evil.example"),
                ("sec-fetch-site", "cross-site"),
            ],
        ),
        ("x2", vec![("origin", "http://evil.example")]),
        // Another port of the same machine is another origin.
        ("x3", vec![("origin", "http://127.0.0.1:3000")]),
        ("x4", vec![("origin", "null")]),
        // A browser that sends Fetch Metadata but no Origin.
        ("x5", vec![("sec-fetch-site", "cross-site")]),
    ] {
        let refused = simple_post(&app, name, &headers).await;
        let problem = refused.expect_problem(403, "cross-origin");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("--cors-allow-origin"),
            "{problem}"
        );
        assert!(refused.header("access-control-allow-origin").is_none());
        assert_free(&app, name).await;
    }
    // curl and the clients send neither header, and are served as before.
    simple_post(&app, "x6", &[]).await.expect_status(201);
}

#[tokio::test]
async fn lockds_own_pages_and_same_site_navigation_are_served() {
    let app = TestApp::memory().await;
    let own = format!("http://{}", app.addr);
    simple_post(
        &app,
        "own",
        &[("origin", &own), ("sec-fetch-site", "same-origin")],
    )
    .await
    .expect_status(201);
    // A page served by lockd names it as the user typed it.
    let port = app.addr.port().to_string();
    let by_name = format!("http://localhost:{port}");
    app.send(
        Method::POST,
        "/locks/own2",
        &[("host", &format!("localhost:{port}")), ("origin", &by_name)],
        None,
    )
    .await
    .expect_status(201);
    // A typed URL (Sec-Fetch-Site: none) is the user's own request.
    app.send(Method::GET, "/docs", &[("sec-fetch-site", "none")], None)
        .await
        .expect_status(200);
}

#[tokio::test]
async fn an_allowed_origin_gets_cors_and_its_preflights_answered() {
    let app = TestApp::memory_with(|s| {
        s.listen.cors_allow_origins = vec![DASHBOARD.to_owned()];
    })
    .await;
    let preflight = app
        .send(
            Method::OPTIONS,
            "/locks/dash",
            &[
                ("origin", DASHBOARD),
                ("access-control-request-method", "DELETE"),
                ("access-control-request-headers", "lock-token, content-type"),
            ],
            None,
        )
        .await;
    assert!(preflight.status.is_success(), "{preflight:?}");
    assert_eq!(
        preflight.header("access-control-allow-origin").as_deref(),
        Some(DASHBOARD)
    );
    let methods = preflight
        .header("access-control-allow-methods")
        .unwrap()
        .to_ascii_uppercase();
    assert!(
        methods.contains("DELETE") && methods.contains("PATCH"),
        "{methods}"
    );
    let headers = preflight
        .header("access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        headers.contains("lock-token") && headers.contains("authorization"),
        "{headers}"
    );

    let granted = simple_post(
        &app,
        "dash",
        &[("origin", DASHBOARD), ("sec-fetch-site", "cross-site")],
    )
    .await;
    granted.expect_status(201);
    assert_eq!(
        granted.header("access-control-allow-origin").as_deref(),
        Some(DASHBOARD)
    );
    let exposed = granted
        .header("access-control-expose-headers")
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        exposed.contains("retry-after") && exposed.contains("x-request-id"),
        "{exposed}"
    );
    // A refusal below the check carries CORS too, so the page can read it.
    let held = simple_post(&app, "dash", &[("origin", DASHBOARD)]).await;
    held.expect_problem(409, "lock-held");
    assert_eq!(
        held.header("access-control-allow-origin").as_deref(),
        Some(DASHBOARD)
    );
    // Another origin's preflight is refused, and so is its request.
    let other = app
        .send(
            Method::OPTIONS,
            "/locks/dash2",
            &[
                ("origin", "https://evil.example"),
                ("access-control-request-method", "POST"),
            ],
            None,
        )
        .await;
    other.expect_problem(403, "cross-origin");
    assert!(other.header("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn a_rebinding_page_cannot_reach_a_loopback_lockd_by_its_own_name() {
    let app = TestApp::memory_with(|s| {
        s.listen.allowed_hosts = vec!["lockd.internal".to_owned()];
    })
    .await;
    let port = app.addr.port();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("10.1.2.3:{port}"),
    ] {
        let refused = app
            .send(
                Method::POST,
                "/locks/rebound",
                &[("host", &host), ("content-type", "text/plain")],
                Some(br#"{"ttl_ms":60000}"#.to_vec()),
            )
            .await;
        refused.expect_problem(421, "misdirected-request");
        assert_free(&app, "rebound").await;
    }
    for (i, host) in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("lockd.internal:{port}"),
        "LOCKD.INTERNAL".to_owned(),
    ]
    .iter()
    .enumerate()
    {
        app.send(
            Method::POST,
            &format!("/locks/named{i}"),
            &[("host", host)],
            None,
        )
        .await
        .expect_status(201);
    }
}

#[tokio::test]
async fn a_lockd_on_every_address_takes_any_host() {
    let app = TestApp::memory_with(|s| {
        s.listen.addr = "0.0.0.0:0".parse().unwrap();
        s.auth.insecure_no_auth = true;
    })
    .await;
    app.send(
        Method::POST,
        "/locks/any",
        &[("host", "lockd.example.com")],
        None,
    )
    .await
    .expect_status(201);
}

/// Sends `request` raw to `addr` and reads the status line's code.
async fn raw_status(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

#[tokio::test]
async fn an_http_1_1_request_without_one_host_is_a_400() {
    let app = TestApp::memory().await;
    let body = r#"{"ttl_ms":60000}"#;
    let len = body.len();
    for head in [
        String::new(),
        "Host: localhost\r\nHost: localhost\r\n".to_owned(),
        "Host: localhost\r\nHost: evil.example\r\n".to_owned(),
    ] {
        let (status, answer) = raw_status(
            app.addr,
            &format!(
                "POST /locks/hostless HTTP/1.1\r\n{head}Content-Type: application/json\r\n\
                 Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
            ),
        )
        .await;
        assert_eq!(status, 400, "{head:?}: {answer}");
        assert!(answer.contains("Host"), "{answer}");
        assert_free(&app, "hostless").await;
    }
    // HTTP/1.0 has no Host rule.
    let (status, answer) = raw_status(
        app.addr,
        &format!(
            "POST /locks/hostless HTTP/1.0\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n{body}"
        ),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
}

#[tokio::test]
async fn the_metrics_listener_answers_loopback_names_only() {
    let app = TestApp::memory_with(|s| {
        s.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let addr = app.metrics_addr.expect("metrics listener");
    let (status, answer) = raw_status(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 421, "{answer}");
    let (status, answer) = raw_status(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = raw_status(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn a_link_from_another_site_opens_a_page_and_nothing_else_gets_through() {
    let app = TestApp::memory().await;
    let navigate = |dest: &'static str| {
        vec![
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", dest),
        ]
    };
    // A dashboard's link to /docs: a top-level page its page cannot read.
    app.send(Method::GET, "/docs", &navigate("document"), None)
        .await
        .expect_status(200);
    // Framed (clickjacking), or sent as a POST: refused.
    app.send(Method::GET, "/docs", &navigate("iframe"), None)
        .await
        .expect_problem(403, "cross-origin");
    app.send(Method::POST, "/locks/nav", &navigate("document"), None)
        .await
        .expect_problem(403, "cross-origin");
    // Every value of a repeated or listed Sec-Fetch-Site counts.
    for site in ["cross-site, same-origin", "\"cross-site\""] {
        app.send(
            Method::POST,
            "/locks/nav",
            &[("sec-fetch-site", site)],
            None,
        )
        .await
        .expect_problem(403, "cross-origin");
    }
    assert_free(&app, "nav").await;
}

#[tokio::test]
async fn tricks_a_browser_cannot_play_are_refused_too() {
    let app = TestApp::memory().await;
    let own = format!("http://{}", app.addr);
    let (status, answer) = raw_status(
        app.addr,
        &format!(
            "POST /locks/two HTTP/1.1\r\nHost: {}\r\nOrigin: {own}\r\nOrigin: http://evil.example\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
            app.addr
        ),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    // An absolute-form target names the host; its Host is not looked at.
    let (status, answer) = raw_status(
        app.addr,
        &format!(
            "POST http://evil.example/locks/two HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n",
            app.addr
        ),
    )
    .await;
    assert_eq!(status, 421, "{answer}");
    assert_free(&app, "two").await;
}

#[tokio::test]
async fn behind_a_proxy_that_serves_https_lockds_own_pages_still_call_it() {
    let app = TestApp::memory_with(|s| {
        s.listen.addr = "0.0.0.0:0".parse().unwrap();
        s.auth.insecure_no_auth = true;
    })
    .await;
    app.send(
        Method::POST,
        "/locks/proxied",
        &[
            ("host", "lockd.example.com"),
            ("origin", "https://lockd.example.com"),
        ],
        None,
    )
    .await
    .expect_status(201);
}

#[tokio::test]
async fn the_metrics_listener_serves_the_allowed_origins_too() {
    let app = TestApp::memory_with(|s| {
        s.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
        s.listen.cors_allow_origins = vec![DASHBOARD.to_owned()];
    })
    .await;
    let addr = app.metrics_addr.expect("metrics listener");
    let (status, answer) = raw_status(
        addr,
        &format!(
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {DASHBOARD}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains(&format!("access-control-allow-origin: {DASHBOARD}")),
        "{answer}"
    );
}
