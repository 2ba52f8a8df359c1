//! The transport as clients (and hostile clients) meet it, through the real
//! `lockd` binary: HTTPS with `--tls-cert`/`--tls-key` and a certificate
//! made here (rcgen, self-signed for 127.0.0.1 and localhost), plain HTTP
//! sent to the HTTPS port, the header read timeout (slow-loris), the limit
//! on request heads, TLS settings that cannot be used, and `lockd exec`
//! trusting the certificate with `--ca-cert` (and passing over a server
//! whose TLS fails for the next one).
//!
//! Raw connections use blocking sockets (in `spawn_blocking`) with a read
//! timeout, so that "the server closed the connection" (EOF or reset) is
//! told apart from "nothing came yet".

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{self, LOCKD, Lockd, RedisServer, assert_lease_ms, run};
use reqwest::StatusCode;
use serde_json::Value;

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A self-signed certificate for `127.0.0.1` and `localhost`, with its key,
/// written as PEM files in a temporary directory.
struct TestCert {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    /// The certificate, PEM.
    pem: String,
}

impl TestCert {
    fn new() -> Self {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("make a self-signed certificate");
        let dir = tempfile::tempdir().expect("temp dir for the certificate");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let pem = made.cert.pem();
        std::fs::write(&cert, &pem).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        Self {
            dir,
            cert,
            key,
            pem,
        }
    }

    fn cert(&self) -> &str {
        self.cert.to_str().unwrap()
    }

    fn key(&self) -> &str {
        self.key.to_str().unwrap()
    }

    /// A file in the certificate's directory.
    fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// An HTTPS client that trusts this certificate.
    fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.pem.as_bytes()).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    /// A rustls client configuration that trusts this certificate, for raw
    /// TLS connections.
    fn rustls_config(&self) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.pem.as_bytes()).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        Arc::new(config)
    }
}

/// `lockd serve --listen 127.0.0.1:0 <args>`, with a clean environment.
fn serve_command(args: &[&str]) -> Command {
    let mut command = support::lockd();
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("LOCKD_LOG", "info");
    command
}

/// How a raw connection ended.
#[derive(Debug)]
struct Closed {
    /// From the first byte sent (or the connection, when nothing was sent)
    /// to the end.
    after: Duration,
    /// Everything the server sent.
    received: Vec<u8>,
    /// Whether the server closed it (EOF or reset) rather than the read
    /// timeout running out.
    by_server: bool,
}

/// Reads from `stream` until the server closes it, or for at most 10 s.
fn read_until_closed(stream: &mut impl std::io::Read, since: Instant) -> Closed {
    let mut received = Vec::new();
    let mut buf = [0_u8; 64 * 1024];
    let by_server = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false;
            }
            // A reset, or a TLS stream cut without close_notify.
            Err(_) => break true,
        }
    };
    Closed {
        after: since.elapsed(),
        received,
        by_server,
    }
}

/// A blocking connection to `addr` that gives up reading after 10 s.
fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to lockd");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Sends `bytes` on a fresh plain connection, then reads until it closes.
/// (The server may close it before it has read them all, which fails the
/// write: what it sent back tells what happened.)
async fn send_raw(addr: &str, bytes: Vec<u8>) -> Closed {
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = connect(&addr);
        let since = Instant::now();
        let _ = stream.write_all(&bytes);
        read_until_closed(&mut stream, since)
    })
    .await
    .unwrap()
}

/// A request head of exactly `len` bytes: `GET /healthz` padded with an
/// `X-Pad` header.
fn head_of(len: usize) -> Vec<u8> {
    let start = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: ";
    let mut head = start.to_vec();
    head.resize(len - 4, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    head
}

/// The status line of a raw answer.
fn status_line(received: &[u8]) -> String {
    String::from_utf8_lossy(received)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

// ---------------------------------------------------------------------------
// HTTPS
// ---------------------------------------------------------------------------

/// With `--tls-cert` and `--tls-key`, a client that trusts the certificate
/// takes, extends, reads and releases a lock over HTTPS; one that does not
/// trust it gets no answer; plain HTTP sent to the HTTPS port gets a TLS
/// alert, no HTTP answer, and no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_the_lock_api_and_plain_http_gets_nothing() {
    let cert = TestCert::new();
    let redis = RedisServer::spawn().await;
    let https = cert.client();
    let lockd = Lockd::serve_over(
        "https",
        &[
            "--redis-url",
            &redis.url(),
            "--tls-cert",
            cert.cert(),
            "--tls-key",
            cert.key(),
        ],
        &[],
        &https,
    )
    .await;
    assert!(
        lockd.stderr().contains(r#"scheme="https""#),
        "{}",
        lockd.stderr()
    );

    let grant = https
        .post(lockd.url("/locks/tls:a?ttl_ms=5000"))
        .send()
        .await
        .unwrap();
    assert_eq!(grant.status(), StatusCode::CREATED);
    let grant: Value = grant.json().await.unwrap();
    let token = grant["token"].as_str().unwrap().to_owned();
    let fence = grant["fence"].as_u64().expect("a fence");

    let sent = Instant::now();
    let extended = https
        .patch(lockd.url("/locks/tls:a"))
        .header("Lock-Token", &token)
        .json(&serde_json::json!({ "ttl_ms": 20000 }))
        .send()
        .await
        .unwrap();
    assert_eq!(extended.status(), StatusCode::OK);
    let extended: Value = extended.json().await.unwrap();
    assert_eq!(extended["fence"], fence);
    assert_lease_ms(extended["ttl_ms"].as_u64(), 20000, sent);

    let held = https.get(lockd.url("/locks/tls:a")).send().await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let held: Value = held.json().await.unwrap();
    assert_eq!(held["held"], true);
    assert_eq!(held["fence"], fence);
    assert_eq!(redis.lock_token("tls:a").await.as_deref(), Some(&*token));

    let released = https
        .delete(lockd.url("/locks/tls:a"))
        .header("Lock-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    assert_eq!(redis.lock_token("tls:a").await, None);
    let again = https
        .post(lockd.url("/locks/tls:a?ttl_ms=5000"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    let again_fence = again.json::<Value>().await.unwrap()["fence"].as_u64();
    assert!(again_fence > Some(fence), "{again_fence:?} after {fence}");

    // A client that trusts only the system's CAs refuses the certificate.
    let untrusting = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let refused = untrusting
        .post(lockd.url("/locks/tls:b"))
        .send()
        .await
        .expect_err("an unknown certificate must be refused");
    assert!(refused.is_connect(), "{refused:?}");

    // Plain HTTP to the HTTPS port: no HTTP answer, no lock.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .post(format!("http://{}/locks/tls:b", lockd.addr()))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP got an answer: {plain:?}");
    let raw = send_raw(
        lockd.addr(),
        b"POST /locks/tls:b HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n".to_vec(),
    )
    .await;
    assert!(raw.by_server, "{raw:?}");
    assert!(
        !raw.received.starts_with(b"HTTP/"),
        "plain HTTP got an HTTP answer: {:?}",
        String::from_utf8_lossy(&raw.received)
    );
    // A TLS alert record (content type 21), if anything.
    assert!(
        raw.received.is_empty() || raw.received[0] == 21,
        "{:?}",
        raw.received
    );
    assert_eq!(redis.lock_token("tls:b").await, None);
    assert!(!redis.has_meta("tls:b").await);
}

/// The certificate and key may come from the environment and the config
/// file as well as from flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_may_come_from_the_environment_and_the_config_file() {
    let cert = TestCert::new();
    let config = cert.file(
        "lockd.toml",
        &format!(
            "tls_key = {:?}\nheader_read_timeout_ms = 2000\n",
            cert.key()
        ),
    );
    let https = cert.client();
    let lockd = Lockd::serve_over(
        "https",
        &["--dev", "--config", config.to_str().unwrap()],
        &[("LOCKD_TLS_CERT", cert.cert())],
        &https,
    )
    .await;
    let grant = https
        .post(lockd.url("/locks/tls:env"))
        .send()
        .await
        .unwrap();
    assert_eq!(grant.status(), StatusCode::CREATED);
}

// ---------------------------------------------------------------------------
// Slow clients
// ---------------------------------------------------------------------------

/// The header read timeout of the slow-loris test, in ms.
const HEADER_TIMEOUT_MS: u64 = 300;

/// How late after the header read timeout a connection may close on a busy
/// machine.
const MARGIN: Duration = Duration::from_secs(3);

#[track_caller]
fn assert_cut_off_in_time(closed: &Closed, what: &str) {
    let timeout = Duration::from_millis(HEADER_TIMEOUT_MS);
    assert!(
        closed.by_server,
        "{what}: still open after 10 s: {closed:?}"
    );
    assert!(
        closed.received.is_empty(),
        "{what}: the server sent {:?}",
        String::from_utf8_lossy(&closed.received)
    );
    assert!(
        closed.after >= timeout.mul_f64(0.8),
        "{what}: closed after {:?}, before the {timeout:?} timeout",
        closed.after
    );
    assert!(
        closed.after < timeout + MARGIN,
        "{what}: closed only after {:?}",
        closed.after
    );
}

/// A client that does not finish its request head within
/// `--header-read-timeout-ms` has its connection closed, without an answer:
/// half a head, nothing at all, or a head dripped a byte at a time (the
/// timeout is a deadline for the whole head, not for each read). A
/// keep-alive connection left idle after an answer is closed after as long.
/// A head sent in two parts within the time is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_not_complete_within_the_header_read_timeout_is_cut_off() {
    let timeout = HEADER_TIMEOUT_MS.to_string();
    let http = reqwest::Client::new();
    let lockd = Lockd::serve_over(
        "http",
        &["--dev", "--header-read-timeout-ms", &timeout],
        &[],
        &http,
    )
    .await;
    let addr = lockd.addr().to_owned();

    let half = send_raw(
        &addr,
        b"POST /locks/x HTTP/1.1\r\nHost: localhost\r\n".to_vec(),
    )
    .await;
    assert_cut_off_in_time(&half, "half a head");

    let a = addr.clone();
    let silent = tokio::task::spawn_blocking(move || {
        let mut stream = connect(&a);
        read_until_closed(&mut stream, Instant::now())
    })
    .await
    .unwrap();
    assert_cut_off_in_time(&silent, "nothing sent");

    let a = addr.clone();
    let dripped = tokio::task::spawn_blocking(move || {
        let mut stream = connect(&a);
        let head =
            b"POST /locks/x HTTP/1.1\r\nHost: localhost\r\nX-Drip: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        let since = Instant::now();
        for byte in head {
            // A write fails once the server has closed the connection.
            if stream.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        read_until_closed(&mut stream, since)
    })
    .await
    .unwrap();
    assert_cut_off_in_time(&dripped, "a head dripped a byte every 50 ms");

    let a = addr.clone();
    let (answer, idle) = tokio::task::spawn_blocking(move || {
        let mut stream = connect(&a);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut buf = [0_u8; 4096];
        let n = stream.read(&mut buf).unwrap();
        let answer = buf[..n].to_vec();
        (answer, read_until_closed(&mut stream, Instant::now()))
    })
    .await
    .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    assert_cut_off_in_time(&idle, "an idle keep-alive connection");

    let a = addr.clone();
    let in_time = tokio::task::spawn_blocking(move || {
        let mut stream = connect(&a);
        let since = Instant::now();
        stream.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(HEADER_TIMEOUT_MS / 3));
        stream
            .write_all(b"Host: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_until_closed(&mut stream, since)
    })
    .await
    .unwrap();
    assert!(
        status_line(&in_time.received) == "HTTP/1.1 200 OK",
        "{in_time:?}"
    );

    // None of the cut-off POSTs reached the handler.
    let free = http.get(lockd.url("/locks/x")).send().await.unwrap();
    assert_eq!(free.status(), StatusCode::NOT_FOUND);
}

/// Over TLS the handshake gets the header read timeout, then the request
/// head gets it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_handshake_and_the_head_each_get_the_header_read_timeout() {
    let cert = TestCert::new();
    let timeout = HEADER_TIMEOUT_MS.to_string();
    let lockd = Lockd::serve_over(
        "https",
        &[
            "--dev",
            "--tls-cert",
            cert.cert(),
            "--tls-key",
            cert.key(),
            "--header-read-timeout-ms",
            &timeout,
        ],
        &[],
        &cert.client(),
    )
    .await;

    let addr = lockd.addr().to_owned();
    let no_handshake = tokio::task::spawn_blocking(move || {
        let mut stream = connect(&addr);
        read_until_closed(&mut stream, Instant::now())
    })
    .await
    .unwrap();
    assert_cut_off_in_time(&no_handshake, "no TLS handshake");

    let addr = lockd.addr().to_owned();
    let config = cert.rustls_config();
    let (alpn, half) = tokio::task::spawn_blocking(move || {
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let tls = rustls::ClientConnection::new(config, name).unwrap();
        let mut stream = rustls::StreamOwned::new(tls, connect(&addr));
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .expect("handshake");
        }
        let alpn = stream.conn.alpn_protocol().map(<[u8]>::to_vec);
        let since = Instant::now();
        stream
            .write_all(b"POST /locks/x HTTP/1.1\r\nHost: localhost\r\n")
            .unwrap();
        stream.flush().unwrap();
        (alpn, read_until_closed(&mut stream, since))
    })
    .await
    .unwrap();
    // This client offered no ALPN protocol; the server chose none.
    assert_eq!(alpn, None);
    assert_cut_off_in_time(&half, "half a head after the TLS handshake");
}

// ---------------------------------------------------------------------------
// Long heads
// ---------------------------------------------------------------------------

/// A request head over `--max-header-bytes` (16384 by default) is answered
/// 431 by hyper and its connection closed; the server serves the next
/// request as before. A head of 12 KiB is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_request_head_gets_431_and_the_server_serves_on() {
    let cert = TestCert::new();
    let https = cert.client();
    let lockd = Lockd::serve_over(
        "https",
        &["--dev", "--tls-cert", cert.cert(), "--tls-key", cert.key()],
        &[],
        &https,
    )
    .await;

    let big = https
        .post(lockd.url("/locks/long:a"))
        .header("X-Pad", "a".repeat(20 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(
        big.headers()
            .get("connection")
            .and_then(|v| v.to_str().ok()),
        Some("close")
    );

    let fits = https
        .post(lockd.url("/locks/long:a"))
        .header("X-Pad", "a".repeat(12 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(fits.status(), StatusCode::CREATED);
    let next = https.get(lockd.url("/healthz")).send().await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);

    // The same on a plain listener, byte for byte: hyper's own answer, with
    // no body, then the connection is closed.
    let http = reqwest::Client::new();
    let plain = Lockd::serve_over("http", &["--dev"], &[], &http).await;
    let refused = send_raw(plain.addr(), head_of(20 * 1024)).await;
    assert!(refused.by_server, "{refused:?}");
    assert_eq!(
        status_line(&refused.received),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let served = send_raw(plain.addr(), head_of(12 * 1024)).await;
    assert_eq!(status_line(&served.received), "HTTP/1.1 200 OK");
    // At the default the limit is exact on a fresh connection (hyper's
    // buffer grows 8 KiB, 16 KiB and stops).
    let served = send_raw(plain.addr(), head_of(16384)).await;
    assert_eq!(status_line(&served.received), "HTTP/1.1 200 OK");
    let refused = send_raw(plain.addr(), head_of(16385)).await;
    assert_eq!(
        status_line(&refused.received),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
}

/// `--max-header-bytes` moves the limit. Above 16384 it is not exact:
/// hyper checks the bytes it has buffered, and its buffer grows by doubling,
/// so a head of up to twice the setting may be served; twice is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_header_bytes_sets_the_limit_within_twice_the_setting() {
    let http = reqwest::Client::new();
    let lockd = Lockd::serve_over(
        "http",
        &["--dev", "--max-header-bytes", "32768"],
        &[],
        &http,
    )
    .await;
    let served = send_raw(lockd.addr(), head_of(20 * 1024)).await;
    assert_eq!(status_line(&served.received), "HTTP/1.1 200 OK");
    let served = send_raw(lockd.addr(), head_of(32768)).await;
    assert_eq!(status_line(&served.received), "HTTP/1.1 200 OK");
    let refused = send_raw(lockd.addr(), head_of(2 * 32768)).await;
    assert_eq!(
        status_line(&refused.received),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
}

// ---------------------------------------------------------------------------
// Settings that cannot be used
// ---------------------------------------------------------------------------

/// Runs `lockd serve` with `args`, expects exit 2, and returns its stderr.
async fn refused_at_startup(args: &[&str]) -> String {
    let out = run(serve_command(args)).await;
    let stderr = out.stderr.clone();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

/// One of `--tls-cert` and `--tls-key` without the other, a file that
/// cannot be read or holds the wrong thing, a key that is not the
/// certificate's, and head limits out of range: each stops start-up with
/// exit 2 and a message naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_transport_settings_exit_2_naming_the_problem() {
    let cert = TestCert::new();
    let other = TestCert::new();

    let stderr = refused_at_startup(&["--dev", "--tls-cert", cert.cert()]).await;
    assert!(stderr.contains("--tls-key"), "{stderr}");
    let stderr = refused_at_startup(&["--dev", "--tls-key", cert.key()]).await;
    assert!(stderr.contains("--tls-cert"), "{stderr}");

    let missing = cert.dir.path().join("missing.pem");
    let missing = missing.to_str().unwrap();
    let stderr =
        refused_at_startup(&["--dev", "--tls-cert", missing, "--tls-key", cert.key()]).await;
    assert!(
        stderr.contains("tls_cert") && stderr.contains(missing),
        "{stderr}"
    );
    let stderr =
        refused_at_startup(&["--dev", "--tls-cert", cert.cert(), "--tls-key", missing]).await;
    assert!(
        stderr.contains("tls_key") && stderr.contains(missing),
        "{stderr}"
    );

    let junk = cert.file("junk.pem", "not PEM at all\n");
    let junk = junk.to_str().unwrap();
    let stderr = refused_at_startup(&["--dev", "--tls-cert", junk, "--tls-key", cert.key()]).await;
    assert!(stderr.contains("no certificate"), "{stderr}");
    // The certificate given as the key.
    let stderr =
        refused_at_startup(&["--dev", "--tls-cert", cert.cert(), "--tls-key", cert.cert()]).await;
    assert!(stderr.contains("no private key"), "{stderr}");
    // Another certificate's key.
    let stderr =
        refused_at_startup(&["--dev", "--tls-cert", cert.cert(), "--tls-key", other.key()]).await;
    assert!(
        stderr.contains(cert.cert()) && stderr.contains(other.key()),
        "{stderr}"
    );

    let stderr = refused_at_startup(&["--dev", "--max-header-bytes", "4096"]).await;
    assert!(stderr.contains("max_header_bytes"), "{stderr}");
    let stderr = refused_at_startup(&["--dev", "--header-read-timeout-ms", "0"]).await;
    assert!(stderr.contains("header_read_timeout_ms"), "{stderr}");
}

// ---------------------------------------------------------------------------
// The client subcommands
// ---------------------------------------------------------------------------

/// A client subcommand with a clean environment and `$DIR`/`$LOCKD_BIN`
/// set for scripts.
fn client_command(dir: &Path, args: &[&str]) -> Command {
    let mut command = support::lockd();
    command.args(args).env("DIR", dir).env("LOCKD_BIN", LOCKD);
    command
}

/// `lockd exec --ca-cert` trusts a self-signed server certificate, and
/// passes `LOCKD_CA_CERT` on, so that `lockd status` in the command trusts
/// it too; without it the command is not run (69). The shell subcommands
/// take `LOCKD_CA_CERT` from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_exec_with_ca_cert_runs_a_command_under_a_lock_over_https() {
    let cert = TestCert::new();
    let lockd = Lockd::serve_over(
        "https",
        &["--dev", "--tls-cert", cert.cert(), "--tls-key", cert.key()],
        &[],
        &cert.client(),
    )
    .await;
    let server = lockd.url("");
    let dir = tempfile::tempdir().unwrap();
    let script = r#"echo "$LOCKD_FENCE" > "$DIR/fence"; "$LOCKD_BIN" status > "$DIR/status""#;

    let out = run(client_command(
        dir.path(),
        &[
            "exec",
            "--server",
            &server,
            "--ca-cert",
            cert.cert(),
            "tls:exec",
            "--",
            "sh",
            "-c",
            script,
        ],
    ))
    .await;
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let fence = std::fs::read_to_string(dir.path().join("fence")).unwrap();
    let fence: u64 = fence.trim().parse().expect("LOCKD_FENCE is a number");
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("status")).unwrap())
            .expect("lockd status in the command printed JSON");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(status["fence"], fence, "{status}");

    // Released at the end; the shell subcommands read LOCKD_CA_CERT.
    let mut free = client_command(dir.path(), &["status", "tls:exec", "--server", &server]);
    free.env("LOCKD_CA_CERT", cert.cert());
    let free = run(free).await;
    assert_eq!(free.status.code(), Some(1), "{}", &free.stderr);

    // Without --ca-cert the certificate is refused before the command runs.
    std::fs::remove_file(dir.path().join("fence")).unwrap();
    let out = run(client_command(
        dir.path(),
        &[
            "exec", "--server", &server, "tls:exec", "--", "sh", "-c", script,
        ],
    ))
    .await;
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");
    assert!(!dir.path().join("fence").exists());

    // A --ca-cert file with no certificate is a usage error (64).
    let junk = cert.file("junk.pem", "not a certificate\n");
    let out = run(client_command(
        dir.path(),
        &[
            "acquire",
            "tls:exec",
            "--server",
            &server,
            "--ca-cert",
            junk.to_str().unwrap(),
        ],
    ))
    .await;
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--ca-cert"), "{stderr}");
}

/// Against a server whose certificate the client does not trust (a
/// self-signed one, no `--ca-cert`), `lockd status` and `lockd exec` say
/// that the server answered but its certificate could not be verified, and
/// point at `--ca-cert` and `LOCKD_CA_CERT`: not "no answer from", and no
/// raw Debug value of the TLS error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_named_as_the_problem_and_ca_cert_suggested() {
    let cert = TestCert::new();
    let lockd = Lockd::serve_over(
        "https",
        &["--dev", "--tls-cert", cert.cert(), "--tls-key", cert.key()],
        &[],
        &cert.client(),
    )
    .await;
    let server = lockd.url("");
    let dir = tempfile::tempdir().unwrap();
    let status = run(client_command(
        dir.path(),
        &["status", "tls:untrusted", "--server", &server],
    ))
    .await;
    let exec = run(client_command(
        dir.path(),
        &[
            "exec",
            "--server",
            &server,
            "tls:untrusted",
            "--",
            "sh",
            "-c",
            r#"touch "$DIR/ran""#,
        ],
    ))
    .await;
    assert!(!dir.path().join("ran").exists(), "the command ran");
    for out in [&status, &exec] {
        let stderr = &out.stderr;
        assert_eq!(out.status.code(), Some(69), "{stderr}");
        assert!(
            stderr.contains(&format!("{server} answered"))
                && stderr.contains("certificate could not be verified"),
            "{stderr}"
        );
        assert!(
            stderr.contains("--ca-cert") && stderr.contains("LOCKD_CA_CERT"),
            "{stderr}"
        );
        assert!(!stderr.contains("no answer"), "{stderr}");
        assert!(!stderr.contains('{'), "a Debug value: {stderr}");
    }

    // A plain-HTTP server asked over https:// is named as such.
    let plain = Lockd::serve_over("http", &["--dev"], &[], &reqwest::Client::new()).await;
    let https = plain.url("").replacen("http://", "https://", 1);
    let out = run(client_command(
        dir.path(),
        &["status", "tls:plain", "--server", &https],
    ))
    .await;
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("not in TLS") && stderr.contains("http://"),
        "{stderr}"
    );
}

/// A TLS failure is a server that cannot be used: with `--server` given
/// twice, `lockd exec` passes over a first server that speaks plain HTTP
/// to an `https://` URL and runs the command through the second, and the
/// `lockd status` in the command does the same with the `LOCKD_SERVER` it
/// gets. When no server can be used, the error names each one with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_failing_tls_is_passed_over_for_the_next_one() {
    let cert = TestCert::new();
    let good = Lockd::serve_over(
        "https",
        &["--dev", "--tls-cert", cert.cert(), "--tls-key", cert.key()],
        &[],
        &cert.client(),
    )
    .await;
    let plain = Lockd::serve_over("http", &["--dev"], &[], &reqwest::Client::new()).await;
    let bad = plain.url("").replacen("http://", "https://", 1);
    let good_url = good.url("");
    let dir = tempfile::tempdir().unwrap();
    let script = r#""$LOCKD_BIN" status > "$DIR/status"; echo "$LOCKD_SERVER" > "$DIR/servers""#;
    let out = run(client_command(
        dir.path(),
        &[
            "exec",
            "--server",
            &bad,
            "--server",
            &good_url,
            "--ca-cert",
            cert.cert(),
            "tls:multi",
            "--",
            "sh",
            "-c",
            script,
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("status")).unwrap())
            .expect("lockd status in the command printed JSON");
    assert_eq!(status["held"], true, "{status}");
    let servers = std::fs::read_to_string(dir.path().join("servers")).unwrap();
    assert_eq!(servers.trim(), format!("{bad},{good_url}"));

    // Without --ca-cert, neither can be used: 69, and both are named.
    let out = run(client_command(
        dir.path(),
        &[
            "status",
            "tls:multi",
            "--server",
            &format!("{bad},{good_url}"),
        ],
    ))
    .await;
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{good_url} answered, but its certificate could not be verified"
        )) && stderr.contains(&format!("after passing over {bad} (not in TLS")),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// Logs of a hostile run
// ---------------------------------------------------------------------------

/// A keys file entry with every lock permission.
fn key_entry(id: &str, secret: &str, prefix: &str, rate: Option<u32>) -> String {
    use lockd::auth::Permission::{Acquire, Extend, Read, Release};
    crate::support::key_entry(
        id,
        secret,
        &[prefix],
        &[Acquire, Extend, Release, Read],
        rate,
    )
}

/// Over HTTPS with API keys, at trace level: tenants crossing prefixes with
/// each other's lock tokens, missing, unknown and malformed keys, a rate
/// limit, a token in a URL, an over-long head, a slow head and a plain-HTTP
/// client. The logs name the key ids and never a secret, a lock token or a
/// client-chosen token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_a_hostile_run_over_tls_name_no_secret_and_no_token() {
    let redis = RedisServer::spawn().await;
    let cert = TestCert::new();
    let secret = |who: &str| format!("{who}-{}", crate::support::random_token());
    let (a, b, slow, stranger) = (secret("a"), secret("b"), secret("slow"), secret("x"));
    let keys = cert.file(
        "keys.toml",
        &(key_entry("tenant-a", &a, "a:", None)
            + &key_entry("tenant-b", &b, "b:", None)
            + &key_entry("throttled", &slow, "s:", Some(1))),
    );
    let client = cert.client();
    let lockd = Lockd::serve_over(
        "https",
        &[
            "--redis-url",
            &redis.url(),
            "--tls-cert",
            cert.cert(),
            "--tls-key",
            cert.key(),
            "--auth-keys-file",
            keys.to_str().unwrap(),
            "--header-read-timeout-ms",
            "300",
        ],
        &[("LOCKD_LOG", "trace")],
        &client,
    )
    .await;
    let url = |path: &str| lockd.url(path);
    let chosen = crate::support::random_token();
    let grant: Value = client
        .post(url("/locks/b:job"))
        .bearer_auth(&b)
        .body(format!(r#"{{"token":"{chosen}","ttl_ms":30000}}"#))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(grant["token"], chosen.as_str());
    let generated: Value = client
        .post(url("/locks/a:job"))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let a_token = generated["token"].as_str().unwrap().to_owned();

    let steps = [
        // Tenant A with B's token, in the header and in the body: 403.
        client
            .delete(url("/locks/b:job"))
            .bearer_auth(&a)
            .header("Lock-Token", &chosen),
        client
            .patch(url("/locks/b:job"))
            .bearer_auth(&a)
            .body(format!(r#"{{"token":"{chosen}"}}"#)),
        // Unknown, malformed and missing keys: 401.
        client
            .delete(url("/locks/b:job"))
            .bearer_auth(&stranger)
            .header("Lock-Token", &chosen),
        client
            .post(url("/locks/a:job"))
            .header("Authorization", format!("Basic {a}")),
        client.get(url("/locks/a:job")),
        // A token in the URL: 400, whatever the key.
        client
            .delete(url(&format!("/locks/a:job?token={a_token}")))
            .bearer_auth(&a),
        // The throttled key: its second request is 429.
        client.get(url("/locks/s:job")).bearer_auth(&slow),
        client.get(url("/locks/s:job")).bearer_auth(&slow),
        // The holders release.
        client
            .delete(url("/locks/b:job"))
            .bearer_auth(&b)
            .header("Lock-Token", &chosen),
        client
            .delete(url("/locks/a:job"))
            .bearer_auth(&a)
            .header("Lock-Token", &a_token),
    ];
    let mut statuses = Vec::new();
    for step in steps {
        statuses.push(step.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [403, 403, 401, 401, 401, 400, 404, 429, 204, 204]);

    // Raw abuse: plain HTTP to the TLS port, an over-long head with a
    // secret in it (over TLS), and a head that never completes.
    let plain = send_raw(
        lockd.addr(),
        format!(
            "GET /locks/a:job HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {a}\r\n\r\n"
        )
        .into_bytes(),
    )
    .await;
    assert!(!status_line(&plain.received).starts_with("HTTP/1.1 2"));
    let huge = client
        .get(url("/locks/a:job"))
        .bearer_auth(&a)
        .header("X-Pad", "p".repeat(20_000))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let config = cert.rustls_config();
    let addr = lockd.addr().to_owned();
    let bearer = format!("Bearer {b}");
    tokio::task::spawn_blocking(move || {
        let server = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(config, server).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, connect(&addr));
        let since = Instant::now();
        let _ = tls.write_all(
            format!("POST /locks/b:job HTTP/1.1\r\nAuthorization: {bearer}\r\n").as_bytes(),
        );
        let closed = read_until_closed(&mut tls, since);
        assert!(closed.by_server, "a slow head was not cut off");
    })
    .await
    .unwrap();

    let logs = lockd.stderr();
    assert!(
        logs.contains("tenant-a") && logs.contains("throttled"),
        "{logs}"
    );
    assert!(logs.contains("rate-limited"), "{logs}");
    for secret in [&a, &b, &slow, &stranger, &chosen, &a_token] {
        assert!(
            !logs.contains(secret.as_str()),
            "a secret or token is in the logs:\n{logs}"
        );
    }
}
