//! TLS from lockd to Redis (`rediss://`), through the real `lockd` binary
//! over real `redis-server`s that speak TLS only (`--port 0`: no plain port
//! at all), with certificates made here by a CA of the test's own: a server
//! verified against `--redis-ca-cert`; a server that requires client
//! certificates; servers whose certificate lockd must refuse (another CA,
//! expired, another name), which get 503s, one clear error in the log, and
//! not a single command; a self-signed `CA:TRUE` certificate given as
//! `--redis-ca-cert`, pinned; TLS settings that cannot be used; Redlock
//! over TLS nodes, and over a mix of TLS and plain ones; a Redis Cluster
//! over TLS; a Sentinel and its master over TLS.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::{
    Lockd, MASTER_NAME, RedisServer, Reply, ServerCert, TestCa, TlsCluster, TlsRedisServer,
    TlsSentinel, lockd, run_blocking,
};

/// A client with a timeout, so that no test can hang.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Sends `request` and reads the whole answer.
async fn send(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.expect("an HTTP answer");
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        text: response.text().await.expect("the body"),
    }
}

/// Acquires, extends and releases lock `name` on `lockd`, checking each
/// answer and, through `holds`, that the store holds the token while it is
/// held and not after.
async fn take_extend_release(lockd: &Lockd, name: &str, holds: impl Fn(&str) -> bool) {
    let client = http();
    let url = lockd.url(&format!("/locks/{name}"));
    let granted = send(
        client
            .post(&url)
            .json(&serde_json::json!({ "ttl_ms": 10_000 })),
    )
    .await;
    granted.expect_status(201);
    let token = granted.token();
    assert!(holds(&token), "the store does not hold the lock");
    let extended = send(
        client
            .patch(&url)
            .header("Lock-Token", &token)
            .json(&serde_json::json!({ "ttl_ms": 20_000 })),
    )
    .await;
    extended.expect_status(200);
    send(client.delete(&url).header("Lock-Token", &token))
        .await
        .expect_status(204);
    assert!(!holds(&token), "the lock is still held after its release");
}

/// `/readyz` of `lockd`.
async fn readyz(lockd: &Lockd) -> StatusCode {
    send(http().get(lockd.url("/readyz"))).await.status
}

/// Waits until `/readyz` is 200 (a busy machine may take seconds to connect
/// to every node), up to 30 s.
async fn until_ready(lockd: &Lockd) {
    let ready = crate::support::eventually(Duration::from_secs(30), || async {
        readyz(lockd).await == StatusCode::OK
    })
    .await;
    assert!(ready, "/readyz never answered 200:\n{}", lockd.stderr());
}

/// The `ERROR` lines of `stderr` that name `node`.
fn errors_naming(stderr: &str, node: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains(" ERROR ") && l.contains(node))
        .map(str::to_owned)
        .collect()
}

/// With `--redis-ca-cert`, lockd reaches a TLS-only server whose
/// certificate that CA signed, is ready, and takes, extends and releases a
/// lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_over_rediss_with_the_ca_cert_takes_extends_and_releases_a_lock() {
    let ca = TestCa::new("lockd test CA");
    let server = TlsRedisServer::spawn(&ca.server_cert(ServerCert::Good), &ca, false).await;
    let lockd = Lockd::serve(
        &[
            "--redis-url",
            &server.url(),
            "--redis-ca-cert",
            ca.cert_arg(),
        ],
        &[],
    )
    .await;
    until_ready(&lockd).await;
    take_extend_release(&lockd, "tls:one", |token| {
        server.lock_token("tls:one") == token
    })
    .await;
    assert!(
        !lockd.stderr().contains(" ERROR "),
        "an error was logged:\n{}",
        lockd.stderr()
    );
}

/// The case of `openssl req -x509 -subj /CN=localhost -addext
/// subjectAltName=DNS:localhost,IP:127.0.0.1`: a self-signed certificate
/// that says it is a CA (`CA:TRUE`), the server's own, given as
/// `--redis-ca-cert`. `redis-cli --tls --cacert` (OpenSSL) accepts it, and
/// so does lockd: it pins that exact certificate (its name still checked,
/// here the DNS name `localhost`), is ready, and takes, extends and
/// releases a lock, with no error logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_ca_certificate_given_as_the_ca_cert_is_pinned_and_serves_locks() {
    let ca = TestCa::new("lockd test CA");
    let pinned = ca.self_signed_ca_as_server("pinned", ServerCert::Good);
    let server = TlsRedisServer::spawn(&pinned, &ca, false).await;
    let port = server.port().to_string();
    let cli = std::process::Command::new("redis-cli")
        .args(["--tls", "--cacert", pinned.cert(), "-h", "localhost"])
        .args(["-p", &port, "PING"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&cli.stdout).trim(),
        "PONG",
        "redis-cli: {}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let lockd = Lockd::serve(
        &[
            "--redis-url",
            &format!("rediss://localhost:{port}"),
            "--redis-ca-cert",
            pinned.cert(),
        ],
        &[],
    )
    .await;
    until_ready(&lockd).await;
    take_extend_release(&lockd, "tls:pinned", |token| {
        server.lock_token("tls:pinned") == token
    })
    .await;
    assert!(
        !lockd.stderr().contains(" ERROR "),
        "an error was logged:\n{}",
        lockd.stderr()
    );
}

/// A server that requires client certificates (`--tls-auth-clients yes`)
/// serves a lockd that has one (`--redis-client-cert`,
/// `--redis-client-key`, here from the environment); a lockd without one is
/// not ready, gets 503s, and logs one error naming the node and the
/// settings to give, however many requests failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates_serves_only_a_lockd_with_one() {
    let ca = TestCa::new("lockd test CA");
    let server = TlsRedisServer::spawn(&ca.server_cert(ServerCert::Good), &ca, true).await;
    let client = ca.client_cert("lockd");
    let with_cert = Lockd::serve(
        &[
            "--redis-url",
            &server.url(),
            "--redis-ca-cert",
            ca.cert_arg(),
        ],
        &[
            ("LOCKD_REDIS_CLIENT_CERT", client.cert()),
            ("LOCKD_REDIS_CLIENT_KEY", client.key()),
        ],
    )
    .await;
    assert_eq!(readyz(&with_cert).await, 200, "{}", with_cert.stderr());
    take_extend_release(&with_cert, "tls:mutual", |token| {
        server.lock_token("tls:mutual") == token
    })
    .await;

    let without = Lockd::serve(
        &[
            "--redis-url",
            &server.url(),
            "--redis-ca-cert",
            ca.cert_arg(),
        ],
        &[],
    )
    .await;
    for _ in 0..5 {
        assert_eq!(readyz(&without).await, 503, "{}", without.stderr());
    }
    let refused = send(http().post(without.url("/locks/tls:mutual"))).await;
    refused.expect_problem(503, "backend-unavailable");
    // The release-event subscriber keeps trying meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stderr = without.stderr();
    let errors = errors_naming(&stderr, &server.addr());
    assert_eq!(errors.len(), 1, "not one error naming the node:\n{stderr}");
    assert!(
        errors[0].contains("client certificate") && errors[0].contains("--redis-client-cert"),
        "{}",
        errors[0]
    );
}

/// A server whose certificate lockd cannot verify against
/// `--redis-ca-cert` (signed by another CA, expired, or for another name;
/// a self-signed `CA:TRUE` one that is not the file's; the file's own, but
/// expired or for another name):
/// lockd starts, `/readyz` is 503, an acquire gets 503 `backend-unavailable`
/// with `Retry-After`, the log has one error naming the node and saying the
/// certificate could not be verified, and the server never ran a command
/// of lockd's (it has no plain port for lockd to fall back to, and the TLS
/// port got nothing past the handshake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_that_cannot_be_verified_gets_503s_one_error_and_no_command() {
    let ca = TestCa::new("lockd test CA");
    let other_ca = TestCa::new("someone else's CA");
    let cases = [
        (
            "another CA",
            other_ca.server_cert(ServerCert::Good),
            "UnknownIssuer",
        ),
        ("expired", ca.server_cert(ServerCert::Expired), "expired"),
        (
            "another name",
            ca.server_cert(ServerCert::OtherName),
            "host name",
        ),
    ];
    // Self-signed CA:TRUE certificates (as `openssl req -x509` makes):
    // one that is not the certificate of --redis-ca-cert (another such is)
    // is not pinned, and the error says what lockd accepts; one that is
    // pinned still has its dates and its name checked.
    let served = ca.self_signed_ca_as_server("served", ServerCert::Good);
    let other = ca.self_signed_ca_as_server("other", ServerCert::Good);
    let expired = ca.self_signed_ca_as_server("expired", ServerCert::Expired);
    let other_name = ca.self_signed_ca_as_server("other-name", ServerCert::OtherName);
    let (other_pem, expired_pem, other_name_pem) = (
        other.cert().to_owned(),
        expired.cert().to_owned(),
        other_name.cert().to_owned(),
    );
    let cases = cases
        .into_iter()
        .map(|(what, cert, reason)| (what, cert, reason, ca.cert_arg().to_owned()))
        .chain([
            (
                "another self-signed CA:TRUE certificate",
                served,
                "exactly one of the certificates of --redis-ca-cert (pinned)",
                other_pem,
            ),
            (
                "a pinned self-signed CA:TRUE certificate, expired",
                expired,
                "expired",
                expired_pem,
            ),
            (
                "a pinned self-signed CA:TRUE certificate for another name",
                other_name,
                "host name",
                other_name_pem,
            ),
        ]);
    for (what, cert, reason, trusted) in cases {
        let server = TlsRedisServer::spawn(&cert, &ca, false).await;
        let lockd = Lockd::serve(
            &[
                "--redis-url",
                &format!("rediss://:hunter2@127.0.0.1:{}", server.port()),
                "--redis-ca-cert",
                &trusted,
                "--redis-timeout-ms",
                "500",
            ],
            &[],
        )
        .await;
        for _ in 0..3 {
            assert_eq!(readyz(&lockd).await, 503, "{what}: {}", lockd.stderr());
        }
        let refused = send(http().post(lockd.url("/locks/tls:refused"))).await;
        refused.expect_problem(503, "backend-unavailable");
        let retry_after = refused.header("retry-after").expect("Retry-After");
        assert!(
            retry_after.parse::<u64>().is_ok_and(|s| s >= 1),
            "{retry_after}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let stderr = lockd.stderr();
        assert!(
            !stderr.contains("hunter2"),
            "{what}: the password was logged:\n{stderr}"
        );
        let errors = errors_naming(&stderr, &server.addr());
        assert_eq!(
            errors.len(),
            1,
            "{what}: not one error naming the node:\n{stderr}"
        );
        assert!(
            errors[0].contains("certificate could not be verified") && errors[0].contains(reason),
            "{what}: {}",
            errors[0]
        );
        // This INFO counts from the next one on.
        let commands = server.commands_run();
        assert!(commands.is_empty(), "{what}: the server ran {commands:?}");
    }
}

/// One start of `lockd serve` with unusable TLS settings: flags, an
/// environment variable, and what the message must name.
struct Bad<'a> {
    args: Vec<&'a str>,
    env: Option<(&'a str, &'a str)>,
    names: &'a str,
}

impl<'a> Bad<'a> {
    fn args(args: &[&'a str], names: &'a str) -> Self {
        Self {
            args: args.to_vec(),
            env: None,
            names,
        }
    }

    fn env(var: (&'a str, &'a str), names: &'a str) -> Self {
        Self {
            args: Vec::new(),
            env: Some(var),
            names,
        }
    }
}

/// TLS settings that cannot be used exit 2 with a message naming the
/// setting: a client certificate without its key or a key without its
/// certificate (flag, environment or file), a file that cannot be read or
/// holds no certificate or key, a key that is not the certificate's, an
/// `#insecure` URL, and cluster seeds of both schemes.
#[test]
fn unusable_redis_tls_settings_exit_2_naming_them() {
    let ca = TestCa::new("lockd test CA");
    let client = ca.client_cert("lockd");
    let other = ca.client_cert("other");
    let garbage = ca.file("garbage.pem", "not PEM at all\n");
    let key_only = ca.file(
        "key-only.pem",
        &std::fs::read_to_string(&client.key).unwrap(),
    );
    let toml = ca.file(
        "lockd.toml",
        "redis_ca_cert = \"/nonexistent/redis-ca.pem\"\n",
    );
    let url = "rediss://127.0.0.1:1";
    let (garbage, key_only, toml) = (
        garbage.to_str().unwrap(),
        key_only.to_str().unwrap(),
        toml.to_str().unwrap(),
    );
    let client_key = ("LOCKD_REDIS_CLIENT_KEY", client.key());
    let cases = [
        Bad::args(
            &["--redis-client-cert", client.cert()],
            "--redis-client-key",
        ),
        Bad::env(client_key, "--redis-client-cert"),
        Bad::args(&["--redis-ca-cert", "/nonexistent/ca.pem"], "redis_ca_cert"),
        Bad::args(&["--config", toml], "redis_ca_cert"),
        Bad::args(&["--redis-ca-cert", garbage], "redis_ca_cert"),
        Bad::args(&["--redis-ca-cert", key_only], "redis_ca_cert"),
        Bad::args(
            &[
                "--redis-client-cert",
                garbage,
                "--redis-client-key",
                client.key(),
            ],
            "redis_client_cert",
        ),
        Bad::args(
            &[
                "--redis-client-cert",
                client.cert(),
                "--redis-client-key",
                garbage,
            ],
            "redis_client_key",
        ),
        // The key of another certificate.
        Bad::args(
            &[
                "--redis-client-cert",
                client.cert(),
                "--redis-client-key",
                other.key(),
            ],
            "redis_client_key",
        ),
    ];
    for Bad { args, env, names } in cases {
        let out = run_blocking(
            lockd()
                .args(["serve", "--listen", "127.0.0.1:0", "--redis-url", url])
                .args(&args)
                .envs(env),
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} {env:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(names),
            "{args:?} {env:?} must name {names}: {}",
            out.stderr
        );
    }
    for args in [
        vec!["--redis-url", "rediss://:hunter2@127.0.0.1:1/#insecure"],
        vec![
            "--redis-mode",
            "cluster",
            "--redis-url",
            "redis://:hunter2@127.0.0.1:1",
            "--redis-url",
            "rediss://:hunter2@127.0.0.1:2",
        ],
    ] {
        let out = run_blocking(
            lockd()
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(&args),
        );
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("redis_url"), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("hunter2"), "{args:?}: {}", out.stderr);
    }
}

/// Redlock over 3 TLS-only servers grants, extends and releases: every
/// node holds the token, then none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_three_tls_servers_takes_extends_and_releases_a_lock() {
    let ca = TestCa::new("lockd test CA");
    let cert = ca.server_cert(ServerCert::Good);
    let nodes =
        futures::future::join_all((0..3).map(|_| TlsRedisServer::spawn(&cert, &ca, false))).await;
    let mut args = vec!["--redis-ca-cert".to_owned(), ca.cert_arg().to_owned()];
    for node in &nodes {
        args.extend(["--redis-url".to_owned(), node.url()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lockd = Lockd::serve(&args, &[("LOCKD_NODE_TIMEOUT_MS", "1000")]).await;
    until_ready(&lockd).await;
    take_extend_release(&lockd, "tls:redlock", |token| {
        nodes.iter().all(|n| n.lock_token("tls:redlock") == token)
    })
    .await;
    assert!(nodes.iter().all(|n| n.lock_token("tls:redlock").is_empty()));
}

/// A Redlock set may mix `rediss://` and `redis://` nodes: each is reached
/// as its own URL says, and every one of them holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_set_may_mix_tls_and_plain_nodes() {
    let ca = TestCa::new("lockd test CA");
    let cert = ca.server_cert(ServerCert::Good);
    let tls =
        futures::future::join_all((0..2).map(|_| TlsRedisServer::spawn(&cert, &ca, false))).await;
    let plain = RedisServer::spawn().await;
    let (tls_a, tls_b, plain_url) = (tls[0].url(), tls[1].url(), plain.url());
    let lockd = Lockd::serve(
        &[
            "--redis-url",
            &tls_a,
            "--redis-url",
            &plain_url,
            "--redis-url",
            &tls_b,
            "--redis-ca-cert",
            ca.cert_arg(),
            "--node-timeout-ms",
            "1000",
        ],
        &[],
    )
    .await;
    until_ready(&lockd).await;
    let client = http();
    let url = lockd.url("/locks/tls:mixed");
    let granted = send(client.post(&url)).await;
    granted.expect_status(201);
    let token = granted.token();
    for node in &tls {
        assert_eq!(node.lock_token("tls:mixed"), token);
    }
    assert_eq!(
        plain.lock_token("tls:mixed").await.as_deref(),
        Some(token.as_str())
    );
    send(client.delete(&url).header("Lock-Token", &token))
        .await
        .expect_status(204);
}

/// A Redis Cluster whose nodes speak TLS only: lockd in cluster mode,
/// seeded with two of its three masters' `rediss://` URLs and
/// `--redis-ca-cert`, finds the third over TLS too, and takes, extends and
/// releases a lock on each; with another CA it is not ready, gets 503s, and
/// logs one error naming the seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_over_a_tls_redis_cluster_verifies_every_node() {
    let ca = TestCa::new("lockd test CA");
    let cluster = TlsCluster::start(&ca.server_cert(ServerCert::Good), &ca).await;
    let urls = cluster.urls();
    let mut args = vec!["--redis-mode", "cluster", "--redis-ca-cert", ca.cert_arg()];
    for url in &urls[..2] {
        args.extend(["--redis-url", url.as_str()]);
    }
    let lockd = Lockd::serve(&args, &[]).await;
    until_ready(&lockd).await;
    // A lock on each master, the one lockd found from the seeds included.
    for node in 0..3 {
        let name = cluster.name_on(node, "tls:cluster:");
        take_extend_release(&lockd, &name, |token| cluster.lock_token(&name) == token).await;
    }

    let other_ca = TestCa::new("someone else's CA");
    args[3] = other_ca.cert_arg();
    let refused = Lockd::serve(&args, &[]).await;
    for _ in 0..3 {
        assert_eq!(readyz(&refused).await, 503, "{}", refused.stderr());
    }
    send(http().post(refused.url("/locks/tls:cluster:0")))
        .await
        .expect_problem(503, "backend-unavailable");
    let stderr = refused.stderr();
    let seeds = cluster.addrs()[..2].join(", ");
    let errors = errors_naming(&stderr, &seeds);
    assert_eq!(errors.len(), 1, "not one error naming the seeds:\n{stderr}");
    assert!(
        errors[0].contains("certificate could not be verified"),
        "{}",
        errors[0]
    );
}

/// Sentinel mode over TLS: a TLS-only Sentinel watching a TLS-only master.
/// With `--redis-ca-cert`, lockd asks the Sentinel over TLS, connects to
/// the master it names over TLS, verifying both against that CA, and
/// takes, extends and releases a lock there. With another CA it is not
/// ready, gets 503s, and logs one error naming the Sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_mode_over_tls_verifies_the_sentinels_and_the_master() {
    let ca = TestCa::new("lockd test CA");
    let cert = ca.server_cert(ServerCert::Good);
    let master = TlsRedisServer::spawn(&cert, &ca, false).await;
    let sentinel = {
        let (master, cert, ca) = (&master, &cert, &ca);
        tokio::task::block_in_place(|| TlsSentinel::start(master, cert, ca))
    };
    let url = sentinel.url();
    let mut args = vec![
        "--redis-mode",
        "sentinel",
        "--sentinel-master",
        MASTER_NAME,
        "--redis-url",
        url.as_str(),
        "--redis-ca-cert",
        ca.cert_arg(),
    ];
    let lockd = Lockd::serve(&args, &[]).await;
    until_ready(&lockd).await;
    take_extend_release(&lockd, "tls:sentinel", |token| {
        master.lock_token("tls:sentinel") == token
    })
    .await;
    assert!(
        !lockd.stderr().contains(" ERROR "),
        "an error was logged:\n{}",
        lockd.stderr()
    );

    let other_ca = TestCa::new("someone else's CA");
    args[7] = other_ca.cert_arg();
    let refused = Lockd::serve(&args, &[]).await;
    for _ in 0..3 {
        assert_eq!(readyz(&refused).await, 503, "{}", refused.stderr());
    }
    send(http().post(refused.url("/locks/tls:sentinel")))
        .await
        .expect_problem(503, "backend-unavailable");
    let stderr = refused.stderr();
    let errors = errors_naming(&stderr, &sentinel.addr());
    assert_eq!(
        errors.len(),
        1,
        "not one error naming the Sentinel:\n{stderr}"
    );
    assert!(
        errors[0].contains("certificate could not be verified"),
        "{}",
        errors[0]
    );
}
