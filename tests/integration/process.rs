//! The `lockd` binary as an operator runs it: logs, secrets, signals.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{Lockd, RedisServer, free_port, lockd, random_token, run, run_blocking};

/// Starts `lockd serve` with `args` and `LOCKD_LOG=log`; waits until
/// `/healthz` answers. Returns the guard and `http://<address>`.
async fn start_lockd(args: &[&str], log: &str) -> (Lockd, String) {
    let lockd = Lockd::serve(args, &[("LOCKD_LOG", log)]).await;
    let base = lockd.url("");
    (lockd, base)
}

/// Sends SIGTERM, waits for the exit, and returns the exit code and stderr.
async fn terminate(mut lockd: Lockd) -> (Option<i32>, String) {
    let exit = lockd.terminate().await;
    (exit.status.code(), exit.stderr)
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
    let (code, logs) = terminate(child).await;
    assert_eq!(code, Some(0));
    assert!(logs.contains("NOT shared"), "no dev-mode warning:\n{logs}");
}

#[tokio::test]
async fn lockd_dev_takes_boolish_values_from_the_environment() {
    for (value, dev) in [("1", true), ("yes", true), ("on", true), ("0", false)] {
        let mut cmd = lockd();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--redis-url"])
            .arg("redis://127.0.0.1:1")
            .env("LOCKD_DEV", value)
            .env("LOCKD_LOG", "info");
        let mut child = Lockd::spawn(cmd);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let exited = child.exited();
        assert!(
            exited.is_none(),
            "LOCKD_DEV={value}: lockd exited {exited:?}"
        );
        let (code, logs) = terminate(child).await;
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
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("send half a request");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (code, logs) = terminate(child).await;
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
    let out =
        run_blocking(lockd().args(["serve", "--default-ttl-ms", "5000", "--max-ttl-ms", "1000"]));
    assert_eq!(out.status.code(), Some(2));
    let stderr = &out.stderr;
    assert!(stderr.contains("default_ttl_ms"), "{stderr}");
}

/// A Redis URL lockd cannot use (not `redis://` or `rediss://`,
/// unparsable, or `#insecure`, which would not verify the server) exits 2
/// naming `redis_url`, without the password; so does a keys file that
/// cannot be read.
#[test]
fn an_unusable_redis_url_or_keys_file_exits_2_naming_it() {
    for url in [
        "http://127.0.0.1:6379",
        "redis://:hunter2@[bad",
        "redis://127.0.0.1:99999",
        "rediss://:hunter2@127.0.0.1:6380/#insecure",
    ] {
        let out =
            run_blocking(lockd().args(["serve", "--listen", "127.0.0.1:0", "--redis-url", url]));
        let stderr = &out.stderr;
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.contains("redis_url"), "{url}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
    }
    let out = run_blocking(lockd().args([
        "serve",
        "--dev",
        "--listen",
        "127.0.0.1:0",
        "--auth-keys-file",
        "no-such-keys-file.toml",
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("no-such-keys-file.toml"),
        "{}",
        out.stderr
    );
}

/// `lockd --version` and `lockd -V` print `lockd X.Y.Z`, the version in
/// Cargo.toml, and nothing else, and exit 0.
#[test]
fn version_prints_lockd_and_the_cargo_version() {
    let manifest = include_str!("../../Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("a version line in Cargo.toml");
    for flag in ["--version", "-V"] {
        let out = run_blocking(lockd().arg(flag));
        out.expect(0);
        assert_eq!(out.stdout, format!("lockd {version}\n"), "lockd {flag}");
        assert_eq!(out.stderr, "", "lockd {flag}");
    }
}

/// `lockd serve --help` groups the flags under headings and ends with the
/// sections of a manual page: settings, environment, signals, exit status,
/// files. Every flag is shown once.
#[test]
fn serve_help_groups_the_flags_and_ends_with_manual_sections() {
    let out = run_blocking(lockd().args(["serve", "--help"]));
    out.expect(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let at = |line: &str| {
        lines
            .iter()
            .position(|l| *l == line)
            .unwrap_or_else(|| panic!("no line {line:?} in:\n{}", out.stdout))
    };
    let order: Vec<usize> = [
        "Usage: lockd serve [OPTIONS]",
        "Options:",
        "Listening:",
        "Access:",
        "Redis:",
        "Leases and limits:",
        "Metrics and logs:",
        "Settings:",
        "Environment:",
        "Signals:",
        "Exit status:",
        "Files:",
    ]
    .into_iter()
    .map(at)
    .collect();
    assert!(order.is_sorted(), "headings out of order:\n{}", out.stdout);
    // Each flag under the heading of its group.
    for (flag, heading) in [
        ("--config <PATH>", "Options:"),
        ("--tls-cert <PATH>", "Listening:"),
        ("--auth-keys-file <AUTH_KEYS_FILE>", "Access:"),
        ("--redis-url <REDIS_URL>", "Redis:"),
        ("--max-ttl-ms <MAX_TTL_MS>", "Leases and limits:"),
        ("--log-format <LOG_FORMAT>", "Metrics and logs:"),
    ] {
        let line = lines
            .iter()
            .position(|l| l.trim_start() == flag)
            .unwrap_or_else(|| panic!("no {flag} in:\n{}", out.stdout));
        let above = lines[..line]
            .iter()
            .rev()
            .find(|l| l.ends_with(':') && !l.starts_with(' '))
            .expect("a heading above");
        assert_eq!(*above, heading, "{flag}");
    }
    let short = run_blocking(lockd().args(["serve", "-h"]));
    short.expect(0);
    let flags = |text: &str| -> Vec<String> {
        let mut flags: Vec<String> = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| l.split([' ', '[']).next().unwrap_or_default().to_owned())
            .collect();
        flags.sort();
        flags
    };
    let long = flags(&out.stdout);
    let mut unique = long.clone();
    unique.dedup();
    assert_eq!(long, unique, "a flag shown twice");
    assert_eq!(long, flags(&short.stdout), "-h and --help show other flags");
    assert!(long.len() > 40, "{long:?}");
}

/// The hidden `lockd manpages DIR` writes lockd.1 and a page per subcommand
/// (lockd-serve.1, lockd-run-start.1, ...), and lists them; a directory it
/// cannot write into is an error.
#[test]
fn manpages_writes_a_page_per_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_blocking(lockd().arg("manpages").arg(dir.path()));
    out.expect(0);
    for page in [
        "lockd",
        "lockd-serve",
        "lockd-exec",
        "lockd-run-start",
        "lockd-keygen",
    ] {
        let path = dir.path().join(format!("{page}.1"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(
            text.contains(&format!("\n.TH {page} 1 ")),
            "{page}.1:\n{text}"
        );
        assert!(
            out.stdout.lines().any(|l| l == path.to_string_lossy()),
            "{page}.1 not listed:\n{}",
            out.stdout
        );
    }
    assert!(
        !dir.path().join("lockd-manpages.1").exists(),
        "a page for the hidden subcommand"
    );
    assert!(!dir.path().join("lockd-help.1").exists(), "a page for help");
    let help = run_blocking(lockd().arg("--help"));
    assert!(!help.stdout.contains("manpages"), "{}", help.stdout);
    let missing = dir.path().join("no-such-dir");
    let out = run_blocking(lockd().arg("manpages").arg(&missing));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("no-such-dir"), "{}", out.stderr);
}

/// `lockd serve --help` shows no Redis password from `LOCKD_REDIS_URL`.
#[test]
fn serve_help_shows_no_redis_password_from_the_environment() {
    let out = run_blocking(
        lockd()
            .args(["serve", "--help"])
            .env("LOCKD_REDIS_URL", "redis://:hunter2@127.0.0.1:6379"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("LOCKD_REDIS_URL"), "{}", out.stdout);
    assert!(!out.stdout.contains("hunter2"), "{}", out.stdout);
}

/// A switch set to false in the environment (or `--dev=false`) overrides
/// `true` in the file, as every other setting does: `LOCKD_INSECURE_NO_AUTH=0`
/// takes back the file's `insecure_no_auth = true`, so a public address
/// without keys is refused again.
#[test]
fn a_switch_turned_off_in_the_environment_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lockd.toml");
    std::fs::write(
        &file,
        "listen = \"0.0.0.0:0\"\ninsecure_no_auth = true\ndev = true\n",
    )
    .unwrap();
    let out = run_blocking(
        lockd()
            .args(["serve", "--config"])
            .arg(&file)
            .env("LOCKD_INSECURE_NO_AUTH", "0"),
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("insecure-no-auth"), "{}", out.stderr);
    let out = run_blocking(
        lockd()
            .args(["serve", "--insecure-no-auth=false", "--config"])
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
}

/// One bad start of `lockd serve`: flags, environment, and the flag the
/// message must name.
struct BadStart {
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    names: &'static str,
}

#[test]
fn a_bad_fence_retention_or_restart_delay_exits_2_naming_the_flag() {
    let retention = "--fence-retention-ms";
    let delay = "--redlock-restart-delay-ms";
    let cases = [
        BadStart {
            args: &["--fence-retention-ms", "999"],
            env: &[],
            names: retention,
        },
        BadStart {
            args: &["--fence-retention-ms", "an hour"],
            env: &[],
            names: retention,
        },
        BadStart {
            args: &[],
            env: &[("LOCKD_FENCE_RETENTION_MS", "10")],
            names: retention,
        },
        BadStart {
            args: &["--fence-retention-ms", "9223372036854775807"],
            env: &[],
            names: retention,
        },
        BadStart {
            args: &["--redlock-restart-delay-ms", "9223372036854775807"],
            env: &[],
            names: delay,
        },
        BadStart {
            args: &["--redlock-restart-delay-ms", "-5"],
            env: &[],
            names: delay,
        },
        BadStart {
            args: &["--redlock-restart-delay-ms", "1.5"],
            env: &[],
            names: delay,
        },
    ];
    for case in cases {
        let out = run_blocking(
            lockd()
                .arg("serve")
                .args(case.args)
                .envs(case.env.iter().copied()),
        );
        let stderr = &out.stderr;
        let shown = format!("{:?} {:?}: {stderr}", case.args, case.env);
        assert_eq!(out.status.code(), Some(2), "{shown}");
        assert!(stderr.contains(case.names), "{shown}");
    }
}

/// `lockd serve --dev --config FILE` with `toml` in the file: its exit code
/// and stderr.
fn serve_with_config(toml: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lockd.toml");
    std::fs::write(&path, toml).unwrap();
    let out = run_blocking(
        lockd()
            .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .env_remove("LOCKD_DEFAULT_TTL_MS")
            .env_remove("LOCKD_REDIS_URL")
            .env_remove("LOCKD_LISTEN")
            .stdin(Stdio::null()),
    );
    let stderr = out.stderr.clone();
    (
        out.status.code(),
        stderr,
        path.to_string_lossy().into_owned(),
    )
}

/// A mistyped key, or a value of the wrong type, in the config file is
/// reported with the key as the file spells it (not figment's
/// `default.`-prefixed path), the file, and the real problem: the key it
/// probably meant, or the type it needs.
#[test]
fn a_config_file_typo_names_the_key_as_written_and_the_real_problem() {
    let (code, stderr, path) = serve_with_config("default_tll_ms = 5\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown key `default_tll_ms`")
            && stderr.contains("did you mean `default_ttl_ms`?")
            && stderr.contains(&path),
        "{stderr}"
    );
    assert!(!stderr.contains("default."), "a profile prefix: {stderr}");

    let (code, stderr, path) = serve_with_config("default_ttl_ms = \"5s\"\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("`default_ttl_ms`")
            && stderr.contains("whole number")
            && stderr.contains("\"5s\"")
            && stderr.contains(&path),
        "{stderr}"
    );
    assert!(!stderr.contains("default."), "a profile prefix: {stderr}");

    let (code, stderr, _) = serve_with_config("redis_url = 5\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("`redis_url`") && stderr.contains("a Redis URL (a string) or a list"),
        "{stderr}"
    );
    assert!(!stderr.contains("untagged enum"), "{stderr}");
}

/// `lockd keygen --id X` when the keys file has a key `X` already says that
/// the id exists and how to go on (another `--id`, or delete the old
/// entry), not that the keys file is invalid; the file is left as it was.
/// So does a refused `--prefix`.
#[test]
fn keygen_with_an_id_already_in_the_keys_file_says_so_and_how_to_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let keygen = |prefix: &str| {
        run_blocking(
            lockd()
                .args([
                    "keygen",
                    "--id",
                    "billing",
                    "--prefix",
                    prefix,
                    "--keys-file",
                ])
                .arg(&keys)
                .stdin(Stdio::null()),
        )
    };
    assert!(keygen("billing:").status.success());
    let before = std::fs::read_to_string(&keys).unwrap();
    let again = keygen("other:");
    let stderr = &again.stderr;
    assert_eq!(again.status.code(), Some(2), "{stderr}");
    assert!(again.stdout.is_empty(), "a secret was printed for no key");
    assert!(
        stderr.contains("\"billing\" is already in") && stderr.contains(&*keys.to_string_lossy()),
        "{stderr}"
    );
    assert!(
        stderr.contains("another --id") && stderr.contains("delete its [[keys]] entry"),
        "{stderr}"
    );
    assert!(!stderr.contains("invalid keys file"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), before);

    // A prefix no lock name can start with (a space, a `*` not alone) or
    // an empty one is refused as the flag it is, not blamed on the file,
    // and nothing is written (found by a new-user trial: written, then
    // loaded as a key that could use no name).
    for prefix in ["a b", "x*", ""] {
        let refused = keygen(prefix);
        let stderr = &refused.stderr;
        assert_eq!(refused.status.code(), Some(2), "{prefix:?}: {stderr}");
        assert!(
            refused.stdout.is_empty(),
            "{prefix:?}: a secret was printed"
        );
        assert!(
            stderr.contains("--prefix") && !stderr.contains("invalid keys file"),
            "{prefix:?}: {stderr}"
        );
        assert_eq!(std::fs::read_to_string(&keys).unwrap(), before);
    }
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
    let (code, logs) = terminate(child).await;
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
    let out = run_blocking(lockd().args(["serve", "--config"]).arg(&file));
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains(&password), "password on stderr:\n{stderr}");
    assert!(stderr.contains("invalid settings"), "{stderr}");
}

/// A keys file with one key per `(id, secret, prefix)`, every lock
/// permission and `metrics`.
fn write_keys(path: &std::path::Path, keys: &[(&str, &str, &str)]) {
    use lockd::auth::Permission::{Acquire, Extend, Metrics, Read, Release};
    let text: String = keys
        .iter()
        .map(|(id, secret, prefix)| {
            crate::support::key_entry(
                id,
                secret,
                &[prefix],
                &[Acquire, Extend, Release, Read, Metrics],
                None,
            )
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

async fn status_with_key(base: &str, secret: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{base}/locks/jobs:probe"))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_reload_on_sighup_and_a_broken_file_keeps_the_old_keys() {
    let redis = RedisServer::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let (old, new) = (random_token(), random_token());
    write_keys(&keys, &[("old", &old, "jobs:")]);
    let (child, base) = start_lockd(
        &[
            "--redis-url",
            &redis.url(),
            "--auth-keys-file",
            keys.to_str().unwrap(),
        ],
        "info",
    )
    .await;
    assert_eq!(status_with_key(&base, &old).await, 404, "the old key works");
    assert_eq!(status_with_key(&base, &new).await, 401);

    let hangup = |child: &Lockd| child.signal(Signal::SIGHUP);
    write_keys(&keys, &[("new", &new, "jobs:")]);
    hangup(&child);
    let reloaded = crate::support::eventually(Duration::from_secs(5), || async {
        status_with_key(&base, &new).await == 404
    })
    .await;
    assert!(reloaded, "the new key does not work after SIGHUP");
    assert_eq!(
        status_with_key(&base, &old).await,
        401,
        "the old key still works"
    );

    // A file that no longer parses: the keys in force stay, lockd runs on.
    std::fs::write(&keys, "[[keys]]\nid = \"broken\"\n").unwrap();
    hangup(&child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status_with_key(&base, &new).await, 404);

    let (code, logs) = terminate(child).await;
    assert_eq!(code, Some(0), "logs:\n{logs}");
    assert!(logs.contains("API keys reloaded"), "{logs}");
    assert!(logs.contains("API keys NOT reloaded"), "{logs}");
    for secret in [&old, &new] {
        assert!(
            !logs.contains(secret.as_str()),
            "a secret is in the logs:\n{logs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_without_api_keys_is_refused_unless_insecure_no_auth() {
    let port = free_port();
    let public = format!("0.0.0.0:{port}");
    let refused = run_blocking(lockd().args(["serve", "--dev", "--listen", &public]));
    assert_eq!(refused.status.code(), Some(2));
    let stderr = &refused.stderr;
    assert!(
        stderr.contains("without API keys") && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );
    // Nothing listens.
    assert!(
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_err()
    );

    // With the explicit flag it serves, and says what that means.
    let mut cmd = lockd();
    cmd.args(["serve", "--dev", "--insecure-no-auth", "--listen", &public])
        .env("LOCKD_LOG", "info");
    let child = Lockd::spawn(cmd);
    let up = crate::support::eventually(Duration::from_secs(20), || async {
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_ok()
    })
    .await;
    assert!(
        up,
        "lockd --insecure-no-auth did not serve:\n{}",
        child.stderr()
    );
    let (code, logs) = terminate(child).await;
    assert_eq!(code, Some(0));
    assert!(logs.contains("--insecure-no-auth"), "no warning:\n{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_every_auth_outcome_name_the_key_id_never_a_secret_or_token() {
    let redis = RedisServer::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let (a, b, stranger) = (random_token(), random_token(), random_token());
    write_keys(&keys, &[("tenant-a", &a, "a:"), ("tenant-b", &b, "b:")]);
    let (child, base) = start_lockd(
        &[
            "--redis-url",
            &redis.url(),
            "--auth-keys-file",
            keys.to_str().unwrap(),
        ],
        "trace",
    )
    .await;
    let http = reqwest::Client::new();
    let grant: serde_json::Value = http
        .post(format!("{base}/locks/b:job"))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = grant["token"].as_str().unwrap().to_owned();
    let steps = [
        // A with B's lock token, in the header and in the body.
        http.delete(format!("{base}/locks/b:job"))
            .bearer_auth(&a)
            .header("Lock-Token", &token),
        http.patch(format!("{base}/locks/b:job"))
            .bearer_auth(&a)
            .body(format!(r#"{{"token":"{token}"}}"#)),
        // Unknown and malformed keys, and none.
        http.delete(format!("{base}/locks/b:job"))
            .bearer_auth(&stranger)
            .header("Lock-Token", &token),
        http.post(format!("{base}/locks/b:job"))
            .header("Authorization", format!("Basic {b}")),
        http.post(format!("{base}/locks/b:job"))
            .header("Authorization", format!("Bearer {a} {b}")),
        http.get(format!("{base}/locks/b:job")),
        http.get(format!("{base}/metrics")).bearer_auth(&stranger),
        // B releases.
        http.delete(format!("{base}/locks/b:job"))
            .bearer_auth(&b)
            .header("Lock-Token", &token),
    ];
    let mut statuses = Vec::new();
    for step in steps {
        statuses.push(step.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [403, 403, 401, 401, 401, 401, 401, 204]);
    let (code, logs) = terminate(child).await;
    assert_eq!(code, Some(0));
    assert!(
        logs.contains("tenant-a") && logs.contains("tenant-b"),
        "{logs}"
    );
    for secret in [&a, &b, &stranger, &token] {
        assert!(
            !logs.contains(secret.as_str()),
            "a secret or token is in the logs:\n{logs}"
        );
    }
}

/// Two Redlock URLs of one server (`127.0.0.1:P` and `localhost:P`) would
/// count twice towards the quorum: start-up refuses them, naming both.
#[tokio::test]
async fn one_server_given_twice_to_redlock_is_refused() {
    let a = RedisServer::spawn().await;
    let b = RedisServer::spawn().await;
    let by_address = a.url();
    let by_name = format!("redis://localhost:{}", a.port());
    let mut cmd = lockd();
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--redis-url", &by_address, "--redis-url", &by_name])
        .args(["--redis-url", &b.url()]);
    let exit = run(cmd).await;
    exit.expect(2);
    assert!(
        exit.stderr.contains("the same Redis server")
            && exit.stderr.contains(&format!("localhost:{}", a.port())),
        "{}",
        exit.stderr
    );
}

/// SIGTERM and SIGHUP are caught from the moment lockd says it listens:
/// a signal sent then, before lockd has served a request, shuts it down
/// cleanly (exit 0) or reloads, where it took the default action and
/// killed lockd (no exit code) when the handlers were installed only once
/// the serving loop first ran, which a busy machine delays.
#[tokio::test]
async fn signals_sent_as_lockd_starts_listening_are_caught() {
    for round in 0..16 {
        let mut cmd = lockd();
        cmd.args(["serve", "--dev", "--listen", "127.0.0.1:0"]);
        signal_once_it_logs(cmd, "lockd listening", round % 2 == 1, round).await;
    }
}

/// Starts `cmd` (a `lockd serve`) logging at info and waits until its log
/// says `line`; then, when `hangup`, sends SIGHUP, which must not stop it;
/// then SIGTERM, which must stop it cleanly (exit 0, "stopped").
async fn signal_once_it_logs(mut cmd: Command, line: &str, hangup: bool, round: usize) {
    cmd.env("LOCKD_LOG", "info");
    let mut child = Lockd::spawn(cmd);
    let started = Instant::now();
    while !child.stderr().contains(line) {
        assert!(
            child.exited().is_none() && started.elapsed() < Duration::from_secs(60),
            "round {round}: lockd never logged {line:?}:\n{}",
            child.stderr()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if hangup {
        child.signal(Signal::SIGHUP);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            child.exited().is_none(),
            "round {round}: SIGHUP after {line:?} stopped lockd:\n{}",
            child.stderr()
        );
    }
    let exit = child.terminate().await;
    assert_eq!(
        exit.status.code(),
        Some(0),
        "round {round}: {:?}\n{}",
        exit.status,
        exit.stderr
    );
    assert!(
        exit.stderr.contains("stopped"),
        "round {round}:\n{}",
        exit.stderr
    );
}

/// Start-up waits for Redis (seconds, when it takes connections and never
/// answers), and a SIGHUP then (a reload soon after `systemctl start`) or a
/// SIGTERM (a stop) must not take the default action and kill lockd: the
/// SIGHUP is caught, the SIGTERM stops it cleanly, exit 0.
#[tokio::test]
async fn signals_sent_while_lockd_waits_for_redis_at_start_up_are_caught() {
    // A "Redis" that takes connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for conn in silent.incoming().flatten() {
            keep.lock().unwrap().push(conn);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let made = run_blocking(
        lockd()
            .args(["keygen", "--id", "ops", "--prefix", "*", "--keys-file"])
            .arg(&keys)
            .stdin(Stdio::null()),
    );
    assert!(made.status.success(), "{}", made.stderr);
    for round in 0..4 {
        let mut cmd = lockd();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--redis-url", &url])
            .arg("--auth-keys-file")
            .arg(&keys);
        signal_once_it_logs(cmd, "API keys loaded", round % 2 == 0, round).await;
    }
    drop(held);
}

/// A Redis that does not answer at start-up: one warning names the node,
/// never its password, and lockd serves all the same.
#[tokio::test]
async fn an_unreachable_redis_at_start_up_is_named_in_one_warning() {
    let port = free_port();
    let url = format!("redis://:sekret-pw@127.0.0.1:{port}");
    let (child, _) = start_lockd(&["--redis-url", &url], "info").await;
    let (code, logs) = terminate(child).await;
    assert_eq!(code, Some(0), "{logs}");
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("did not answer at start-up"))
        .collect();
    assert_eq!(warnings.len(), 1, "{logs}");
    assert!(warnings[0].contains(&format!("127.0.0.1:{port}")), "{logs}");
    assert!(
        !logs.contains("sekret-pw"),
        "the password was logged:\n{logs}"
    );
}

/// Bad values on the command line, in the environment and in the keys file
/// say what is allowed and where the value came from, on one line.
#[tokio::test]
async fn bad_values_say_what_is_allowed_and_where_they_came_from() {
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = lockd();
        cmd.arg("serve").args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    };
    let cases: Vec<(Command, &str)> = vec![
        (
            serve(&["--dev", "--listen", "localhost:18090"], &[]),
            "an IP address and a port are needed",
        ),
        (
            serve(&["--dev"], &[("LOCKD_MAX_TTL_MS", "abc")]),
            "for LOCKD_MAX_TTL_MS (the variable of --max-ttl-ms)",
        ),
        (
            serve(&["--dev", "--max-ttl-ms", "-1"], &[]),
            "a whole number of milliseconds",
        ),
        (
            serve(&["--dev", "--max-wait-ms", "18446744073709551615"], &[]),
            "max_wait_ms must be at most 31536000000 (365 days)",
        ),
        (
            {
                let mut cmd = lockd();
                cmd.args(["exec", "--ttl-ms", "-1", "x", "--", "true"]);
                cmd
            },
            "a whole number of milliseconds",
        ),
    ];
    for (cmd, says) in cases {
        let shown = format!("{cmd:?}");
        let exit = run(cmd).await;
        exit.expect(2);
        assert!(exit.stderr.contains(says), "{shown}: {}", exit.stderr);
        assert!(!exit.stderr.contains("-- -1"), "{shown}: {}", exit.stderr);
    }
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    std::fs::write(&keys, "bad\n").unwrap();
    let mut cmd = lockd();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--auth-keys-file"])
        .arg(&keys)
        .args(["--redis-url", "redis://127.0.0.1:1"]);
    let exit = run(cmd).await;
    exit.expect(2);
    let lines: Vec<&str> = exit.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", exit.stderr);
    assert!(
        lines[0].starts_with("lockd: invalid keys file") && lines[0].contains("line 1"),
        "{}",
        exit.stderr
    );
}
