//! `lockd exec` and the shell subcommands (`acquire`, `extend`, `release`,
//! `status`) through the real `lockd` binary, against a lockd served
//! in-process over a real redis-server (or, to pause or kill the server
//! itself, a `lockd serve` process), and against several lockd servers on
//! one Redis, some of them dead, hanging or failing.
//!
//! Commands run under `lockd exec` are small `sh` scripts that talk back
//! through files in a scratch directory (`$DIR`). Every spawned `lockd` is
//! a [`Lockd`] guard: dropping it kills lockd and the command's process
//! group, so a failing test leaves no process behind. Waits poll with
//! deadlines; the deadlines are generous for a busy 2-core machine.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    self, LIMIT, LOCKD, LinkProxy, Lockd, TestApp, assert_lease_ms, eventually, free_port, metric,
    run,
};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::{Value, json};

/// How long a command may take to start under `lockd exec`.
const STARTUP: Duration = Duration::from_secs(20);
/// A script line that waits until the test creates `$DIR/go`.
const WAIT_FOR_GO: &str = r#"while [ ! -f "$DIR/go" ]; do sleep 0.05; done"#;

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A scratch directory, passed to commands as `$DIR`.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("scratch dir"),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn exists(&self, file: &str) -> bool {
        self.path(file).exists()
    }

    /// The file's text, empty when it does not exist.
    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path(file)).unwrap_or_default()
    }

    /// The file's non-empty lines, trimmed.
    fn lines(&self, file: &str) -> Vec<String> {
        self.read(file)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn touch(&self, file: &str) {
        std::fs::write(self.path(file), b"").expect("create a marker file");
    }
}

/// `lockd` as [`support::lockd`] starts it, with `$DIR` and `$LOCKD_BIN`
/// (this binary, for scripts that call it) set.
fn lockd(dir: &Scratch) -> Command {
    let mut cmd = support::lockd();
    cmd.env("DIR", dir.root()).env("LOCKD_BIN", LOCKD);
    cmd
}

/// `lockd exec --server <server> <flags> <name> -- <command>`.
fn exec<S: AsRef<OsStr>>(
    dir: &Scratch,
    server: &str,
    flags: &[&str],
    name: &str,
    command: &[S],
) -> Command {
    let mut cmd = lockd(dir);
    cmd.args(["exec", "--server", server])
        .args(flags)
        .arg(name)
        .arg("--")
        .args(command);
    cmd
}

/// `sh -c <script>`, after a line that records the shell's pid in
/// `$PGID_FILE` so that [`Lockd`] can kill the command's process group.
fn sh(script: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("echo $$ > \"$PGID_FILE\"; {script}"),
    ]
}

/// `lockd keygen <args> --keys-file <keys>`: the secret it printed.
async fn keygen(dir: &Scratch, keys: &Path, args: &[&str]) -> String {
    let mut cmd = lockd(dir);
    cmd.arg("keygen").args(args).arg("--keys-file").arg(keys);
    run(cmd).await.expect(0).stdout.trim().to_owned()
}

/// Asserts that lock `name` is free: the API answers 404 and Redis has no
/// lock key.
async fn assert_free(app: &TestApp, name: &str) {
    let reply = app.inspect(name).await;
    assert_eq!(
        reply.status.as_u16(),
        404,
        "{name} is still held: {}",
        reply.text
    );
    assert_eq!(
        app.redis_server().lock_token(name).await,
        None,
        "{name} still has a lock key in Redis"
    );
}

/// Waits up to `within` for lock `name` to be free, then asserts it.
async fn assert_free_within(app: &TestApp, name: &str, within: Duration) {
    eventually(within, || async {
        app.inspect(name).await.status.as_u16() == 404
            && app.redis_server().lock_token(name).await.is_none()
    })
    .await;
    assert_free(app, name).await;
}

/// Whether process `pid` is gone (no `/proc` entry, or a zombie nobody
/// reaped: orphans here may be reparented to a PID 1 that does not reap).
fn process_is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `pid (comm) S ...`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// The process group of `pid` (field 5 of `/proc/<pid>/stat`).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Whether process `pid` catches signal `sig` (from `SigCgt` in
/// `/proc/<pid>/status`): lockd exec installs its handlers before its
/// first request.
fn catches(pid: Pid, sig: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as i32 - 1)) != 0)
}

/// Waits until the server has at least one request waiting for a lock
/// (`lockd_waiters`).
async fn wait_for_a_waiter(app: &TestApp) {
    let waiting = eventually(STARTUP, || async {
        metric(&app.metrics().await, "lockd_waiters", &[]).is_some_and(|n| n >= 1.0)
    })
    .await;
    assert!(waiting, "no request waited for a lock within {STARTUP:?}");
}

// ---------------------------------------------------------------------------
// One holder at a time
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_exec_on_the_same_name_fails_fast_with_75() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:one";
    let script = format!(r#"touch "$DIR/started"; {WAIT_FOR_GO}"#);
    let mut first = Lockd::spawn(exec(&dir, &server, &[], name, &sh(&script)));
    first.wait_for_file(&dir.path("started"), STARTUP).await;

    // The first holds it, under its default owner `hostname:pid`.
    let status = app.inspect(name).await;
    status.expect_status(200);
    let owner = status.str("owner");
    assert!(
        owner.ends_with(&format!(":{}", first.pid())),
        "owner {owner:?} is not hostname:<pid of the first lockd exec>"
    );
    // ... and its default meta `{"host": hostname, "pid": pid}`.
    let meta = &status.json()["meta"];
    assert_eq!(meta["pid"], first.pid().as_raw(), "{meta}");
    assert_eq!(
        format!(
            "{}:{}",
            meta["host"].as_str().unwrap_or_default(),
            first.pid()
        ),
        owner,
        "{meta}"
    );

    let second = sh(r#"touch "$DIR/second-ran""#);
    let refused = run(exec(&dir, &server, &["--wait-ms", "0"], name, &second)).await;
    refused.expect(75);
    assert!(
        refused.took < Duration::from_secs(3),
        "a refused exec took {:?}",
        refused.took
    );
    assert!(
        refused.stderr.contains("held by another holder"),
        "{}",
        refused.stderr
    );
    // Without --wait-ms it fails at once as well.
    run(exec(&dir, &server, &[], name, &second))
        .await
        .expect(75);
    let custom = run(exec(
        &dir,
        &server,
        &["--conflict-exit-code", "9"],
        name,
        &second,
    ))
    .await;
    custom.expect(9);
    assert!(
        !dir.exists("second-ran"),
        "a refused exec ran its command anyway"
    );
    // The refused attempts did not disturb the holder.
    assert_eq!(app.inspect(name).await.str("owner"), owner);

    dir.touch("go");
    first.wait(LIMIT).await.expect(0);
    assert_free(&app, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_exec_runs_after_the_holder_finishes() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:queue";
    let first_script = format!(
        r#"echo first-start >> "$DIR/log"; touch "$DIR/started"; {WAIT_FOR_GO}; echo first-end >> "$DIR/log""#
    );
    let mut first = Lockd::spawn(exec(&dir, &server, &[], name, &sh(&first_script)));
    first.wait_for_file(&dir.path("started"), STARTUP).await;

    let mut second = Lockd::spawn(exec(
        &dir,
        &server,
        &["--wait-ms", "20000"],
        name,
        &sh(r#"echo second >> "$DIR/log""#),
    ));
    wait_for_a_waiter(&app).await;
    assert!(second.exited().is_none(), "the waiting exec gave up");
    assert_eq!(dir.lines("log"), ["first-start"]);

    dir.touch("go");
    first.wait(LIMIT).await.expect(0);
    second.wait(LIMIT).await.expect(0);
    assert_eq!(dir.lines("log"), ["first-start", "first-end", "second"]);
    assert_free(&app, name).await;
}

/// The waiting exec's lease starts when it is granted, not when it started
/// waiting: after a wait longer than its TTL it must still run its command
/// to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_a_waiting_exec_counts_its_lease_from_the_grant_not_the_request() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:long-wait";
    let first_script = format!(r#"touch "$DIR/started"; {WAIT_FOR_GO}"#);
    let mut first = Lockd::spawn(exec(&dir, &server, &[], name, &sh(&first_script)));
    first.wait_for_file(&dir.path("started"), STARTUP).await;

    let mut second = Lockd::spawn(exec(
        &dir,
        &server,
        &[
            "--ttl-ms",
            "1500",
            "--wait-ms",
            "30000",
            "--kill-grace-ms",
            "500",
        ],
        name,
        &sh(r#"sleep 2; echo done > "$DIR/second-done""#),
    ));
    wait_for_a_waiter(&app).await;
    // Wait more than the second's TTL before letting it in.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    dir.touch("go");
    first.wait(LIMIT).await.expect(0);
    let second = second.wait(LIMIT).await;
    second.expect(0);
    assert_eq!(dir.read("second-done").trim(), "done");
    assert_free(&app, name).await;
}

// ---------------------------------------------------------------------------
// The command's environment and process group
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_sees_a_fence_that_grows_across_runs() {
    let app = TestApp::redis().await;
    // Each run's extend is sent after this.
    let sent = Instant::now();
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:fence";
    // Each run records its environment, then asks about its own lock with
    // the shell subcommands, which read LOCKD_NAME, LOCKD_SERVER and
    // LOCKD_TOKEN from that same environment.
    let script = r#"
        echo "$LOCKD_FENCE $LOCKD_NAME $LOCKD_TOKEN $LOCKD_SERVER" >> "$DIR/env"
        "$LOCKD_BIN" status > "$DIR/status-$LOCKD_FENCE"
        "$LOCKD_BIN" extend --ttl-ms 20000 > "$DIR/extend-$LOCKD_FENCE"
    "#;
    for _ in 0..3 {
        run(exec(
            &dir,
            &server,
            &[
                "--owner",
                "nightly-job",
                "--meta",
                r#"{"leader":"10.0.0.7:8080"}"#,
                "--ttl-ms",
                "10000",
            ],
            name,
            &sh(script),
        ))
        .await
        .expect(0);
        assert_free(&app, name).await;
    }

    let runs: Vec<Vec<String>> = dir
        .lines("env")
        .iter()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    let mut fences = Vec::new();
    let mut tokens = Vec::new();
    for run in &runs {
        assert_eq!(run.len(), 4, "an empty variable: {run:?}");
        let fence: u64 = run[0].parse().expect("LOCKD_FENCE is a number");
        assert_eq!(run[1], name, "LOCKD_NAME");
        assert_eq!(run[2].len(), 32, "LOCKD_TOKEN {:?}", run[2]);
        assert_eq!(run[3], server, "LOCKD_SERVER");

        let status: Value = serde_json::from_str(&dir.read(&format!("status-{fence}")))
            .expect("lockd status printed JSON");
        assert_eq!(status["held"], true);
        assert_eq!(status["fence"], fence);
        assert_eq!(status["owner"], "nightly-job");
        assert_eq!(status["meta"], json!({"leader": "10.0.0.7:8080"}));
        let extended: Value = serde_json::from_str(&dir.read(&format!("extend-{fence}")))
            .expect("lockd extend printed JSON");
        assert_eq!(extended["fence"], fence);
        assert_lease_ms(extended["ttl_ms"].as_u64(), 20000, sent);
        fences.push(fence);
        tokens.push(run[2].clone());
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences do not grow: {fences:?}"
    );
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    assert_eq!(distinct.len(), 3, "a token was reused: {tokens:?}");
    assert_eq!(
        app.redis_server().fence_counter(name).await,
        fences.last().copied()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_has_its_own_process_group_unless_foreground() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:pgrp";
    // Written aside, then moved: the file appears with its content whole.
    let script =
        format!(r#"echo $$ > "$DIR/pid.tmp"; mv "$DIR/pid.tmp" "$DIR/pid"; {WAIT_FOR_GO}"#);

    let mut own = Lockd::spawn(exec(&dir, &server, &[], name, &sh(&script)));
    own.wait_for_file(&dir.path("pid"), STARTUP).await;
    let pid: u32 = dir.read("pid").trim().parse().unwrap();
    assert_eq!(process_group(pid), Some(pid), "not a group leader");
    dir.touch("go");
    own.wait(LIMIT).await.expect(0);
    assert_free(&app, name).await;

    std::fs::remove_file(dir.path("go")).unwrap();
    std::fs::remove_file(dir.path("pid")).unwrap();
    let mut fg = Lockd::spawn(exec(&dir, &server, &["--foreground"], name, &sh(&script)));
    fg.wait_for_file(&dir.path("pid"), STARTUP).await;
    let pid: u32 = dir.read("pid").trim().parse().unwrap();
    let exec_pid = u32::try_from(fg.pid().as_raw()).unwrap();
    assert_eq!(
        process_group(pid),
        process_group(exec_pid),
        "--foreground: the command is not in lockd's group"
    );
    assert_ne!(process_group(pid), Some(pid));
    dir.touch("go");
    fg.wait(LIMIT).await.expect(0);
    assert_free(&app, name).await;
}

// ---------------------------------------------------------------------------
// Renewal and a lost lease
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_longer_than_the_ttl_keeps_the_lock_by_renewing() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:renew";
    let script = format!(r#"touch "$DIR/started"; {WAIT_FOR_GO}"#);
    let mut running = Lockd::spawn(exec(
        &dir,
        &server,
        &["--ttl-ms", "900"],
        name,
        &sh(&script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    let token = app
        .redis_server()
        .lock_token(name)
        .await
        .expect("the lock is held while the command runs");
    // Watch for four TTLs: the same token holds it all along.
    let watch_until = Instant::now() + Duration::from_millis(3600);
    while Instant::now() < watch_until {
        assert_eq!(
            app.redis_server().lock_token(name).await.as_deref(),
            Some(token.as_str()),
            "the lease lapsed while the command ran; lockd's stderr:\n{}",
            running.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    dir.touch("go");
    running.wait(LIMIT).await.expect(0);
    assert_free(&app, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_lease_is_deleted_is_stopped_with_70() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:deleted";
    let script = r#"
        trap 'echo TERM >> "$DIR/trap"; exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut running = Lockd::spawn(exec(&dir, &server, &["--ttl-ms", "900"], name, &sh(script)));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    assert!(app.redis_server().lock_token(name).await.is_some());

    app.redis_server().drop_lock(name).await;
    let dropped = Instant::now();
    let exit = running.wait(LIMIT).await;
    exit.expect(70);
    assert!(
        dropped.elapsed() < Duration::from_secs(8),
        "stopping the command took {:?} after the lease was deleted",
        dropped.elapsed()
    );
    assert_eq!(
        dir.lines("trap"),
        ["TERM"],
        "the command did not get SIGTERM"
    );
    assert!(exit.stderr.contains("404"), "{}", exit.stderr);
    assert!(exit.stderr.contains("lease"), "{}", exit.stderr);
    assert_free(&app, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_lock_is_taken_by_another_holder_is_stopped_with_70() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:stolen";
    let script = r#"
        trap 'echo TERM >> "$DIR/trap"; exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut running = Lockd::spawn(exec(&dir, &server, &["--ttl-ms", "900"], name, &sh(script)));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    // Another client overwrites the lock (as after an expiry and a new grant).
    let thief = crate::support::random_token();
    app.redis_server().set_lock(name, &thief, 60_000).await;

    let exit = running.wait(LIMIT).await;
    exit.expect(70);
    assert_eq!(dir.lines("trap"), ["TERM"]);
    assert!(exit.stderr.contains("409"), "{}", exit.stderr);
    // lockd exec must not release the other holder's lock.
    assert_eq!(app.redis_server().lock_token(name).await, Some(thief));
}

/// An operator breaks the lock of a stuck job with `lockd break` (an admin
/// key from `lockd keygen`): the job's next renewal gets 404, and `lockd
/// exec` stops its command as for any lost lease (70). `lockd history`
/// then says who broke it; a key without `admin` is refused (64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_lock_is_broken_by_lockd_break_is_stopped_with_70() {
    let dir = Scratch::new();
    let keys = dir.path("keys.toml");
    let job_key = keygen(&dir, &keys, &["--id", "job", "--prefix", "exec:"]).await;
    let ops_key = keygen(
        &dir,
        &keys,
        &["--id", "ops", "--prefix", "*", "--permission", "read,admin"],
    )
    .await;
    let app = TestApp::redis_with(|s| s.auth.keys_file = Some(keys.clone())).await;
    let server = app.url("");
    let name = "exec:broken";
    let script = r#"
        trap 'echo TERM >> "$DIR/trap"; exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut job = exec(&dir, &server, &["--ttl-ms", "900"], name, &sh(script));
    job.env("LOCKD_API_KEY", &job_key);
    let mut running = Lockd::spawn(job);
    running.wait_for_file(&dir.path("started"), STARTUP).await;

    let shell_as = |key: &str, args: &[&str]| {
        let mut cmd = lockd(&dir);
        cmd.args(args)
            .args(["--server", &server])
            .env("LOCKD_API_KEY", key);
        cmd
    };
    run(shell_as(&job_key, &["break", name])).await.expect(64);
    let broke = run(shell_as(&ops_key, &["break", name])).await;
    broke.expect(0);
    let answer: serde_json::Value = serde_json::from_str(&broke.stdout).expect("JSON");
    // Whose lease ended: lockd exec's, with the host and pid it sends.
    assert!(answer["broken"][0]["meta"]["pid"].is_u64(), "{answer}");
    let broken_at = Instant::now();

    let exit = running.wait(LIMIT).await;
    exit.expect(70);
    assert!(
        broken_at.elapsed() < Duration::from_secs(8),
        "stopping the command took {:?} after the break",
        broken_at.elapsed()
    );
    assert_eq!(
        dir.lines("trap"),
        ["TERM"],
        "the command did not get SIGTERM"
    );
    assert!(exit.stderr.contains("404"), "{}", exit.stderr);

    let history = run(shell_as(&ops_key, &["history", name])).await;
    history.expect(0);
    let history: serde_json::Value = serde_json::from_str(&history.stdout).expect("JSON");
    assert_eq!(history["entries"][0]["ended"], "broken", "{history}");
    assert_eq!(history["entries"][0]["broken_by"], "ops", "{history}");
    // Nothing left to break: 404 lock-not-held, exit 1.
    run(shell_as(&ops_key, &["break", name])).await.expect(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:stubborn";
    let script = r#"
        trap '' TERM
        sleep 60 &
        echo $! > "$DIR/grandchild"
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut running = Lockd::spawn(exec(
        &dir,
        &server,
        &["--ttl-ms", "900", "--kill-grace-ms", "500"],
        name,
        &sh(script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    let child: u32 = running.command_pid().unwrap().as_raw().try_into().unwrap();
    let grandchild: u32 = dir.read("grandchild").trim().parse().unwrap();
    assert!(!process_is_gone(grandchild));

    app.redis_server().drop_lock(name).await;
    let dropped = Instant::now();
    let exit = running.wait(LIMIT).await;
    let after = dropped.elapsed();
    exit.expect(70);
    assert!(
        after >= Duration::from_millis(500),
        "SIGKILL came {after:?} after the lease was deleted, before the grace"
    );
    assert!(
        after < Duration::from_secs(10),
        "stopping took {after:?} after the lease was deleted"
    );
    assert!(exit.stderr.contains("SIGKILL"), "{}", exit.stderr);
    let gone = eventually(Duration::from_secs(5), || async {
        process_is_gone(child) && process_is_gone(grandchild)
    })
    .await;
    assert!(
        gone,
        "the command ({child}: {}) or its grandchild ({grandchild}: {}) survived",
        process_is_gone(child),
        process_is_gone(grandchild)
    );
    assert_free(&app, name).await;
}

/// When the lease is lost and the command exits on SIGTERM at once, a
/// process it started that ignores SIGTERM does not outlive it: the group
/// gets SIGKILL as soon as the command is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_that_ignores_sigterm_dies_with_a_lost_lease() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:orphan";
    let script = r#"
        sh -c 'trap "" TERM; exec sleep 60' &
        echo $! > "$DIR/grandchild.tmp"; mv "$DIR/grandchild.tmp" "$DIR/grandchild"
        trap 'exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut running = Lockd::spawn(exec(
        &dir,
        &server,
        &["--ttl-ms", "900", "--kill-grace-ms", "5000"],
        name,
        &sh(script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    running
        .wait_for_file(&dir.path("grandchild"), STARTUP)
        .await;
    let grandchild: u32 = dir.read("grandchild").trim().parse().unwrap();
    assert!(!process_is_gone(grandchild));
    app.redis_server().drop_lock(name).await;
    let exit = running.wait(LIMIT).await;
    exit.expect(70);
    let gone = eventually(Duration::from_secs(3), || async {
        process_is_gone(grandchild)
    })
    .await;
    assert!(gone, "the grandchild {grandchild} outlived the lost lease");
    assert_free(&app, name).await;
}

/// The state letter of process `pid` (`S`, `T` for stopped, ...).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Ctrl-Z (SIGTSTP to lockd exec) stops the command with it, and SIGCONT
/// (what `fg` sends) resumes both; the command then finishes under the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_z_stops_the_command_too_and_fg_resumes_it() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:ctrl-z";
    let script = r#"touch "$DIR/started"; while [ ! -f "$DIR/go" ]; do sleep 0.05; done; echo done > "$DIR/done""#;
    let mut running = Lockd::spawn(exec(
        &dir,
        &server,
        &["--ttl-ms", "30000"],
        name,
        &sh(script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    let command: u32 = running.command_pid().unwrap().as_raw().try_into().unwrap();

    running.signal(Signal::SIGTSTP);
    let stopped = eventually(Duration::from_secs(5), || async {
        process_state(command) == Some('T')
    })
    .await;
    assert!(
        stopped,
        "the command was not stopped: {:?}",
        process_state(command)
    );

    running.signal(Signal::SIGCONT);
    let resumed = eventually(Duration::from_secs(5), || async {
        process_state(command) != Some('T')
    })
    .await;
    assert!(resumed, "the command was not resumed");
    dir.touch("go");
    running.wait(LIMIT).await.expect(0);
    assert_eq!(dir.read("done").trim(), "done");
    assert_free(&app, name).await;
}

/// The server itself stops answering (a `lockd serve` process, SIGSTOPped)
/// while the command runs: the lease runs out locally and the command is
/// stopped before anyone else can be granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_means_a_lost_lease() {
    let app = TestApp::redis().await;
    let served = Lockd::serve(
        &["--redis-url", &app.redis_server().url()],
        &[("LOCKD_LOG", "warn")],
    )
    .await;
    let dir = Scratch::new();
    let name = "exec:paused";
    let script = r#"
        trap 'echo TERM >> "$DIR/trap"; exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut running = Lockd::spawn(exec(
        &dir,
        &served.url(""),
        &["--ttl-ms", "1500", "--kill-grace-ms", "500"],
        name,
        &sh(script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;

    served.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    // The command must be stopped within the TTL (plus slack): the lease
    // ends at most a TTL after the last successful renewal.
    running
        .wait_for_file(&dir.path("trap"), Duration::from_millis(1500 + 4000))
        .await;
    let signalled = stopped.elapsed();
    let exit = running.wait(LIMIT).await;
    let exited = stopped.elapsed();
    served.signal(Signal::SIGCONT);
    exit.expect(70);
    assert_eq!(dir.lines("trap"), ["TERM"]);
    assert!(exit.stderr.contains("with no renewal"), "{}", exit.stderr);
    eprintln!("command stopped {signalled:?} and lockd exited {exited:?} after the pause");
    // The lease ended at most a TTL after the pause (the last renewal came
    // before it), and the command was told --kill-grace-ms before that: it
    // is gone by the time another holder can have the lock.
    assert!(
        signalled < Duration::from_millis(1500),
        "SIGTERM came {signalled:?} after the pause: not before the lease's end"
    );
    assert_free_within(&app, name, Duration::from_secs(10)).await;
}

/// After the lease ran out with the server paused, lockd exec should exit
/// about when it stopped the command, not hang on a release that cannot
/// be answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_does_not_delay_the_exit_by_the_release() {
    let app = TestApp::redis().await;
    let served = Lockd::serve(
        &["--redis-url", &app.redis_server().url()],
        &[("LOCKD_LOG", "warn")],
    )
    .await;
    let dir = Scratch::new();
    let name = "exec:paused-exit";
    let script = r#"touch "$DIR/started"; while :; do sleep 0.05; done"#;
    let mut running = Lockd::spawn(exec(
        &dir,
        &served.url(""),
        &["--ttl-ms", "1500", "--kill-grace-ms", "500"],
        name,
        &sh(script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    served.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let exit = running.wait(LIMIT).await;
    let exited = stopped.elapsed();
    served.signal(Signal::SIGCONT);
    exit.expect(70);
    assert!(
        exited < Duration::from_millis(1500 + 500 + 5000),
        "lockd exec exited {exited:?} after the server paused (TTL 1.5 s, grace 0.5 s)"
    );
    assert_free_within(&app, name, Duration::from_secs(10)).await;
}

/// Redis stops answering (the server answers 503) while the command runs:
/// renewals fail, the lease runs out and the command is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_means_a_lost_lease() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(200)).await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:outage";
    let script = r#"
        trap 'echo TERM >> "$DIR/trap"; exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let mut running = Lockd::spawn(exec(
        &dir,
        &server,
        &["--ttl-ms", "1500", "--kill-grace-ms", "500"],
        name,
        &sh(script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    app.redis_server().sigstop();
    let stopped = Instant::now();
    let exit = running.wait(LIMIT).await;
    let exited = stopped.elapsed();
    app.redis_server().sigcont();
    exit.expect(70);
    assert_eq!(dir.lines("trap"), ["TERM"]);
    assert!(
        exited < Duration::from_millis(1500 + 500 + 5000),
        "lockd exec exited {exited:?} after Redis paused"
    );
    assert!(exit.stderr.contains("503"), "{}", exit.stderr);
    assert!(exit.stderr.contains("with no renewal"), "{}", exit.stderr);
    assert_free_within(&app, name, Duration::from_secs(10)).await;
}

// ---------------------------------------------------------------------------
// Exit statuses
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_statuses_pass_through() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:status";
    for (script, code) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
    ] {
        let exit = run(exec(&dir, &server, &[], name, &sh(script))).await;
        assert_eq!(exit.code(), code, "`{script}`; stderr:\n{}", exit.stderr);
        assert_free(&app, name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_not_found_is_127() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:missing";
    for command in [
        "lockd-test-no-such-command",
        "/nonexistent/lockd-test-no-such-command",
    ] {
        let exit = run(exec(&dir, &server, &[], name, &[command])).await;
        exit.expect(127);
        assert!(exit.stderr.contains(command), "{}", exit.stderr);
        assert_free(&app, name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_run_is_126() {
    use std::os::unix::fs::PermissionsExt as _;
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:noexec";
    let script = dir.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\ntouch \"$DIR/ran\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let exit = run(exec(&dir, &server, &[], name, &[&script])).await;
    exit.expect(126);
    assert!(!dir.exists("ran"));
    assert_free(&app, name).await;
}

// ---------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_sent_to_exec_reach_the_child() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:signals";
    let script = r#"
        trap 'echo TERM > "$DIR/got"; exit 7' TERM
        trap 'echo INT > "$DIR/got"; exit 8' INT
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    for (sig, seen, code) in [(Signal::SIGTERM, "TERM", 7), (Signal::SIGINT, "INT", 8)] {
        let _ = std::fs::remove_file(dir.path("started"));
        let _ = std::fs::remove_file(dir.path("got"));
        let mut running = Lockd::spawn(exec(&dir, &server, &[], name, &sh(script)));
        running.wait_for_file(&dir.path("started"), STARTUP).await;
        running.signal(sig);
        let exit = running.wait(LIMIT).await;
        assert_eq!(
            dir.read("got").trim(),
            seen,
            "{sig}: the command did not see it"
        );
        exit.expect(code);
        assert_free(&app, name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarded_signal_reaches_the_child() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:more-signals";
    let script = format!(
        r#"
        ulimit -c 0
        for s in HUP QUIT USR1 USR2; do trap "echo $s >> \"\$DIR/got\"" $s; done
        touch "$DIR/started"
        {WAIT_FOR_GO}
        exit 5
    "#
    );
    let mut running = Lockd::spawn(exec(&dir, &server, &[], name, &sh(&script)));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    let mut expected = Vec::new();
    for (sig, seen) in [
        (Signal::SIGHUP, "HUP"),
        (Signal::SIGQUIT, "QUIT"),
        (Signal::SIGUSR1, "USR1"),
        (Signal::SIGUSR2, "USR2"),
    ] {
        running.signal(sig);
        expected.push(seen.to_owned());
        let arrived = eventually(STARTUP, || async { dir.lines("got") == expected }).await;
        assert!(
            arrived,
            "after {sig} the command saw {:?}; lockd's stderr:\n{}",
            dir.lines("got"),
            running.stderr()
        );
        assert!(running.exited().is_none(), "{sig} stopped lockd exec");
    }
    dir.touch("go");
    running.wait(LIMIT).await.expect(5);
    assert_free(&app, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_before_the_command_started_exits_128_plus_n() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:early-signal";
    let held = app.acquire_ttl(name, 60_000).await;
    held.expect_status(201);
    let token = held.token();
    for (sig, code) in [(Signal::SIGTERM, 143), (Signal::SIGINT, 130)] {
        let mut waiting = Lockd::spawn(exec(
            &dir,
            &server,
            &["--wait-ms", "30000"],
            name,
            &sh(r#"touch "$DIR/ran""#),
        ));
        let pid = waiting.pid();
        let ready = eventually(STARTUP, || async { catches(pid, sig) }).await;
        assert!(ready, "lockd exec never caught {sig}");
        wait_for_a_waiter(&app).await;
        waiting.signal(sig);
        let exit = waiting.wait(LIMIT).await;
        exit.expect(code);
        assert!(
            exit.stderr.contains("before the command started"),
            "{}",
            exit.stderr
        );
        assert!(!dir.exists("ran"), "{sig}: the command ran");
        // The other holder keeps its lock.
        assert_eq!(
            app.redis_server().lock_token(name).await.as_deref(),
            Some(token.as_str())
        );
    }
    // Once the holder releases, the abandoned waits must not be granted.
    app.release(name, &token).await.expect_status(204);
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        assert_free(&app, name).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// No command run: the server is unreachable, failing, or refuses
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_exits_69_without_running_the_command() {
    let dir = Scratch::new();
    let server = format!("http://127.0.0.1:{}", free_port());
    let exit = run(exec(
        &dir,
        &server,
        &[],
        "exec:nowhere",
        &sh(r#"touch "$DIR/ran""#),
    ))
    .await;
    exit.expect(69);
    assert!(!dir.exists("ran"));
    assert!(exit.stderr.contains("no answer from"), "{}", exit.stderr);
    assert!(exit.stderr.contains("not run"), "{}", exit.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_exits_69() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(200)).await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:503";
    app.redis_server().sigstop();
    let exit = run(exec(
        &dir,
        &server,
        &["--ttl-ms", "2000"],
        name,
        &sh(r#"touch "$DIR/ran""#),
    ))
    .await;
    app.redis_server().sigcont();
    exit.expect(69);
    assert!(!dir.exists("ran"));
    assert!(exit.stderr.contains("503"), "{}", exit.stderr);
    // Commands Redis queued while it was paused may still grant the lock,
    // but only for its 2 s lease.
    assert_free_within(&app, name, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_exits_64() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let command = sh(r#"touch "$DIR/ran""#);
    // A name no lock can have is refused before any request.
    for name in ["bad name", "..", "."] {
        let exit = run(exec(&dir, &server, &[], name, &command)).await;
        exit.expect(64);
        assert!(exit.stderr.contains("not a usable name"), "{}", exit.stderr);
        assert!(!dir.exists("ran"), "{name:?}: the command ran");
    }
    for (flags, name) in [
        (&["--ttl-ms", "0"][..], "exec:ttl0"),
        (&["--wait-ms", "99999999"][..], "exec:long-wait"),
    ] {
        let exit = run(exec(&dir, &server, flags, name, &command)).await;
        exit.expect(64);
        assert!(
            exit.stderr.contains("refused") && exit.stderr.contains("400"),
            "{}",
            exit.stderr
        );
        assert!(!dir.exists("ran"), "{flags:?} {name:?}: the command ran");
    }
    assert_eq!(app.lock_key_count().await, 0);
    // A server URL that is not http(s) is a usage error too.
    let exit = run(exec(
        &dir,
        "redis://127.0.0.1:6379",
        &[],
        "exec:url",
        &command,
    ))
    .await;
    exit.expect(64);
    assert!(
        exit.stderr.contains("invalid server URL"),
        "{}",
        exit.stderr
    );
    assert!(!dir.exists("ran"));
}

/// `--server 127.0.0.1:8080` (no scheme; `localhost:8080` parses with the
/// scheme `localhost`) is refused with 64, saying that the URL needs
/// `http://` or `https://` and suggesting it, not "relative URL without a
/// base"; the command is not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_scheme_is_refused_suggesting_http() {
    let dir = Scratch::new();
    for server in ["127.0.0.1:8080", "localhost:8080"] {
        let suggestion = format!("http://{server}");
        let exit = run(exec(
            &dir,
            server,
            &[],
            "exec:url",
            &sh(r#"touch "$DIR/ran""#),
        ))
        .await;
        exit.expect(64);
        assert!(!dir.exists("ran"), "{server}: the command ran");
        let status = run(shell(&dir, server, &["status", "exec:url"])).await;
        status.expect(64);
        for stderr in [&exit.stderr, &status.stderr] {
            assert!(
                stderr.contains("needs http:// or https://") && stderr.contains(&suggestion),
                "{server}: {stderr}"
            );
            assert!(!stderr.contains("relative URL"), "{server}: {stderr}");
        }
    }
}

// ---------------------------------------------------------------------------
// The shell subcommands
// ---------------------------------------------------------------------------

/// `lockd <args> --server <server>`.
fn shell(dir: &Scratch, server: &str, args: &[&str]) -> Command {
    let mut cmd = lockd(dir);
    cmd.args(args).args(["--server", server]);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_subcommands_print_json_and_exit_by_status() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let sent = Instant::now();
    let name = "shell:job";

    let acquired = run(shell(
        &dir,
        &server,
        &["acquire", name, "--ttl-ms", "30000", "--owner", "me"],
    ))
    .await;
    acquired.expect(0);
    let grant = acquired.json();
    let token = grant["token"].as_str().expect("a token").to_owned();
    assert_eq!(grant["name"], name);
    assert_lease_ms(grant["ttl_ms"].as_u64(), 30000, sent);
    assert!(grant["fence"].as_u64().is_some(), "{grant}");
    assert!(acquired.stderr.is_empty(), "{}", acquired.stderr);
    assert_eq!(
        app.redis_server().lock_token(name).await.as_deref(),
        Some(token.as_str())
    );

    let again = run(shell(&dir, &server, &["acquire", name])).await;
    again.expect(75);
    let problem = again.json();
    assert_eq!(problem["status"], 409, "{problem}");
    assert!(again.stderr.contains("409"), "{}", again.stderr);

    let status = run(shell(&dir, &server, &["status", name])).await;
    status.expect(0);
    let held = status.json();
    assert_eq!(held["held"], true);
    assert_eq!(held["owner"], "me");
    assert_eq!(held["fence"], grant["fence"]);
    assert!(!status.stdout.contains(&token), "status shows the token");

    let sent = Instant::now();
    // The token from LOCKD_TOKEN, the name from LOCKD_NAME.
    let mut extend = shell(&dir, &server, &["extend", "--ttl-ms", "40000"]);
    extend.env("LOCKD_TOKEN", &token).env("LOCKD_NAME", name);
    let extended = run(extend).await;
    extended.expect(0);
    assert_lease_ms(extended.json()["ttl_ms"].as_u64(), 40000, sent);
    assert_eq!(extended.json()["fence"], grant["fence"]);

    // A wrong token is someone else's problem: 409.
    let wrong = crate::support::random_token();
    run(shell(&dir, &server, &["release", name, "--token", &wrong]))
        .await
        .expect(75);
    // No token at all is a usage error (clap: 2).
    let missing = run(shell(&dir, &server, &["release", name])).await;
    assert_ne!(missing.code(), 0, "release without a token succeeded");

    let mut release = shell(&dir, &server, &["release", name]);
    release.env("LOCKD_TOKEN", &token);
    let released = run(release).await;
    released.expect(0);
    assert_eq!(released.stdout, "", "a 204 printed something");

    let mut free = shell(&dir, &server, &["status"]);
    free.env("LOCKD_NAME", name);
    let free = run(free).await;
    free.expect(1);
    assert!(free.stderr.contains("404"), "{}", free.stderr);
    run(shell(&dir, &server, &["release", name, "--token", &token]))
        .await
        .expect(1);
    assert_free(&app, name).await;

    // A chosen token: a retry renews (200) instead of failing.
    let chosen = crate::support::random_token();
    for _ in 0..2 {
        let taken = run(shell(
            &dir,
            &server,
            &["acquire", name, "--token", &chosen, "--ttl-ms", "5000"],
        ))
        .await;
        taken.expect(0);
        assert_eq!(taken.json()["token"], chosen.as_str());
    }
    run(shell(&dir, &server, &["release", name, "--token", &chosen]))
        .await
        .expect(0);
    assert_free(&app, name).await;

    // A name no lock can have is refused before any request (`..` would
    // reach GET /locks once the URL is normalised).
    for name in ["bad name", "..", "."] {
        let bad = run(shell(&dir, &server, &["status", name])).await;
        bad.expect(64);
        assert!(bad.stderr.contains("not a usable name"), "{}", bad.stderr);
        assert_eq!(bad.stdout, "");
    }
    let bad_ttl = run(shell(&dir, &server, &["acquire", name, "--ttl-ms", "0"])).await;
    bad_ttl.expect(64);
    assert_free(&app, name).await;

    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let unreachable = run(shell(&dir, &nowhere, &["status", name])).await;
    unreachable.expect(69);
    assert_eq!(unreachable.stdout, "");
    assert!(
        unreachable.stderr.contains("no answer"),
        "{}",
        unreachable.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_subcommands_exit_69_on_a_server_error() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(200)).await;
    let dir = Scratch::new();
    let server = app.url("");
    app.redis_server().sigstop();
    let exit = run(shell(&dir, &server, &["status", "shell:down"])).await;
    app.redis_server().sigcont();
    exit.expect(69);
    assert_eq!(exit.json()["status"], 503);
    assert!(exit.stderr.contains("503"), "{}", exit.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_acquire_waits_with_wait_ms() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "shell:wait";
    let held = app.acquire_ttl(name, 60_000).await;
    held.expect_status(201);
    let mut waiting = Lockd::spawn(shell(
        &dir,
        &server,
        &["acquire", name, "--wait-ms", "20000", "--ttl-ms", "5000"],
    ));
    wait_for_a_waiter(&app).await;
    assert!(waiting.exited().is_none());
    app.release(name, &held.token()).await.expect_status(204);
    let exit = waiting.wait(LIMIT).await;
    exit.expect(0);
    let token = exit.json()["token"].as_str().unwrap().to_owned();
    run(shell(&dir, &server, &["release", name, "--token", &token]))
        .await
        .expect(0);
    assert_free(&app, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_lockd_keygen_lets_exec_and_status_in_and_none_gets_64() {
    let dir = Scratch::new();
    let keys = dir.path("keys.toml");
    let secret = keygen(&dir, &keys, &["--id", "cron", "--prefix", "cron:"]).await;
    assert!(secret.starts_with("lockd_"), "{secret}");
    let file = std::fs::read_to_string(&keys).unwrap();
    assert!(!file.contains(&secret), "the keys file holds the secret");
    // The same id twice is refused, and the file is left as it was.
    let mut again = lockd(&dir);
    again
        .args(["keygen", "--id", "cron", "--prefix", "x:", "--keys-file"])
        .arg(&keys);
    run(again).await.expect(2);
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), file);

    let app = TestApp::redis_with(|s| s.auth.keys_file = Some(keys.clone())).await;
    let server = app.url("");
    // The key from --api-key reaches the command too: its `lockd status`
    // is let in (exit 0: held).
    let job = sh(
        r#"echo "$LOCKD_FENCE" > "$DIR/fence"; "$LOCKD_BIN" status "$LOCKD_NAME" > /dev/null; echo $? > "$DIR/status""#,
    );
    run(exec(
        &dir,
        &server,
        &["--api-key", &secret],
        "cron:nightly",
        &job,
    ))
    .await
    .expect(0);
    assert!(
        !dir.read("fence").trim().is_empty(),
        "the command did not run"
    );
    assert_eq!(
        dir.read("status").trim(),
        "0",
        "status inside exec was refused"
    );
    // Released at the end (read from Redis: the API wants a key).
    assert_eq!(app.holder_token("cron:nightly").await, None);

    // No key: 401, a refused request (64), and the command never runs.
    let refused = run(exec(
        &dir,
        &server,
        &[],
        "cron:nightly",
        &sh(r#"touch "$DIR/ran""#),
    ))
    .await;
    refused.expect(64);
    assert!(refused.stderr.contains("API key"), "{}", refused.stderr);
    assert!(!dir.exists("ran"));
    // Outside the key's prefix: 403, also 64.
    let mut outside = exec(
        &dir,
        &server,
        &[],
        "deploy:prod",
        &sh(r#"touch "$DIR/ran""#),
    );
    outside.env("LOCKD_API_KEY", &secret);
    run(outside).await.expect(64);
    assert!(!dir.exists("ran"));

    let mut status = lockd(&dir);
    status.args(["status", "--server", &server, "cron:nightly"]);
    status.env("LOCKD_API_KEY", &secret);
    run(status).await.expect(1);
    let mut keyless = lockd(&dir);
    keyless.args(["status", "--server", &server, "cron:nightly"]);
    run(keyless).await.expect(64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_by_the_rate_limit_is_retried_until_it_passes() {
    let dir = Scratch::new();
    let keys = dir.path("keys.toml");
    let secret = keygen(
        &dir,
        &keys,
        &[
            "--id",
            "slow",
            "--prefix",
            "rl:",
            "--requests-per-second",
            "1",
        ],
    )
    .await;
    let app = TestApp::redis_with(|s| s.auth.keys_file = Some(keys.clone())).await;
    // The acquire spends the one request of this second; the release right
    // after the command gets 429 and must be retried, not given up.
    let mut job = exec(&dir, &app.url(""), &[], "rl:job", &sh("true"));
    job.env("LOCKD_API_KEY", &secret);
    let ran = run(job).await;
    ran.expect(0);
    assert!(!ran.stderr.contains("cannot release"), "{}", ran.stderr);
    assert_eq!(
        app.holder_token("rl:job").await,
        None,
        "the lock was left held"
    );
    // A second exec at once is over the rate: 75, try again later.
    let mut again = exec(
        &dir,
        &app.url(""),
        &[],
        "rl:job",
        &sh(r#"touch "$DIR/ran""#),
    );
    again.env("LOCKD_API_KEY", &secret);
    run(again).await.expect(75);
    assert!(!dir.exists("ran"));
}

// ---------------------------------------------------------------------------
// Several servers
// ---------------------------------------------------------------------------

/// `http://127.0.0.1:<a port nobody listens on>`.
fn dead_server() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// Acquire requests `app` has counted, whatever their result (`None` for
/// one result when given).
async fn acquires(app: &TestApp, result: Option<&str>) -> f64 {
    let labels: Vec<(&str, &str)> = result.map(|r| ("result", r)).into_iter().collect();
    metric(&app.metrics().await, "lockd_acquire_total", &labels).unwrap_or(0.0)
}

/// Watches lock `name` in Redis for `span`: `token` must hold it all along.
async fn assert_held_throughout(
    app: &TestApp,
    name: &str,
    token: &str,
    span: Duration,
    running: &Lockd,
) {
    let watch_until = Instant::now() + span;
    while Instant::now() < watch_until {
        assert_eq!(
            app.redis_server().lock_token(name).await.as_deref(),
            Some(token),
            "the lease lapsed while the command ran; lockd's stderr:\n{}",
            running.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `lockd exec --server <dead> --server <live>`: the dead server is passed
/// over, the command runs under the lock taken through the live one, and
/// gets both in `LOCKD_SERVER`, so that its own `lockd status` passes over
/// the dead one too. Nothing is said about the dead server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_passes_over_a_dead_server_and_runs_the_command_under_the_lock() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let (dead, live) = (dead_server(), app.url(""));
    let name = "multi:dead-first";
    let script = format!(
        r#"echo "$LOCKD_SERVER" > "$DIR/servers"; echo "$LOCKD_TOKEN" > "$DIR/token"
        "$LOCKD_BIN" status "$LOCKD_NAME" > "$DIR/status"; echo $? > "$DIR/status-code"
        touch "$DIR/started"; {WAIT_FOR_GO}"#
    );
    let mut running = Lockd::spawn(exec(&dir, &dead, &["--server", &live], name, &sh(&script)));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    assert_eq!(dir.read("servers").trim(), format!("{dead},{live}"));
    assert_eq!(
        app.redis_server().lock_token(name).await.as_deref(),
        Some(dir.read("token").trim()),
        "the command does not hold the lock"
    );
    assert_eq!(
        dir.read("status-code").trim(),
        "0",
        "lockd status in the command: {}; lockd's stderr:\n{}",
        dir.read("status"),
        running.stderr()
    );
    let status: Value = serde_json::from_str(dir.read("status").trim()).unwrap();
    assert_eq!(status["held"], true, "{status}");
    dir.touch("go");
    let exit = running.wait(LIMIT).await;
    exit.expect(0);
    assert_eq!(exit.stderr, "");
    assert_free(&app, name).await;
}

/// A job under `lockd exec --server A --server B`, where A is a `lockd
/// serve` process killed mid-job: the renewals move on to B, the job's
/// token holds the lock for several TTLs after A is gone, and the job
/// exits 0 with the lock released (through B).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_keeps_its_lease_through_the_next_server_when_its_server_is_killed() {
    let app = TestApp::redis().await;
    let mut first = Lockd::serve(&["--redis-url", &app.redis_server().url()], &[]).await;
    let dir = Scratch::new();
    let name = "multi:killed";
    let script = format!(r#"touch "$DIR/started"; {WAIT_FOR_GO}"#);
    let mut running = Lockd::spawn(exec(
        &dir,
        &first.url(""),
        &["--server", &app.url(""), "--ttl-ms", "900"],
        name,
        &sh(&script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    let token = app
        .redis_server()
        .lock_token(name)
        .await
        .expect("the lock is held while the command runs");
    assert_eq!(acquires(&app, None).await, 0.0, "granted through B, not A");

    first.signal(Signal::SIGKILL);
    first.exited_within(LIMIT).await.expect("A is gone");
    assert_held_throughout(&app, name, &token, Duration::from_millis(3600), &running).await;
    let extended = metric(
        &app.metrics().await,
        "lockd_extend_total",
        &[("result", "extended")],
    )
    .unwrap_or(0.0);
    assert!(extended >= 3.0, "B renewed {extended} times in 4 TTLs");

    dir.touch("go");
    let exit = running.wait(LIMIT).await;
    exit.expect(0);
    assert!(
        exit.stderr
            .contains(&format!("renewing through {} now", app.url(""))),
        "{}",
        exit.stderr
    );
    assert_free(&app, name).await;
}

/// The first server hangs mid-job (SIGSTOP: the kernel still takes its
/// connections, nobody answers): a renewal gives it only its share of the
/// time left on the lease, then renews through the next server, and sticks
/// to it; the lease never lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_keeps_its_lease_through_the_next_server_when_its_server_hangs() {
    let app = TestApp::redis().await;
    let first = Lockd::serve(&["--redis-url", &app.redis_server().url()], &[]).await;
    let dir = Scratch::new();
    let name = "multi:hung";
    let script = format!(r#"touch "$DIR/started"; {WAIT_FOR_GO}"#);
    let mut running = Lockd::spawn(exec(
        &dir,
        &first.url(""),
        &["--server", &app.url(""), "--ttl-ms", "1500"],
        name,
        &sh(&script),
    ));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    let token = app
        .redis_server()
        .lock_token(name)
        .await
        .expect("the lock is held while the command runs");

    first.signal(Signal::SIGSTOP);
    assert_held_throughout(&app, name, &token, Duration::from_millis(6000), &running).await;
    dir.touch("go");
    let exit = running.wait(LIMIT).await;
    exit.expect(0);
    assert!(
        exit.stderr.contains("renewing through") && exit.stderr.contains("timed out"),
        "{}",
        exit.stderr
    );
    assert_free(&app, name).await;
    // Dropping the guard kills the stopped server.
}

/// `acquire`, `status`, `extend` and `release` with a comma-separated
/// `LOCKD_SERVER` whose first entry is dead: each passes over it, quietly,
/// and answers as one server would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_subcommands_pass_over_a_dead_first_server_in_lockd_server() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let servers = format!("{}, {}", dead_server(), app.url(""));
    let name = "multi:shell";
    let shell = |args: &[&str]| {
        let mut cmd = lockd(&dir);
        cmd.args(args).env("LOCKD_SERVER", &servers);
        cmd
    };

    let acquired = run(shell(&["acquire", name, "--ttl-ms", "30000"])).await;
    acquired.expect(0);
    assert_eq!(acquired.stderr, "");
    let token = acquired.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(
        app.redis_server().lock_token(name).await.as_deref(),
        Some(token.as_str())
    );
    let status = run(shell(&["status", name])).await;
    status.expect(0);
    assert_eq!(status.json()["held"], true);

    let sent = Instant::now();
    let mut extend = shell(&["extend", name, "--ttl-ms", "40000"]);
    extend.env("LOCKD_TOKEN", &token);
    let extended = run(extend).await;
    extended.expect(0);
    assert_lease_ms(extended.json()["ttl_ms"].as_u64(), 40000, sent);

    let mut release = shell(&["release", name]);
    release.env("LOCKD_TOKEN", &token);
    run(release).await.expect(0);
    let free = run(shell(&["status", name])).await;
    free.expect(1);
    assert!(free.stderr.contains("404"), "{}", free.stderr);
    assert_free(&app, name).await;
}

/// A 409 from the first server is an answer: `lockd acquire`, `lockd exec`
/// and a release with another holder's token exit 75 on it, naming that
/// server, and the second server sees none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_from_the_first_server_is_not_asked_of_the_next() {
    let first = TestApp::redis().await;
    let second = first.sibling(|_| {}).await;
    let dir = Scratch::new();
    let name = "multi:held";
    let held = first.acquire_ttl(name, 60_000).await;
    held.expect_status(201);
    let (a, b) = (first.url(""), second.url(""));
    let both = ["--server", a.as_str(), "--server", b.as_str()];

    let mut acquire = lockd(&dir);
    acquire.args(["acquire", name]).args(both);
    let refused = run(acquire).await;
    refused.expect(75);
    assert!(
        refused.stderr.contains(&format!("{a} answered 409")),
        "{}",
        refused.stderr
    );
    assert!(!refused.stderr.contains(&b), "{}", refused.stderr);

    let exit = run(exec(
        &dir,
        &a,
        &["--server", &b],
        name,
        &sh(r#"touch "$DIR/ran""#),
    ))
    .await;
    exit.expect(75);
    assert!(!dir.exists("ran"));

    let mut release = lockd(&dir);
    release
        .args(["release", name, "--token", &crate::support::random_token()])
        .args(both);
    run(release).await.expect(75);

    let text = second.metrics().await;
    assert_eq!(
        metric(&text, "lockd_acquire_total", &[]).unwrap_or(0.0),
        0.0,
        "the second server was asked to acquire"
    );
    assert_eq!(
        metric(&text, "lockd_release_total", &[]).unwrap_or(0.0),
        0.0,
        "the second server was asked to release"
    );
    assert_eq!(acquires(&first, Some("contended")).await, 2.0);
    assert_eq!(
        first.redis_server().lock_token(name).await,
        Some(held.token())
    );
}

/// The first server answers 503 (its Redis does not answer): that server is
/// unusable, so `lockd status` and `lockd exec` ask the next one, and say
/// which they passed over when they report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_from_the_first_server_is_asked_of_the_next() {
    let failing = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(200)).await;
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let name = "multi:503";
    let (a, b) = (failing.url(""), app.url(""));
    failing.redis_server().sigstop();

    let mut status = lockd(&dir);
    status.args(["status", name, "--server", &a, "--server", &b]);
    let free = run(status).await;
    free.expect(1);
    assert!(
        free.stderr.contains(&format!("{b} answered 404"))
            && free
                .stderr
                .contains(&format!("after passing over {a} (503")),
        "{}",
        free.stderr
    );

    let ran = run(exec(
        &dir,
        &a,
        &["--server", &b],
        name,
        &sh(r#"echo "$LOCKD_FENCE" > "$DIR/fence""#),
    ))
    .await;
    failing.redis_server().sigcont();
    ran.expect(0);
    assert!(
        !dir.read("fence").trim().is_empty(),
        "the command did not run"
    );
    assert_eq!(acquires(&app, Some("acquired")).await, 1.0);
    assert_free(&app, name).await;
}

/// The first server grants the lock but its answer is lost on the way back
/// (held by a proxy): `lockd acquire` gives that server its share of the
/// time, then asks the next one under the same token, which it chose
/// itself, so the second server renews the first one's grant (200, the
/// same fence) instead of making a second grant or calling it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_is_lost_is_asked_again_elsewhere_under_the_same_token() {
    let first = TestApp::redis().await;
    let second = first.sibling(|_| {}).await;
    let proxy = LinkProxy::start(first.addr.port()).await;
    proxy.freeze_on_answer(b"201 Created");
    let dir = Scratch::new();
    let name = "multi:lost-answer";
    let mut acquire = lockd(&dir);
    acquire.args([
        "acquire",
        name,
        "--ttl-ms",
        "60000",
        "--server",
        &proxy.http_url(),
        "--server",
        &second.url(""),
    ]);
    let acquired = run(acquire).await;
    acquired.expect(0);
    assert!(proxy.is_frozen(), "the first server's answer got through");
    let grant = acquired.json();
    let token = grant["token"].as_str().unwrap().to_owned();
    assert_eq!(
        first.redis_server().lock_token(name).await.as_deref(),
        Some(token.as_str())
    );
    assert_eq!(
        grant["fence"].as_u64(),
        first.redis_server().holder_fence(name).await
    );
    assert_eq!(acquires(&first, Some("acquired")).await, 1.0);
    assert_eq!(acquires(&second, Some("reacquired")).await, 1.0);
    assert_eq!(acquires(&second, Some("acquired")).await, 0.0);
    assert_eq!(acquired.stderr, "");
    proxy.thaw();
    first.release(name, &token).await.expect_status(204);
}

// ---------------------------------------------------------------------------
// Semaphores: `lockd exec --semaphore` and the shell subcommands
// ---------------------------------------------------------------------------

/// How many permits `GET /semaphores/{name}` shows (0 for a 404).
async fn permits(app: &TestApp, name: &str) -> usize {
    let reply = app.get(&format!("/semaphores/{name}")).await;
    if reply.status == 404 {
        return 0;
    }
    reply.expect_status(200);
    reply.json()["holders"].as_u64().expect("holders") as usize
}

/// Three `lockd exec --semaphore --limit 2`: two run at once, the third is
/// refused with 75 (or, waiting, runs once a permit frees); each command
/// sees LOCKD_SEMAPHORE=1, and `lockd status` in it lists the permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_under_a_semaphore_runs_at_most_limit_commands_at_once() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:pool";
    let flags = ["--semaphore", "--limit", "2", "--ttl-ms", "900"];
    let script = |id: &str| {
        format!(
            r#"echo "$LOCKD_SEMAPHORE $LOCKD_FENCE" > "$DIR/env-{id}"; "$LOCKD_BIN" status > "$DIR/status-{id}"; touch "$DIR/started-{id}"; {WAIT_FOR_GO}"#
        )
    };
    let mut one = Lockd::spawn(exec(&dir, &server, &flags, name, &sh(&script("1"))));
    let mut two = Lockd::spawn(exec(&dir, &server, &flags, name, &sh(&script("2"))));
    one.wait_for_file(&dir.path("started-1"), STARTUP).await;
    two.wait_for_file(&dir.path("started-2"), STARTUP).await;
    assert_eq!(permits(&app, name).await, 2);
    let env = dir.read("env-1");
    assert!(
        env.starts_with("1 "),
        "LOCKD_SEMAPHORE and LOCKD_FENCE: {env:?}"
    );
    let listed: Value = serde_json::from_str(&dir.read("status-1")).expect("status JSON");
    assert_eq!(listed["limit"], 2, "{listed}");

    let refused = run(exec(
        &dir,
        &server,
        &flags,
        name,
        &sh(r#"touch "$DIR/third-ran""#),
    ))
    .await;
    refused.expect(75);
    assert!(
        refused.stderr.contains("every permit"),
        "{}",
        refused.stderr
    );
    assert!(!dir.exists("third-ran"));

    // Leases of 900 ms, renewed: still held after several TTLs.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(permits(&app, name).await, 2, "the permits were renewed");

    let waiting = [&flags[..], &["--wait-ms", "20000"]].concat();
    let mut third = Lockd::spawn(exec(
        &dir,
        &server,
        &waiting,
        name,
        &sh(r#"touch "$DIR/third-ran""#),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!dir.exists("third-ran"), "ran with both permits held");
    dir.touch("go");
    one.wait(LIMIT).await.expect(0);
    two.wait(LIMIT).await.expect(0);
    third.wait(LIMIT).await.expect(0);
    assert!(dir.exists("third-ran"));
    eventually(Duration::from_secs(5), || async {
        permits(&app, name).await == 0
    })
    .await;
}

/// A permit that is lost (its keys deleted in Redis) stops the command
/// with 70, as a lost lock does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_permit_is_lost_is_stopped_with_70() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "exec:lost";
    let script = r#"
        trap 'echo TERM >> "$DIR/trap"; exit 0' TERM
        touch "$DIR/started"
        while :; do sleep 0.05; done
    "#;
    let flags = ["--semaphore", "--limit", "1", "--ttl-ms", "900"];
    let mut running = Lockd::spawn(exec(&dir, &server, &flags, name, &sh(script)));
    running.wait_for_file(&dir.path("started"), STARTUP).await;
    assert_eq!(permits(&app, name).await, 1);
    let _: () = app
        .redis_server()
        .cmd(
            ::redis::cmd("DEL")
                .arg(format!("{}sem:{{{name}}}:permits", support::PREFIX))
                .arg(format!("{}sem:{{{name}}}:holders", support::PREFIX)),
        )
        .await;
    let exit = running.wait(LIMIT).await;
    exit.expect(70);
    assert_eq!(dir.lines("trap"), ["TERM"]);
    assert!(exit.stderr.contains("404"), "{}", exit.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_subcommands_take_extend_list_and_give_back_permits() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let name = "shell:pool";
    let take = ["acquire", "--semaphore", "--limit", "2", name];
    let first = run(shell(&dir, &server, &take)).await;
    first.expect(0);
    let grant = first.json();
    assert_eq!(grant["limit"], 2, "{grant}");
    let token = grant["token"].as_str().expect("token").to_owned();
    run(shell(&dir, &server, &take)).await.expect(0);
    let full = run(shell(&dir, &server, &take)).await;
    full.expect(75);
    assert_eq!(full.json()["type"], "urn:lockd:problem:semaphore-full");
    let other = run(shell(
        &dir,
        &server,
        &["acquire", "--semaphore", "--limit", "3", name],
    ))
    .await;
    other.expect(64);
    assert_eq!(other.json()["type"], "urn:lockd:problem:limit-mismatch");

    let status = run(shell(&dir, &server, &["status", "--semaphore", name])).await;
    status.expect(0);
    assert_eq!(status.json()["holders"], 2);
    assert!(!status.stdout.contains(&token), "status shows a token");

    // The token from LOCKD_TOKEN, the name from LOCKD_NAME, the kind from
    // LOCKD_SEMAPHORE, as a command under `lockd exec --semaphore` has them.
    let sent = Instant::now();
    let mut extend = shell(&dir, &server, &["extend", "--ttl-ms", "40000"]);
    extend
        .env("LOCKD_TOKEN", &token)
        .env("LOCKD_NAME", name)
        .env("LOCKD_SEMAPHORE", "1");
    let extended = run(extend).await;
    extended.expect(0);
    assert_lease_ms(extended.json()["ttl_ms"].as_u64(), 40000, sent);
    assert_eq!(extended.json()["fence"], grant["fence"]);

    let mut release = shell(&dir, &server, &["release", "--semaphore", name]);
    release.env("LOCKD_TOKEN", &token);
    run(release).await.expect(0);
    let mut again = shell(&dir, &server, &["release", "--semaphore", name]);
    again.env("LOCKD_TOKEN", &token);
    let gone = run(again).await;
    gone.expect(1);
    assert_eq!(gone.json()["type"], "urn:lockd:problem:permit-not-held");
    assert_eq!(permits(&app, name).await, 1);
    // A lock of the same name is another thing: free.
    run(shell(&dir, &server, &["status", name])).await.expect(1);
    // --limit without --semaphore, or --semaphore without --limit, is a
    // usage error.
    run(shell(&dir, &server, &["acquire", "--limit", "2", name]))
        .await
        .expect(2);
    run(shell(&dir, &server, &["acquire", "--semaphore", name]))
        .await
        .expect(2);
}

// ---------------------------------------------------------------------------
// Leader election (docs/watch.md)
// ---------------------------------------------------------------------------

/// One term of a leader, as its command logged it: (fence, start, end) in
/// nanoseconds of this host's clock.
fn terms(dir: &Scratch) -> Vec<(String, u64, u64, u64)> {
    let mut starts = std::collections::HashMap::new();
    let mut terms = Vec::new();
    for line in dir.lines("log") {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [kind, id, fence, at] = fields[..] else {
            panic!("log line {line:?}")
        };
        let (fence, at): (u64, u64) = (fence.parse().unwrap(), at.parse().unwrap());
        match kind {
            "start" => {
                starts.insert(fence, (id.to_owned(), at));
            }
            _ => {
                let (id, start) = starts.remove(&fence).expect("a start before the end");
                terms.push((id, fence, start, at));
            }
        }
    }
    assert!(starts.is_empty(), "terms that never ended: {starts:?}");
    terms.sort_by_key(|t| t.2);
    terms
}

/// The documented leader election: candidates run their work under
/// `lockd exec --wait-ms`, a follower runs `lockd watch`. The leader's
/// lockd instance is frozen (SIGSTOP) mid-term while the other candidates
/// wait on another instance: the frozen leader cannot renew, so `lockd
/// exec` stops its command --kill-grace-ms before the lease ends, and the
/// next leader starts only after. No two terms overlap, terms (fences)
/// grow, and the follower saw every term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_election_with_lockd_exec_never_has_two_leaders_at_once() {
    let app = TestApp::redis().await;
    let redis = app.redis_server().url();
    let first = Lockd::serve(&["--redis-url", &redis], &[("LOCKD_LOG", "warn")]).await;
    let second = Lockd::serve(&["--redis-url", &redis], &[("LOCKD_LOG", "warn")]).await;
    let dir = Scratch::new();
    let mut follow = lockd(&dir);
    follow.args(["watch", "--server", &second.url(""), "leader"]);
    let follower = Lockd::spawn(follow);
    let work = r#"
        trap 'sleep 0.15; echo "end $ID $LOCKD_FENCE $(date +%s%N)" >> "$DIR/log"; exit 0' TERM
        echo "start $ID $LOCKD_FENCE $(date +%s%N)" >> "$DIR/log"
        sleep 1.5 & wait
        echo "end $ID $LOCKD_FENCE $(date +%s%N)" >> "$DIR/log"
    "#;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let candidate = |id: &'static str, server: String| {
        let (stop, root) = (stop.clone(), dir.root().to_owned());
        let work = sh(work);
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut cmd = support::lockd();
                cmd.env("DIR", &root)
                    .env("ID", id)
                    .args(["exec", "--server", &server])
                    .args([
                        "--wait-ms",
                        "3000",
                        "--ttl-ms",
                        "900",
                        "--kill-grace-ms",
                        "200",
                    ])
                    .args(["leader", "--"])
                    .args(&work);
                let _ = support::run(cmd).await;
            }
        })
    };
    let mut candidates = vec![candidate("c1", first.url(""))];
    assert!(
        eventually(STARTUP, || async { dir.read("log").contains("start c1") }).await,
        "c1 leads first"
    );
    candidates.push(candidate("c2", second.url("")));
    candidates.push(candidate("c3", second.url("")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.signal(Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    first.signal(Signal::SIGCONT);
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in candidates {
        tokio::time::timeout(LIMIT, c)
            .await
            .expect("candidates stop")
            .unwrap();
    }

    let terms = terms(&dir);
    assert!(terms.len() >= 3, "{terms:?}");
    for pair in terms.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.3 < b.2,
            "two leaders at once: {a:?} still ran when {b:?} began"
        );
        assert!(a.1 < b.1, "terms grow: {a:?} then {b:?}");
    }
    assert_eq!(terms[0].0, "c1");
    assert!(
        terms.iter().any(|t| t.0 != "c1"),
        "another candidate took over: {terms:?}"
    );
    // The follower saw every term begin, in order.
    let seen: Vec<u64> = follower
        .stdout()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "acquired" || e["held"] == true)
        .filter_map(|e| e["fence"].as_u64())
        .collect();
    let fences: Vec<u64> = terms.iter().map(|t| t.1).collect();
    for fence in &fences {
        assert!(
            seen.contains(fence),
            "the follower missed term {fence}: {seen:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// `lockd exec --once` and `lockd run`
// ---------------------------------------------------------------------------

/// Two hosts with the same crontab: both start `lockd exec --once` on the
/// same slot at once, the second waiting; the command runs once, both exit
/// 0, and a third start, later, does not run it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_once_from_two_processes_at_once_runs_the_command_once() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let key = "report:2026-12-02";
    let script = r#"echo ran >> "$DIR/log"; sleep 0.5"#;
    let flags = ["--once", "--wait-ms", "30000"];
    let mut first = Lockd::spawn(exec(&dir, &server, &flags, key, &sh(script)));
    let mut second = Lockd::spawn(exec(&dir, &server, &flags, key, &sh(script)));
    first.wait(LIMIT).await.expect(0);
    second.wait(LIMIT).await.expect(0);
    assert_eq!(dir.lines("log"), ["ran"], "the command ran once");
    let done = app.get(&format!("/runs/{key}")).await;
    done.expect_status(200);
    assert_eq!(done.str("state"), "done");
    assert_eq!(done.json()["result"], serde_json::json!({"exit_code": 0}));
    let third = run(exec(&dir, &server, &["--once"], key, &sh(script))).await;
    third.expect(0);
    assert!(third.stderr.contains("was done at"), "{}", third.stderr);
    assert_eq!(dir.lines("log"), ["ran"]);
}

/// A command that fails abandons the attempt (nothing stored, exit code
/// passed through), so the next `exec --once` runs it again; one in
/// progress elsewhere exits 75 without running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_once_a_failed_command_runs_again_and_one_in_progress_exits_75() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let key = "nightly:7";
    let failing = run(exec(
        &dir,
        &server,
        &["--once"],
        key,
        &sh(r#"echo fail >> "$DIR/log"; exit 3"#),
    ))
    .await;
    failing.expect(3);
    let pending = app.get(&format!("/runs/{key}")).await;
    assert_eq!(pending.str("state"), "pending");
    assert_eq!(pending.str("last_attempt"), "abandoned");
    let script = format!(r#"echo ok >> "$DIR/log"; touch "$DIR/started"; {WAIT_FOR_GO}"#);
    let mut retry = Lockd::spawn(exec(&dir, &server, &["--once"], key, &sh(&script)));
    retry.wait_for_file(&dir.path("started"), STARTUP).await;
    let busy = run(exec(
        &dir,
        &server,
        &["--once"],
        key,
        &sh(r#"echo busy >> "$DIR/log""#),
    ))
    .await;
    busy.expect(75);
    assert!(
        busy.stderr.contains("another attempt is running"),
        "{}",
        busy.stderr
    );
    dir.touch("go");
    retry.wait(LIMIT).await.expect(0);
    assert_eq!(dir.lines("log"), ["fail", "ok"]);
    let done = app.get(&format!("/runs/{key}")).await;
    assert_eq!(done.str("state"), "done");
    assert_eq!(done.u64("attempt"), 2);
}

/// `lockd run start|extend|complete|abandon|status` print the server's
/// JSON and exit by status, as the lock subcommands do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_run_subcommands_print_json_and_exit_by_status() {
    let app = TestApp::redis().await;
    let dir = Scratch::new();
    let server = app.url("");
    let key = "delivery:abc";
    let started = run(shell(
        &dir,
        &server,
        &[
            "run",
            "start",
            key,
            "--ttl-ms",
            "30000",
            "--fingerprint",
            "f1",
        ],
    ))
    .await;
    started.expect(0);
    let attempt = started.json();
    assert_eq!(attempt["state"], "running");
    let token = attempt["token"].as_str().expect("a token").to_owned();
    run(shell(&dir, &server, &["run", "start", key]))
        .await
        .expect(75);
    let mismatch = run(shell(
        &dir,
        &server,
        &["run", "start", key, "--fingerprint", "f2"],
    ))
    .await;
    mismatch.expect(64);
    assert_eq!(mismatch.json()["status"], 422);
    run(shell(
        &dir,
        &server,
        &["run", "extend", key, "--token", &token, "--ttl-ms", "60000"],
    ))
    .await
    .expect(0);
    run(shell(
        &dir,
        &server,
        &[
            "run", "complete", key, "--token", &token, "--result", "not json",
        ],
    ))
    .await
    .expect(64);
    let done = run(shell(
        &dir,
        &server,
        &[
            "run",
            "complete",
            key,
            "--token",
            &token,
            "--result",
            r#"{"id":7}"#,
        ],
    ))
    .await;
    done.expect(0);
    assert_eq!(done.json()["result"], serde_json::json!({"id": 7}));
    let replay = run(shell(&dir, &server, &["run", "start", key])).await;
    replay.expect(0);
    assert_eq!(replay.json()["state"], "done");
    run(shell(
        &dir,
        &server,
        &["run", "abandon", key, "--token", &token],
    ))
    .await
    .expect(75);
    let status = run(shell(&dir, &server, &["run", "status", key])).await;
    status.expect(0);
    assert_eq!(status.json()["state"], "done");
    run(shell(&dir, &server, &["run", "status", "unknown:key"]))
        .await
        .expect(1);
}
