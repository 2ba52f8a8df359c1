//! The committed `openapi/openapi.json` must equal what the running service
//! serves at `/openapi.json`. When this fails after an API change,
//! regenerate the file: `cargo run -- openapi > openapi/openapi.json`.

use std::sync::Arc;
use std::time::Duration;

use lockd::app::Application;
use lockd::config::Settings;
use lockd::lock::Ttl;
use lockd::lock::memory::MemoryBackend;

/// The document a lockd built with `settings` serves at `/openapi.json`;
/// the server is stopped once it is read.
async fn served_document(settings: &Settings) -> serde_json::Value {
    let app = Application::with_backend(settings, Arc::new(MemoryBackend::new()))
        .await
        .expect("app builds");
    let addr = app.local_addr().expect("bound");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    let served = reqwest::get(format!("http://{addr}/openapi.json"))
        .await
        .expect("request")
        .json()
        .await
        .expect("JSON");
    let _ = stop.send(());
    server.await.expect("server task").expect("server ran");
    served
}

#[tokio::test]
async fn served_openapi_matches_the_committed_spec() {
    let mut settings = Settings::default();
    settings.listen.addr = "127.0.0.1:0".parse().expect("address");
    let served = served_document(&settings).await;
    let committed_text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.json"),
    )
    .expect("openapi/openapi.json exists");
    let committed: serde_json::Value =
        serde_json::from_str(&committed_text).expect("committed spec is JSON");
    assert!(
        served == committed,
        "openapi/openapi.json is stale: run `cargo run -- openapi > openapi/openapi.json`"
    );

    // Every operation documents its error answers with the problem schema:
    // those that take a body, 415 for a compressed one; all of them, 500
    // when Redis refuses the operation.
    let problem = "#/components/schemas/Problem";
    let paths = served["paths"].as_object().expect("paths");
    let lock_ops = paths["/locks/{name}"].as_object().expect("lock route");
    assert_eq!(lock_ops.len(), 4, "GET, POST, PATCH, DELETE");
    for (method, op) in lock_ops {
        let responses = op["responses"].as_object().expect("responses");
        let with_body = method != "get";
        let statuses = ["400", "415", "500", "503"];
        for status in statuses.iter().filter(|s| with_body || **s != "415") {
            let schema = &responses
                .get(*status)
                .unwrap_or_else(|| panic!("{method} does not document {status}"))["content"]["application/problem+json"]
                ["schema"]["$ref"];
            assert_eq!(schema, problem, "{method} {status}");
        }
    }
}

/// The served document states this server's own limits: the maxima of
/// `ttl_ms` and `wait_ms` are `--max-ttl-ms` and `--max-wait-ms` (examples
/// above them lowered), and PATCH and DELETE require the `Lock-Token`
/// header, so that a request valid per the document is one lockd takes.
#[tokio::test]
async fn served_openapi_states_this_servers_maxima_and_required_token() {
    let mut settings = Settings::default();
    settings.listen.addr = "127.0.0.1:0".parse().expect("address");
    settings.limits.default_ttl = Ttl::new(10_000).expect("a TTL");
    settings.limits.max_ttl = Ttl::new(20_000).expect("a TTL");
    settings.limits.max_wait = Duration::from_millis(200);
    let served = served_document(&settings).await;
    let schemas = &served["components"]["schemas"];
    for (body, field, max) in [
        ("AcquireBody", "ttl_ms", 20_000),
        ("AcquireBody", "wait_ms", 200),
        ("ExtendBody", "ttl_ms", 20_000),
    ] {
        let schema = &schemas[body]["properties"][field];
        assert_eq!(schema["maximum"], max, "{body}.{field}: {schema}");
        // The examples (30000 and 5000 by default) are lowered to fit.
        assert_eq!(schema["example"], max, "{body}.{field}: {schema}");
    }
    // An extend needs the token; a DELETE too, unless it is an admin's
    // break (`force=true`), which takes none.
    let lock_ops = &served["paths"]["/locks/{name}"];
    for (method, required) in [("patch", true), ("delete", false)] {
        let parameters = lock_ops[method]["parameters"].as_array().expect("params");
        let header = parameters
            .iter()
            .find(|p| p["name"] == "Lock-Token")
            .unwrap_or_else(|| panic!("{method} has no Lock-Token"));
        assert_eq!(header["required"], required, "{method}: {header}");
        assert_eq!(
            header["schema"]["$ref"], "#/components/schemas/LockToken",
            "{method}: {header}"
        );
    }
}

/// Every operation of `doc`, as (path, method, operation).
fn operations(doc: &serde_json::Value) -> Vec<(String, String, serde_json::Value)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .iter()
                .map(|(method, op)| (path.clone(), method.clone(), op.clone()))
        })
        .collect()
}

/// What client generators read (issue 31): an `operationId` unique to each
/// operation, the headers each answer carries, `security: []` on the
/// endpoints that need no key, optional bodies as optional objects (not
/// `oneOf [null, …]`), `format: date-time` on every timestamp, and a
/// server to call.
#[tokio::test]
async fn served_openapi_reads_right_in_client_generators() {
    let mut settings = Settings::default();
    settings.listen.addr = "127.0.0.1:0".parse().expect("address");
    let served = served_document(&settings).await;
    let ops = operations(&served);
    assert!(ops.len() >= 22, "{} operations", ops.len());

    let mut ids = std::collections::BTreeSet::new();
    for (path, method, op) in &ops {
        let id = op["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
        assert!(
            ids.insert(id.to_owned()),
            "{method} {path}: operationId {id} repeated"
        );

        for (status, response) in op["responses"].as_object().expect("responses") {
            let headers = &response["headers"];
            assert!(
                headers["x-request-id"].is_object(),
                "{method} {path} {status}: {response}"
            );
            if ["409", "429", "503"].contains(&status.as_str()) {
                assert_eq!(
                    headers["Retry-After"]["schema"]["type"], "integer",
                    "{method} {path} {status}"
                );
            }
            if status == "401" {
                assert!(
                    headers["WWW-Authenticate"].is_object(),
                    "{method} {path} 401"
                );
            }
        }

        let open = ["/healthz", "/readyz", "/openapi.json"].contains(&path.as_str());
        let security = op["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path}: no security"));
        assert_eq!(
            security.is_empty(),
            open,
            "{method} {path}: security {security:?}"
        );

        if let Some(body) = op.get("requestBody") {
            let schema = &body["content"]["application/json"]["schema"];
            assert!(
                schema.get("oneOf").is_none(),
                "{method} {path}: body {schema}"
            );
            assert!(schema["$ref"].is_string(), "{method} {path}: body {schema}");
        }
    }
    for id in [
        "listLocks",
        "listSemaphores",
        "inspectLock",
        "inspectSemaphore",
        "inspectRun",
        "releaseLock",
        "watchLock",
    ] {
        assert!(ids.contains(id), "no operation {id}: {ids:?}");
    }
    // Release needs no body: its token may come in `Lock-Token`.
    assert_eq!(
        served["paths"]["/locks/{name}"]["delete"]["requestBody"]["required"],
        false
    );

    // Every `*_at` string of every schema is a date-time.
    let mut timestamps = 0;
    let mut stack: Vec<&serde_json::Value> = vec![&served["components"]["schemas"]];
    while let Some(value) = stack.pop() {
        if let Some(properties) = value.get("properties").and_then(|p| p.as_object()) {
            for (field, property) in properties {
                if field.ends_with("_at") {
                    timestamps += 1;
                    assert_eq!(property["format"], "date-time", "{field}: {property}");
                }
            }
        }
        match value {
            serde_json::Value::Object(map) => stack.extend(map.values()),
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    assert!(timestamps >= 20, "{timestamps} timestamps");

    // Each watch's events as they are on the wire: `{event, id, data}`,
    // `data` a JSON string whose schema is its `contentSchema`.
    let mut streams = 0;
    for (path, method, op) in &ops {
        let Some(stream) = op["responses"]["200"]["content"].get("text/event-stream") else {
            continue;
        };
        streams += 1;
        let name = stream["schema"]["$ref"]
            .as_str()
            .expect("a $ref")
            .rsplit('/')
            .next()
            .unwrap();
        let events = served["components"]["schemas"][name]["oneOf"]
            .as_array()
            .expect("oneOf");
        assert!(events.len() >= 5, "{method} {path}: {events:?}");
        for event in events {
            assert_eq!(
                event["required"],
                serde_json::json!(["event", "id", "data"]),
                "{event}"
            );
            assert_eq!(
                event["properties"]["event"]["enum"]
                    .as_array()
                    .map(Vec::len),
                Some(1)
            );
            assert_eq!(
                event["properties"]["data"]["contentMediaType"],
                "application/json"
            );
            assert!(
                event["properties"]["data"]["contentSchema"]["$ref"].is_string(),
                "{event}"
            );
        }
        let wait = op["parameters"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "wait_ms"));
        assert!(wait.is_some(), "{method} {path}: no wait_ms");
    }
    assert_eq!(streams, 3);

    let servers = served["servers"].as_array().expect("servers");
    assert!(servers.iter().any(|s| s["url"].is_string()), "{servers:?}");
}

/// `Problem.type` lists every problem type, docs/api.md's table of them
/// included, and each problem answer names the types it carries
/// (`x-problem-types`): the refusals a client meets, made here through
/// HTTP, each carry a type its answer names.
#[tokio::test]
async fn each_problem_answer_names_the_problem_types_it_carries() {
    let mut settings = Settings::default();
    settings.listen.addr = "127.0.0.1:0".parse().expect("address");
    let app = Application::with_backend(&settings, Arc::new(MemoryBackend::new()))
        .await
        .expect("app builds");
    let addr = app.local_addr().expect("bound");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let doc: serde_json::Value = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("JSON");

    let listed: std::collections::BTreeSet<String> =
        doc["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]
            .as_array()
            .expect("Problem.type lists its values")
            .iter()
            .map(|v| v.as_str().expect("a URI").to_owned())
            .collect();
    let api_md = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api.md"),
    )
    .expect("docs/api.md");
    let documented: std::collections::BTreeSet<String> = api_md
        .lines()
        .filter_map(|l| l.strip_prefix("| `urn:lockd:problem:"))
        .filter_map(|l| l.split('`').next())
        .map(|slug| format!("urn:lockd:problem:{slug}"))
        .collect();
    assert!(documented.len() >= 30, "{documented:?}");
    assert_eq!(listed, documented, "Problem.type against docs/api.md");

    // Every problem answer of every operation names at least one type.
    for (path, method, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().expect("responses") {
            if response["content"]
                .get("application/problem+json")
                .is_some()
            {
                let types = response["x-problem-types"].as_array();
                assert!(
                    types.is_some_and(|t| !t.is_empty()),
                    "{method} {path} {status}: {response}"
                );
            }
        }
    }

    let token = || "t".repeat(24) + &format!("{:08}", rand_suffix());
    type Case = (
        reqwest::Method,
        &'static str,
        String,
        Vec<(&'static str, String)>,
        String,
    );
    let send = |(method, template, path, headers, body): Case| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let mut request = http
                .request(method.clone(), format!("{base}{path}"))
                .body(body);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let answer = request.send().await.expect("request");
            let status = answer.status().as_u16();
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            (method, template, status, body)
        }
    };
    use reqwest::Method as M;
    let held = send((
        M::POST,
        "/locks/{name}",
        "/locks/p:held".into(),
        vec![],
        String::new(),
    ))
    .await;
    assert_eq!(held.2, 201, "{}", held.3);
    let holder = held.3["token"].as_str().expect("token").to_owned();
    let permit = send((
        M::POST,
        "/semaphores/{name}",
        "/semaphores/p:s".into(),
        vec![],
        r#"{"limit":1}"#.into(),
    ))
    .await;
    assert_eq!(permit.2, 201, "{}", permit.3);
    let run = send((
        M::POST,
        "/runs/{key}",
        "/runs/p:r".into(),
        vec![],
        r#"{"fingerprint":"a"}"#.into(),
    ))
    .await;
    assert_eq!(run.2, 201, "{}", run.3);

    let cases: Vec<(Case, &str)> = vec![
        (
            (
                M::POST,
                "/locks/{name}",
                "/locks/p:held".into(),
                vec![],
                String::new(),
            ),
            "lock-held",
        ),
        (
            (
                M::POST,
                "/locks/{name}",
                "/locks/p:held".into(),
                vec![("Lock-Token", holder.clone())],
                r#"{"mode":"shared"}"#.into(),
            ),
            "mode-mismatch",
        ),
        (
            (
                M::DELETE,
                "/locks/{name}",
                "/locks/p:held".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "not-lock-owner",
        ),
        (
            (
                M::PATCH,
                "/locks/{name}",
                "/locks/p:held".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "not-lock-owner",
        ),
        (
            (
                M::PATCH,
                "/locks/{name}",
                "/locks/p:free".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "lock-not-held",
        ),
        (
            (
                M::DELETE,
                "/locks/{name}",
                "/locks/p:free".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "lock-not-held",
        ),
        (
            (
                M::GET,
                "/locks/{name}",
                "/locks/p:free".into(),
                vec![],
                String::new(),
            ),
            "lock-not-held",
        ),
        (
            (
                M::POST,
                "/locks/{name}",
                "/locks/p:bad".into(),
                vec![],
                "[]".into(),
            ),
            "invalid-request",
        ),
        (
            (
                M::POST,
                "/locks/{name}",
                "/locks/p:bad".into(),
                vec![("Content-Encoding", "gzip".into())],
                "{}".into(),
            ),
            "unsupported-media-type",
        ),
        (
            (
                M::POST,
                "/semaphores/{name}",
                "/semaphores/p:s".into(),
                vec![],
                r#"{"limit":1}"#.into(),
            ),
            "semaphore-full",
        ),
        (
            (
                M::POST,
                "/semaphores/{name}",
                "/semaphores/p:s".into(),
                vec![],
                r#"{"limit":2}"#.into(),
            ),
            "limit-mismatch",
        ),
        (
            (
                M::GET,
                "/semaphores/{name}",
                "/semaphores/p:free".into(),
                vec![],
                String::new(),
            ),
            "semaphore-free",
        ),
        (
            (
                M::DELETE,
                "/semaphores/{name}",
                "/semaphores/p:s".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "permit-not-held",
        ),
        (
            (
                M::PATCH,
                "/semaphores/{name}",
                "/semaphores/p:s".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "permit-not-held",
        ),
        (
            (
                M::POST,
                "/runs/{key}",
                "/runs/p:r".into(),
                vec![],
                r#"{"fingerprint":"a"}"#.into(),
            ),
            "run-in-progress",
        ),
        (
            (
                M::POST,
                "/runs/{key}",
                "/runs/p:r".into(),
                vec![],
                r#"{"fingerprint":"b"}"#.into(),
            ),
            "fingerprint-mismatch",
        ),
        (
            (
                M::PATCH,
                "/runs/{key}",
                "/runs/p:r".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "not-run-owner",
        ),
        (
            (
                M::DELETE,
                "/runs/{key}",
                "/runs/p:r".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "not-run-owner",
        ),
        (
            (
                M::GET,
                "/runs/{key}",
                "/runs/p:none".into(),
                vec![],
                String::new(),
            ),
            "run-not-found",
        ),
        (
            (
                M::PATCH,
                "/runs/{key}",
                "/runs/p:none".into(),
                vec![("Lock-Token", token())],
                String::new(),
            ),
            "run-not-found",
        ),
    ];
    assert!(cases.len() >= 20);
    for (case, slug) in cases {
        let (method, template, status, body) = send(case).await;
        let uri = format!("urn:lockd:problem:{slug}");
        assert_eq!(body["type"], uri, "{method} {template}: {status} {body}");
        let response = &doc["paths"][template][method.as_str().to_lowercase()]["responses"]
            [status.to_string()];
        let named = response["x-problem-types"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            named.iter().any(|t| *t == uri),
            "{method} {template} {status} carried {uri}, its answer names {named:?}"
        );
    }
    let _ = stop.send(());
    server.await.expect("server task").expect("server ran");
}

/// A number that differs from call to call, for distinct tokens.
fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Each operation's 405 names, in its `Allow` header's example, the
/// methods its path takes: what lockd answers to a method the path does
/// not take (issue 31), path by path.
#[tokio::test]
async fn each_405_in_the_document_gives_the_allow_header_lockd_sends() {
    let app = crate::support::TestApp::memory().await;
    let doc: serde_json::Value = serde_json::from_str(
        &app.send(reqwest::Method::GET, "/openapi.json", &[], None)
            .await
            .text,
    )
    .expect("JSON");
    let mut checked = 0;
    for (path, method, op) in operations(&doc) {
        let refusal = &op["responses"]["405"];
        let documented = refusal["headers"]["Allow"]["schema"]["examples"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: a 405 with Allow: {refusal}"));
        let concrete = path
            .replace("{name}", "docs-405")
            .replace("{key}", "docs-405");
        let other = ["PUT", "POST", "DELETE", "PATCH", "GET"]
            .into_iter()
            .find(|m| !documented.split(',').any(|d| d == *m))
            .expect("a method the path does not take");
        let reply = app
            .send(other.parse().expect("method"), &concrete, &[], None)
            .await;
        assert_eq!(reply.status, 405, "{other} {concrete}: {}", reply.text);
        assert_eq!(
            reply.headers.get("allow").and_then(|v| v.to_str().ok()),
            Some(documented),
            "{other} {concrete}"
        );
        checked += 1;
    }
    assert!(checked >= 20, "{checked} operations");
}
