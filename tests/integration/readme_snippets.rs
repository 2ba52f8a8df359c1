//! The client-side snippets of the documentation, run as written against a
//! live lockd. A snippet is the code block that follows a
//! `<!-- snippet: NAME -->` line, in README.md or any `docs/*.md` file:
//! each retry snippet (bash, Python, JavaScript) must retry past a held lock
//! and come back with the grant; the cron job in `sh` must run the job only
//! with the lock, say "another host runs the job" only for a 409, and fail
//! (exit non-zero) when lockd or Redis is down; the semaphore snippets (sh
//! and Python) must never let more than their limit in at once; the run
//! snippets must run a redelivered webhook's job once, and a cron slot's
//! job once across two hosts. A marked
//! snippet that no
//! test here runs fails [`every_marked_snippet_is_run_by_a_test`], so none
//! stops being tested when it moves or is added.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{TestApp, metric};
use serde_json::Value;

/// The snippets these tests run.
const TESTED: [&str; 10] = [
    "cron-sh",
    "retry-bash",
    "retry-python",
    "retry-js",
    "semaphore-sh",
    "semaphore-python",
    "run-webhook-sh",
    "run-cron-sh",
    "shared-read-sh",
    "shared-write-sh",
];

const MARKER: &str = "<!-- snippet: ";

/// README.md and every `docs/*.md` file, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("a docs/ directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (path, text)
        })
        .collect()
}

/// Every marked snippet of the documents: its name, the file it is in, and
/// the code block that follows its marker.
fn snippets() -> Vec<(String, PathBuf, String)> {
    let mut found = Vec::new();
    for (path, text) in documents() {
        for (at, _) in text.match_indices(MARKER) {
            let rest = &text[at + MARKER.len()..];
            let (name, after) = rest
                .split_once(" -->\n")
                .unwrap_or_else(|| panic!("{}: a marker with no ` -->`", path.display()));
            let body = after
                .split_once('\n')
                .expect("a fence line after the marker")
                .1;
            let body = body.split_once("\n```").expect("a closing fence").0;
            found.push((name.to_owned(), path.clone(), body.to_owned()));
        }
    }
    found
}

/// The code block that follows `<!-- snippet: NAME -->`, wherever it is.
fn snippet(name: &str) -> String {
    let mut matching = snippets().into_iter().filter(|(n, _, _)| n == name);
    let (_, _, body) = matching
        .next()
        .unwrap_or_else(|| panic!("no README.md or docs/*.md file has a snippet {name}"));
    assert!(matching.next().is_none(), "two snippets are named {name}");
    body
}

/// Each marked snippet is one of those the tests below run, and each of
/// those is marked exactly once.
#[test]
fn every_marked_snippet_is_run_by_a_test() {
    let mut count: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for (name, path, _) in snippets() {
        count.entry(name).or_default().push(path);
    }
    for (name, paths) in &count {
        assert!(
            TESTED.contains(&name.as_str()),
            "the snippet {name} ({paths:?}) is run by no test in tests/readme_snippets.rs"
        );
        assert_eq!(
            paths.len(),
            1,
            "the snippet {name} is marked twice: {paths:?}"
        );
    }
    for name in TESTED {
        assert!(
            count.contains_key(name),
            "no document has the snippet {name}"
        );
    }
}

/// Holds `orders:1`, runs the snippet with `program`, releases the lock once
/// the snippet has been refused, and checks that the snippet then printed a
/// grant that holds the lock.
async fn snippet_retries_until_granted(name: &str, program: &str, extension: &str) {
    let app = TestApp::redis().await;
    let first = app.acquire_ttl("orders:1", 30_000).await;
    first.expect_status(201);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("snippet.{extension}"));
    std::fs::write(&path, snippet(name)).unwrap();
    let run = tokio::process::Command::new(program)
        .arg(&path)
        .env("LOCKD_URL", app.url(""))
        .kill_on_drop(true)
        .output();
    let run = tokio::spawn(tokio::time::timeout(Duration::from_secs(60), run));

    let contended = || async {
        metric(
            &app.metrics().await,
            "lockd_acquire_total",
            &[("result", "contended")],
        )
        .unwrap_or(0.0)
    };
    let started = std::time::Instant::now();
    while contended().await < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the {name} snippet never asked for the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.release("orders:1", &first.token())
        .await
        .expect_status(204);

    let out = run
        .await
        .unwrap()
        .unwrap_or_else(|_| panic!("the {name} snippet ran over 60 s"))
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grant: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{name} printed no grant ({e}): {stdout}"));
    let token = grant["token"].as_str().expect("a token").to_owned();
    assert_ne!(token, first.token());
    assert!(grant["fence"].as_u64().expect("a fence") > first.fence());
    assert_eq!(app.holder_token("orders:1").await, Some(token));
}

#[tokio::test]
async fn readme_bash_retry_snippet_gets_the_lock_after_backing_off() {
    snippet_retries_until_granted("retry-bash", "bash", "sh").await;
}

#[tokio::test]
async fn readme_python_retry_snippet_gets_the_lock_after_backing_off() {
    snippet_retries_until_granted("retry-python", "python3", "py").await;
}

#[tokio::test]
async fn readme_javascript_retry_snippet_gets_the_lock_after_backing_off() {
    snippet_retries_until_granted("retry-js", "node", "mjs").await;
}

/// Runs the cron snippet with `sh` against `url`: its exit code,
/// stdout and stderr.
async fn run_cron_snippet(url: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cron.sh");
    std::fs::write(&path, snippet("cron-sh")).unwrap();
    let run = tokio::process::Command::new("sh")
        .arg(&path)
        .env("LOCKD_URL", url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the cron snippet ran over 30 s")
        .expect("cannot run sh");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lock free: the job runs and the lock is released after it. The
/// lock held: "another host runs the job", exit 0 (nothing to report).
#[tokio::test]
async fn readme_cron_snippet_runs_the_job_with_the_lock_and_defers_only_on_409() {
    let app = TestApp::redis().await;
    let (code, stdout, stderr) = run_cron_snippet(&app.url("")).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("running the job"), "{stdout}{stderr}");
    assert_eq!(
        app.holder_token("nightly-report").await,
        None,
        "not released"
    );

    let held = app.acquire_ttl("nightly-report", 30_000).await;
    held.expect_status(201);
    let (code, stdout, stderr) = run_cron_snippet(&app.url("")).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("another host runs the job"),
        "{stdout}{stderr}"
    );
    assert!(!stdout.contains("running the job"), "{stdout}{stderr}");
    assert_eq!(app.holder_token("nightly-report").await, Some(held.token()));
}

/// Nothing listening at `LOCKD_URL` (lockd stopped): the snippet exits
/// non-zero and does not claim that another host runs the job.
#[tokio::test]
async fn readme_cron_snippet_fails_and_claims_no_other_host_when_lockd_is_stopped() {
    let nowhere = format!("http://127.0.0.1:{}", crate::support::free_port());
    let (code, stdout, stderr) = run_cron_snippet(&nowhere).await;
    assert_ne!(code, Some(0), "exit 0 with lockd stopped: {stdout}{stderr}");
    assert!(code.is_some(), "killed by a signal: {stdout}{stderr}");
    let all = format!("{stdout}{stderr}");
    assert!(!all.contains("another host"), "{all}");
    assert!(!all.contains("running the job"), "{all}");
}

/// Redis down (lockd answers 503): the snippet exits non-zero and does not
/// claim that another host runs the job.
#[tokio::test]
async fn readme_cron_snippet_fails_and_claims_no_other_host_when_redis_is_down() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(200)).await;
    app.redis_server().stop();
    let (code, stdout, stderr) = run_cron_snippet(&app.url("")).await;
    assert_ne!(code, Some(0), "exit 0 with Redis down: {stdout}{stderr}");
    assert!(code.is_some(), "killed by a signal: {stdout}{stderr}");
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("503"), "{all}");
    assert!(!all.contains("another host"), "{all}");
    assert!(!all.contains("running the job"), "{all}");
}

/// Starts the snippet `name` with `program` against `app`, with
/// `JOB_SECONDS` set: its process, whose output is read at the end. Each
/// run `n` gets a file of its own (a shell reads its script as it goes, so
/// rewriting one file under a running shell would cut its script short).
fn spawn_snippet(
    app: &TestApp,
    name: &str,
    program: &str,
    dir: &std::path::Path,
    n: usize,
    job_seconds: &str,
) -> tokio::process::Child {
    let path = dir.join(format!("{name}-{n}.snippet"));
    std::fs::write(&path, snippet(name)).unwrap();
    tokio::process::Command::new(program)
        .arg(&path)
        .env("LOCKD_URL", app.url(""))
        .env("JOB_SECONDS", job_seconds)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Samples `GET /semaphores/{name}` until every child has exited: the most
/// permits seen, and each child's exit code and output.
async fn sample_until_done(
    app: &TestApp,
    name: &str,
    children: Vec<tokio::process::Child>,
) -> (u64, Vec<(Option<i32>, String)>) {
    let outputs = tokio::spawn(async move {
        let mut all = Vec::new();
        for child in children {
            let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
                .await
                .expect("a snippet ran over 60 s")
                .expect("its output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            all.push((out.status.code(), text));
        }
        all
    });
    let mut most = 0;
    while !outputs.is_finished() {
        let reply = app.get(&format!("/semaphores/{name}")).await;
        if reply.status == 200 {
            most = most.max(reply.u64("holders"));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (most, outputs.await.unwrap())
}

/// Three workers at once on a limit of 2, each holding for 2 s: two run,
/// the third says every permit is taken (exit 75), and the permits are
/// given back.
#[tokio::test]
async fn docs_semaphore_sh_snippet_lets_two_workers_in_and_turns_the_third_away() {
    let app = TestApp::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let children = (0..3)
        .map(|n| spawn_snippet(&app, "semaphore-sh", "sh", dir.path(), n, "2"))
        .collect();
    let (most, outputs) = sample_until_done(&app, "partner-api", children).await;
    assert!(most <= 2, "{most} permits held at once");
    let ran = outputs
        .iter()
        .filter(|(code, out)| *code == Some(0) && out.contains("got a permit"))
        .count();
    let turned_away = outputs
        .iter()
        .filter(|(code, out)| *code == Some(75) && out.contains("every permit is taken"))
        .count();
    assert_eq!((ran, turned_away), (2, 1), "{outputs:?}");
    app.get("/semaphores/partner-api")
        .await
        .expect_problem(404, "semaphore-free");
}

/// Four programs at once on a limit of 2, each waiting for a permit and
/// working under it: all four get one in turn, never more than 2 at once,
/// each with a fence of its own, and all are given back.
#[tokio::test]
async fn docs_semaphore_python_snippet_waits_its_turn_and_never_over_grants() {
    let app = TestApp::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let children = (0..4)
        .map(|n| spawn_snippet(&app, "semaphore-python", "python3", dir.path(), n, "1.5"))
        .collect();
    let (most, outputs) = sample_until_done(&app, "legacy-db", children).await;
    assert!(most <= 2, "{most} permits held at once");
    assert_eq!(most, 2, "two worked at once");
    let mut fences = std::collections::BTreeSet::new();
    for (code, out) in &outputs {
        assert_eq!(*code, Some(0), "{out}");
        let permit: Value = serde_json::from_str(out.trim().lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("no permit printed ({e}): {out}"));
        fences.insert(permit["fence"].as_u64().expect("a fence"));
    }
    assert_eq!(fences.len(), 4, "a fence each: {outputs:?}");
    app.get("/semaphores/legacy-db")
        .await
        .expect_problem(404, "semaphore-free");
}

/// Runs the webhook snippet for `delivery` with `payload`, its job a
/// script that appends to `log` (and fails when `fail` is set).
async fn run_webhook_snippet(
    app: &TestApp,
    dir: &std::path::Path,
    delivery: &str,
    payload: &str,
    fail: bool,
) -> (Option<i32>, String) {
    let handler = dir.join("handler.sh");
    std::fs::write(&handler, snippet("run-webhook-sh")).unwrap();
    let job = dir.join("job.sh");
    std::fs::write(
        &job,
        format!(
            "echo \"job $(cat \"$1\")\" >> '{}'\n{}",
            dir.join("log").display(),
            if fail { "exit 3\n" } else { "" }
        ),
    )
    .unwrap();
    let body = dir.join(format!("payload-{delivery}-{}.json", payload.len()));
    std::fs::write(&body, payload).unwrap();
    let run = tokio::process::Command::new("sh")
        .arg(&handler)
        .arg(delivery)
        .arg(&body)
        .env("LOCKD_URL", app.url(""))
        .env("JOB", format!("sh {}", job.display()))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the webhook snippet ran over 60 s")
        .expect("cannot run sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The webhook recipe of docs/runs.md: a delivery sent again runs its job
/// once; a failed one runs again on its redelivery; another payload under
/// the same id is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_run_webhook_snippet_runs_a_redelivered_event_once() {
    let app = TestApp::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let log = || std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    let (code, text) = run_webhook_snippet(&app, dir.path(), "d-1", "{\"a\":1}", false).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ran delivery d-1"), "{text}");
    let (code, text) = run_webhook_snippet(&app, dir.path(), "d-1", "{\"a\":1}", false).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("handled already"), "{text}");
    assert_eq!(
        log().lines().count(),
        1,
        "the redelivery ran the job: {}",
        log()
    );
    let (code, text) = run_webhook_snippet(&app, dir.path(), "d-1", "{\"a\":2}", false).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("another payload"), "{text}");
    assert_eq!(log().lines().count(), 1);
    // A failed delivery runs again when it is delivered again.
    let (code, text) = run_webhook_snippet(&app, dir.path(), "d-2", "{}", true).await;
    assert_eq!(code, Some(1), "{text}");
    let (code, text) = run_webhook_snippet(&app, dir.path(), "d-2", "{}", false).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ran delivery d-2"), "{text}");
    assert_eq!(log().lines().count(), 3, "{}", log());
}

/// The cron recipe of docs/runs.md, on two "hosts" at once (two processes
/// with the same crontab line): the report runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_run_cron_snippet_runs_once_across_two_hosts() {
    let app = TestApp::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("cron.sh");
    std::fs::write(&script, snippet("run-cron-sh")).unwrap();
    std::fs::write(
        dir.path().join("report.sh"),
        "#!/bin/sh\necho report >> log; sleep 0.5\n",
    )
    .unwrap();
    std::fs::set_permissions(
        dir.path().join("report.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bin = std::path::Path::new(crate::support::LOCKD)
        .parent()
        .expect("the lockd binary's directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let host = || {
        tokio::process::Command::new("sh")
            .arg(&script)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("LOCKD_SERVER", app.url(""))
            .kill_on_drop(true)
            .output()
    };
    let (a, b) = tokio::join!(host(), host());
    for out in [a.expect("host a"), b.expect("host b")] {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        ["report"],
        "ran once across two hosts"
    );
}

/// The shared-lock recipe of docs/locks.md: two readers run at once; a
/// writer that comes while they run waits for both and runs alone; a reader
/// that comes while the writer waits runs after it. The jobs log when they
/// start and end, so the order tells.
#[tokio::test]
async fn docs_shared_snippets_keep_the_writer_out_while_readers_run_and_let_it_in_after() {
    let app = TestApp::redis().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("read.sh"), snippet("shared-read-sh")).unwrap();
    std::fs::write(dir.path().join("write.sh"), snippet("shared-write-sh")).unwrap();
    for (job, what) in [("read-dataset.sh", "read"), ("rewrite-dataset.sh", "write")] {
        std::fs::write(
            dir.path().join(job),
            format!("#!/bin/sh\necho start-{what} >> log; sleep \"${{JOB_SECONDS:-1}}\"; echo end-{what} >> log\n"),
        )
        .unwrap();
        std::fs::set_permissions(
            dir.path().join(job),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    let bin = std::path::Path::new(crate::support::LOCKD)
        .parent()
        .expect("the lockd binary's directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let host = |script: &str, seconds: &str| {
        tokio::process::Command::new("sh")
            .arg(script)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("LOCKD_SERVER", app.url(""))
            .env("JOB_SECONDS", seconds)
            .kill_on_drop(true)
            .output()
    };
    let readers = tokio::spawn({
        let (a, b) = (host("read.sh", "2"), host("read.sh", "2"));
        async move { tokio::join!(a, b) }
    });
    assert!(
        crate::support::eventually(Duration::from_secs(20), || async {
            let reply = app.inspect("dataset").await;
            reply.status == 200 && reply.json()["holder_count"] == 2
        })
        .await,
        "the two readers never held at once"
    );
    let writer = tokio::spawn(host("write.sh", "0.5"));
    assert!(
        crate::support::eventually(Duration::from_secs(20), || async {
            app.inspect("dataset").await.json()["writer_waiting"] == true
        })
        .await,
        "the writer never waited"
    );
    let late_reader = host("read.sh", "0.2").await.expect("the late reader");
    let (a, b) = readers.await.unwrap();
    let w = writer.await.unwrap().expect("the writer");
    for out in [a.expect("reader a"), b.expect("reader b"), w, late_reader] {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines,
        [
            "start-read",
            "start-read",
            "end-read",
            "end-read",
            "start-write",
            "end-write",
            "start-read",
            "end-read"
        ],
        "the writer ran alone, after the readers that held and before the one that came while it waited"
    );
    app.inspect("dataset")
        .await
        .expect_problem(404, "lock-not-held");
}
