//! A `lockd` process started by a test: [`Lockd`], the one guard for every
//! run of the binary, server or client subcommand.
//!
//! - [`lockd`] builds the command: the environment cleared to
//!   [`ENV_ALLOWED`] (so no `LOCKD_*` or `RUST_LOG` of the shell that runs
//!   the tests changes what a test sees), stdin closed.
//! - [`Lockd::spawn`] starts it with stdout and stderr written to files in
//!   a temporary directory of its own, readable at any time
//!   ([`Lockd::stdout`], [`Lockd::stderr`]), and `$PGID_FILE` pointing there
//!   for a command that records its process group. Dropping the guard kills
//!   lockd (SIGKILL) and that process group.
//! - [`Lockd::serve`] starts `lockd serve` on a free loopback port and waits
//!   for `/healthz`; a port taken in the meantime by another test is tried
//!   again on another port.
//! - [`run`] runs a command to its end, at most [`LIMIT`], as an [`Exit`].

use std::borrow::BorrowMut;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid, getpgrp};
use serde_json::Value;

use super::free_port;

/// The binary under test.
pub const LOCKD: &str = env!("CARGO_BIN_EXE_lockd");

/// The only variables a `lockd` started by a test inherits; a test sets
/// any other itself.
pub const ENV_ALLOWED: [&str; 5] = ["PATH", "HOME", "TMPDIR", "LANG", "LLVM_PROFILE_FILE"];

/// The longest any `lockd` run may take before the test gives up.
pub const LIMIT: Duration = Duration::from_secs(40);

/// How long `lockd serve` may take to answer `/healthz`.
const START_LIMIT: Duration = Duration::from_secs(30);

/// `lockd` with the environment cleared to [`ENV_ALLOWED`] and stdin
/// closed.
pub fn lockd() -> Command {
    let mut cmd = Command::new(LOCKD);
    cmd.env_clear();
    for var in ENV_ALLOWED {
        if let Some(value) = std::env::var_os(var) {
            cmd.env(var, value);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// A running `lockd`, killed on drop.
pub struct Lockd {
    child: Child,
    since: Instant,
    files: tempfile::TempDir,
    /// The command line, for messages.
    what: String,
    /// The scheme and `127.0.0.1:<port>` of a `lockd serve`.
    served: Option<(String, String)>,
}

/// How a `lockd` run ended.
pub struct Exit {
    /// Its exit status.
    pub status: ExitStatus,
    /// From spawn to exit.
    pub took: Duration,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl Exit {
    /// The exit code (panics if lockd was killed by a signal).
    #[track_caller]
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or_else(|| {
            panic!(
                "lockd itself was killed: {:?}; stderr:\n{}",
                self.status, self.stderr
            )
        })
    }

    /// Asserts the exit code, with stdout and stderr in the message.
    #[track_caller]
    pub fn expect(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            code,
            "unexpected exit code after {:?}\nstdout:\n{}\nstderr:\n{}",
            self.took,
            self.stdout,
            self.stderr
        );
        self
    }

    /// stdout as JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl Lockd {
    /// Starts `cmd` (from [`lockd`]) with its stdout and stderr going to
    /// files.
    pub fn spawn(mut cmd: impl BorrowMut<Command>) -> Self {
        let cmd = cmd.borrow_mut();
        let files = tempfile::tempdir().expect("temp dir for lockd's output");
        let out = std::fs::File::create(files.path().join("stdout")).expect("stdout file");
        let err = std::fs::File::create(files.path().join("stderr")).expect("stderr file");
        cmd.stdout(out)
            .stderr(err)
            .env("PGID_FILE", files.path().join("pgid"));
        let what = format!("{cmd:?}");
        let child = cmd.spawn().expect("spawn lockd");
        Self {
            child,
            since: Instant::now(),
            files,
            what,
            served: None,
        }
    }

    /// Starts `lockd serve --listen 127.0.0.1:<free port> <args>` with
    /// `LOCKD_LOG=info` and `env`, and waits until `/healthz` answers over
    /// plain HTTP.
    pub async fn serve(args: &[&str], env: &[(&str, &str)]) -> Self {
        let probe = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("build a client");
        Self::serve_over("http", args, env, &probe).await
    }

    /// [`Self::serve`] over `scheme`, probing with `probe` (which must trust
    /// the server's certificate for `https`).
    pub async fn serve_over(
        scheme: &str,
        args: &[&str],
        env: &[(&str, &str)],
        probe: &reqwest::Client,
    ) -> Self {
        for _ in 0..3 {
            let listen = format!("127.0.0.1:{}", free_port());
            let mut cmd = lockd();
            cmd.args(["serve", "--listen", &listen])
                .args(args)
                .env("LOCKD_LOG", "info")
                .envs(env.iter().copied());
            let mut lockd = Self::spawn(&mut cmd);
            let base = format!("{scheme}://{listen}");
            let started = Instant::now();
            while started.elapsed() < START_LIMIT {
                if probe.get(format!("{base}/healthz")).send().await.is_ok() {
                    lockd.served = Some((scheme.to_owned(), listen));
                    return lockd;
                }
                if let Some(exit) = lockd.exited() {
                    let stderr = lockd.stderr();
                    // Another test took the free port first: try another.
                    if stderr.contains("in use") {
                        break;
                    }
                    panic!("{} exited at start-up ({exit}):\n{stderr}", lockd.what);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if lockd.exited().is_none() {
                panic!(
                    "{} did not answer /healthz within {START_LIMIT:?}:\n{}",
                    lockd.what,
                    lockd.stderr()
                );
            }
        }
        panic!("lockd serve found no free port in 3 tries");
    }

    /// `<scheme>://127.0.0.1:<port><path>` of a [`Self::serve`]d lockd.
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.served().0, self.addr())
    }

    /// `127.0.0.1:<port>` of a [`Self::serve`]d lockd.
    pub fn addr(&self) -> &str {
        &self.served().1
    }

    fn served(&self) -> &(String, String) {
        self.served.as_ref().expect("a lockd started by serve")
    }

    /// lockd's process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits"))
    }

    /// Sends `sig` to lockd.
    pub fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).unwrap_or_else(|e| panic!("kill -{sig} lockd: {e}"));
    }

    /// Everything lockd wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.output("stdout")
    }

    /// Everything lockd wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.output("stderr")
    }

    fn output(&self, which: &str) -> String {
        std::fs::read_to_string(self.files.path().join(which)).unwrap_or_default()
    }

    /// The pid of the command's shell, once it has recorded it in
    /// `$PGID_FILE`.
    pub fn command_pid(&self) -> Option<Pid> {
        self.output("pgid").trim().parse().ok().map(Pid::from_raw)
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll lockd")
    }

    /// Waits (without blocking the runtime) until lockd exits, at most
    /// `within`; `None` if it still runs.
    pub async fn exited_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for lockd to exit, up to `within` (then fails the test).
    pub async fn wait(&mut self, within: Duration) -> Exit {
        match self.exited_within(within).await {
            Some(status) => self.exit(status),
            None => panic!(
                "{} did not exit within {within:?}; stderr so far:\n{}",
                self.what,
                self.stderr()
            ),
        }
    }

    /// [`Self::wait`] for a test without a runtime.
    pub fn wait_blocking(&mut self, within: Duration) -> Exit {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return self.exit(status);
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}; stderr so far:\n{}",
                self.what,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGTERM and waits for the exit, up to [`LIMIT`].
    pub async fn terminate(&mut self) -> Exit {
        self.signal(Signal::SIGTERM);
        self.wait(LIMIT).await
    }

    fn exit(&self, status: ExitStatus) -> Exit {
        Exit {
            status,
            took: self.since.elapsed(),
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }

    /// Waits until `path` exists; fails if lockd exits first, or after
    /// `within`.
    pub async fn wait_for_file(&mut self, path: &Path, within: Duration) {
        let deadline = Instant::now() + within;
        while !path.exists() {
            if let Some(status) = self.exited() {
                panic!(
                    "lockd exited ({status}) before {} appeared; stdout:\n{}\nstderr:\n{}",
                    path.display(),
                    self.stdout(),
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not appear within {within:?}; lockd's stderr:\n{}",
                path.display(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Lockd {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The command may outlive lockd (it was killed, or it left
        // processes behind): kill its process group, never our own.
        if let Some(pid) = self.command_pid() {
            let ours = getpgrp();
            match getpgid(Some(pid)) {
                Ok(group) if group == pid && group != ours => {
                    let _ = killpg(pid, Signal::SIGKILL);
                }
                Ok(group) if group != pid => {
                    let _ = kill(pid, Signal::SIGKILL);
                }
                Ok(_) => {}
                Err(_) if pid != ours => {
                    // The leader is gone; members of its group may not be.
                    let _ = killpg(pid, Signal::SIGKILL);
                }
                Err(_) => {}
            }
        }
    }
}

/// Runs `cmd` (from [`lockd`]) to its end, at most [`LIMIT`].
pub async fn run(cmd: impl BorrowMut<Command>) -> Exit {
    Lockd::spawn(cmd).wait(LIMIT).await
}

/// [`run`] for a test without a runtime.
pub fn run_blocking(cmd: impl BorrowMut<Command>) -> Exit {
    Lockd::spawn(cmd).wait_blocking(LIMIT)
}
