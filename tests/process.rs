//! The `lockd` binary as an operator runs it: logs, secrets, signals.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{RedisServer, free_port, random_token};

/// Starts `lockd serve` with `args` and waits until `/healthz` answers.
async fn start_lockd(args: &[&str], log: &str) -> (Child, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .arg("serve")
        .args(["--listen", &listen])
        .args(args)
        .env("LOCKD_LOG", log)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockd");
    let base = format!("http://{listen}");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if reqwest::get(format!("{base}/healthz")).await.is_ok() {
            return (child, base);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("lockd did not answer /healthz within 20 s");
}

/// Sends SIGTERM, waits for the exit, and returns the exit code and stderr.
fn terminate(mut child: Child) -> (Option<i32>, String) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait for lockd") {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "lockd did not exit within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut logs = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut logs)
        .expect("read logs");
    (exit.code(), logs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_never_show_tokens_or_the_redis_password_and_sigterm_exits_0() {
    let redis = RedisServer::spawn().await;
    let password = format!("pw-{}", random_token());
    redis
        .cmd::<()>(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("requirepass")
                .arg(&password),
        )
        .await;
    let url = format!("redis://:{password}@127.0.0.1:{}", redis.port());
    let (child, base) = start_lockd(&["--redis-url", &url], "trace").await;
    let http = reqwest::Client::new();

    let mut tokens = Vec::new();
    let grant: serde_json::Value = http
        .post(format!("{base}/locks/logs:a?ttl_ms=5000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = grant["token"].as_str().expect("a token").to_owned();
    tokens.push(token.clone());
    let chosen = random_token();
    tokens.push(chosen.clone());
    let steps = [
        http.post(format!("{base}/locks/logs:b"))
            .body(format!(r#"{{"token":"{chosen}","ttl_ms":5000}}"#)),
        http.patch(format!("{base}/locks/logs:a"))
            .header("Lock-Token", &token),
        http.get(format!("{base}/locks/logs:a")),
        // Refused requests must not log the token either.
        http.delete(format!("{base}/locks/logs:a?token={token}")),
        http.delete(format!("{base}/locks/logs:b"))
            .header("Lock-Token", &token),
        http.delete(format!("{base}/locks/logs:a"))
            .header("Lock-Token", &token),
        http.delete(format!("{base}/locks/logs:b"))
            .body(format!(r#"{{"token":"{chosen}"}}"#)),
    ];
    let mut statuses = Vec::new();
    for step in steps {
        statuses.push(step.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [201, 200, 200, 400, 409, 204, 204]);

    // Errors are logged too: Redis goes away, the answer is 503.
    redis.stop();
    let down = http
        .post(format!("{base}/locks/logs:c"))
        .send()
        .await
        .unwrap();
    assert_eq!(down.status().as_u16(), 503);

    let (code, logs) = terminate(child);
    assert_eq!(code, Some(0), "lockd must exit 0 on SIGTERM; logs:\n{logs}");
    assert!(
        logs.contains("lockd listening"),
        "no logs captured:\n{logs}"
    );
    assert!(
        logs.contains("unavailable"),
        "the outage was not logged:\n{logs}"
    );
    for secret in tokens.iter().chain([&password]) {
        assert!(
            !logs.contains(secret.as_str()),
            "a secret is in the logs:\n{logs}"
        );
    }
}

#[tokio::test]
async fn dev_mode_warns_that_locks_are_not_shared() {
    let (child, base) = start_lockd(&["--dev"], "info").await;
    let grant = reqwest::Client::new()
        .post(format!("{base}/locks/dev:k"))
        .send()
        .await
        .unwrap();
    assert_eq!(grant.status().as_u16(), 201);
    let (code, logs) = terminate(child);
    assert_eq!(code, Some(0));
    assert!(logs.contains("NOT shared"), "no dev-mode warning:\n{logs}");
}

#[tokio::test]
async fn lockd_dev_takes_boolish_values_from_the_environment() {
    for (value, dev) in [("1", true), ("yes", true), ("on", true), ("0", false)] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockd"))
            .args(["serve", "--listen", "127.0.0.1:0", "--redis-url"])
            .arg("redis://127.0.0.1:1")
            .env("LOCKD_DEV", value)
            .env("LOCKD_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lockd");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let exited = child.try_wait().expect("poll lockd");
        assert!(
            exited.is_none(),
            "LOCKD_DEV={value}: lockd exited {exited:?}"
        );
        let (code, logs) = terminate(child);
        assert_eq!(code, Some(0));
        assert_eq!(
            logs.contains("NOT shared"),
            dev,
            "LOCKD_DEV={value}:\n{logs}"
        );
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_cannot_hold_shutdown() {
    use tokio::io::AsyncWriteExt as _;
    let (child, base) = start_lockd(&["--dev", "--shutdown-timeout-ms", "1500"], "info").await;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stalled
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n")
        .await
        .expect("send half a request");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (code, logs) = tokio::task::spawn_blocking(move || terminate(child))
        .await
        .expect("join");
    assert_eq!(code, Some(0), "{logs}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500) + Duration::from_secs(3),
        "shutdown took {took:?}"
    );
    drop(stalled);
}

#[test]
fn a_bad_setting_exits_2_with_a_clear_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["serve", "--default-ttl-ms", "5000", "--max-ttl-ms", "1000"])
        .output()
        .expect("run lockd");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("default_ttl_ms"), "{stderr}");
}

/// A Redis password given in other forms than the URL's userinfo never
/// reaches stderr either: as a `?password=` query, or in a TOML file whose
/// syntax error quotes the line. A Redis that refuses the password makes
/// `/readyz` answer 503 (not ready), like a Redis that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_forms_of_the_redis_password_stay_out_of_stderr_and_a_refused_password_is_not_ready()
{
    let redis = RedisServer::spawn().await;
    let password = format!("pw-{}", random_token());
    redis
        .cmd::<()>(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("requirepass")
                .arg(&password),
        )
        .await;

    // A query-string password (which the Redis client does not use: the
    // server refuses lockd, and readiness says so).
    let url = format!("redis://127.0.0.1:{}/0?password={password}", redis.port());
    let (child, base) = start_lockd(&["--redis-url", &url], "debug").await;
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let (code, logs) = terminate(child);
    assert_eq!(code, Some(0));
    assert!(!logs.contains(&password), "password in the logs:\n{logs}");
    assert!(logs.contains("password=***"), "no redacted URL:\n{logs}");

    // A TOML syntax error on the line with the URL.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        format!(
            "redis_url = \"redis://:{password}@127.0.0.1:{}\n",
            redis.port()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .expect("run lockd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains(&password), "password on stderr:\n{stderr}");
    assert!(stderr.contains("invalid settings"), "{stderr}");
}
