//! `lockd exec NAME -- CMD [ARGS...]`: run a command while holding a lock,
//! like `flock(1)` across machines (compare `etcdctl lock` and `consul
//! lock`).
//!
//! 1. Take the lock through the server, under a token generated here, so
//!    that a grant whose answer was lost can still be released.
//! 2. Run the command with `LOCKD_NAME`, `LOCKD_TOKEN`, `LOCKD_FENCE` and
//!    `LOCKD_SERVER` (and `LOCKD_CA_CERT`, made absolute, with `--ca-cert`)
//!    in its environment, in a process group of its own
//!    (unless `--foreground`), so that a signal reaches every process it
//!    started; renew the lease at a third of the TTL while it runs; forward
//!    SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to it.
//! 3. If the lease is lost for good (a renewal answered 404 or 409, or the
//!    lease ran out while the server could not be reached), send the
//!    command SIGTERM, then SIGKILL after `--kill-grace-ms`, and exit 70.
//! 4. When the command ends, however it ends, release the lock, and exit
//!    with its status (128 + N when signal N killed it).
//!
//! The exit codes are in [`super::exit`].

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use super::api::{AcquireParams, ClientError, Lease, LockClient, Reply};
use super::args::ExecArgs;
use super::exit;
use crate::backoff::ExponentialBackoff;
use crate::lock::Token;

/// How long the acquire may take beyond `--wait-ms` before the server
/// counts as unreachable (the server itself answers 503 after its
/// `--request-timeout-ms`, 10 s by default).
const ACQUIRE_MARGIN: Duration = Duration::from_secs(15);
/// The longest a renewal or the release may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// The longest a release whose answer does not matter may take (after the
/// lease was lost, or when the acquire's outcome is unknown): the lease
/// ends by itself anyway, and the exit must not wait on a stuck server.
const QUIET_RELEASE_LIMIT: Duration = Duration::from_secs(1);
/// How long releasing may be retried when the server does not answer.
const RELEASE_FOR: Duration = Duration::from_secs(5);
/// The pauses between those retries: 100 ms doubling (within
/// [`RELEASE_FOR`], which ends them before any cap).
const RELEASE_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(100), RELEASE_FOR);
/// The signals passed on to the command.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Runs `lockd exec` and returns its exit code.
pub async fn run(args: ExecArgs) -> u8 {
    let client = match LockClient::new(
        &args.server.server,
        args.server.api_key.as_deref(),
        args.server.ca_cert.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            say(&e.to_string());
            return exit::USAGE;
        }
    };
    let mut signals = match catch_signals() {
        Ok(s) => s,
        Err(e) => {
            say(&format!("cannot handle signals: {e}"));
            return exit::UNAVAILABLE;
        }
    };
    let holder = Holder {
        client,
        name: args.name.clone(),
        token: Token::generate(),
    };
    let sent = Instant::now();
    let answer = tokio::select! {
        answer = holder.acquire(&args) => answer,
        Some(sig) = signals.recv() => {
            holder.release_quietly().await;
            say(&format!("{} before the command started; it was not run", sig.as_str()));
            return signal_code(sig as i32);
        }
    };
    let received = Instant::now();
    let grant = match take_grant(&holder, &args, answer).await {
        Ok(grant) => grant,
        Err(code) => return code,
    };
    let mut child = match spawn(&args, &holder, &grant) {
        Ok(child) => child,
        Err(code) => {
            holder.release_quietly().await;
            return code;
        }
    };
    let ttl = Duration::from_millis(grant.ttl_ms.max(1));
    let lease_end = lease_end(sent, received, ttl);
    let (lost_tx, lost_rx) = oneshot::channel();
    let renewer = tokio::spawn(keep_renewing(holder.clone(), ttl, lease_end, lost_tx));
    let (status, lost) = supervise(
        &mut child,
        !args.foreground,
        &mut signals,
        lost_rx,
        Duration::from_millis(args.kill_grace_ms),
    )
    .await;
    renewer.abort();
    if let Some(why) = lost {
        holder.release_quietly().await;
        say(&format!(
            "exiting {}: the lease on {} was lost while the command ran: {why}",
            exit::LEASE_LOST,
            holder.name
        ));
        return exit::LEASE_LOST;
    }
    holder.release_after_run(ttl).await;
    match status {
        Ok(status) => status_code(status),
        Err(e) => {
            say(&format!("cannot wait for the command: {e}"));
            exit::UNAVAILABLE
        }
    }
}

/// The lock, as this process holds it.
#[derive(Clone)]
struct Holder {
    client: LockClient,
    name: String,
    token: Token,
}

impl Holder {
    async fn acquire(&self, args: &ExecArgs) -> Result<Reply<Lease>, ClientError> {
        let owner = args.owner.clone().unwrap_or_else(default_owner);
        let params = AcquireParams {
            token: Some(self.token.expose()),
            ttl_ms: args.ttl_ms,
            wait_ms: args.wait_ms,
            owner: Some(&owner),
        };
        let timeout = Duration::from_millis(args.wait_ms) + ACQUIRE_MARGIN;
        self.client.acquire(&self.name, &params, timeout).await
    }

    /// Releases the lock if this token holds it, ignoring the answer: used
    /// when the outcome of the acquire is unknown or the lease was lost.
    async fn release_quietly(&self) {
        let _ = self
            .client
            .release(&self.name, self.token.expose(), QUIET_RELEASE_LIMIT)
            .await;
    }

    /// Releases the lock after the command ended, retrying for a while when
    /// the server does not answer, and says on stderr when it could not.
    async fn release_after_run(&self, ttl: Duration) {
        let give_up = Instant::now() + RELEASE_FOR.min(ttl);
        let mut backoff = RELEASE_BACKOFF.pauses();
        loop {
            let why = match self
                .client
                .release(&self.name, self.token.expose(), CALL_LIMIT)
                .await
            {
                Ok(_) => return,
                Err(ClientError::NotHeld { .. }) => {
                    say(&format!(
                        "the lease on {} had already run out when the command ended",
                        self.name
                    ));
                    return;
                }
                // Over the key's rate passes; so may a server error.
                Err(
                    ClientError::RateLimited { answer, .. }
                    | ClientError::Unavailable { answer, .. }
                    | ClientError::ServerError { answer },
                ) => answer.status.to_string(),
                Err(ClientError::Unreachable(e)) => e.to_string(),
                Err(other) => {
                    let status = other.status().map(|s| s.to_string()).unwrap_or_default();
                    say(&format!("cannot release {}: {status}", self.name));
                    return;
                }
            };
            let pause = backoff.next_pause();
            if Instant::now() + pause >= give_up {
                say(&format!(
                    "cannot release {} ({why}); it frees when its lease runs out",
                    self.name
                ));
                return;
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// The lease, or the exit code when there is none.
async fn take_grant(
    holder: &Holder,
    args: &ExecArgs,
    answer: Result<Reply<Lease>, ClientError>,
) -> Result<Lease, u8> {
    match answer {
        Ok(reply) => Ok(reply.value),
        Err(ClientError::Unreachable(e)) => {
            // The lock may have been granted just before the answer was lost.
            holder.release_quietly().await;
            say(&format!("{e}; the command was not run"));
            Err(exit::UNAVAILABLE)
        }
        Err(e @ ClientError::Unexpected { .. }) => {
            say(&e.to_string());
            Err(exit::UNAVAILABLE)
        }
        Err(e @ (ClientError::Held { .. } | ClientError::NotOwner { .. })) => {
            if args.quiet {
                return Err(args.conflict_exit_code);
            }
            let frees = e
                .retry_after()
                .map(|d| format!("; it frees in at most {} ms", d.as_millis()))
                .unwrap_or_default();
            say(&format!(
                "{} is held by another holder{frees}; the command was not run",
                holder.name
            ));
            Err(args.conflict_exit_code)
        }
        Err(ClientError::RateLimited { answer, .. }) => {
            say(&format!(
                "the API key is over its rate limit ({}); the command was not run",
                answer.problem.detail
            ));
            Err(exit::CONFLICT)
        }
        Err(ClientError::Unavailable { answer, .. } | ClientError::ServerError { answer }) => {
            holder.release_quietly().await;
            say(&format!(
                "the server answered {}: {}; the command was not run",
                answer.status, answer.problem.detail
            ));
            Err(exit::UNAVAILABLE)
        }
        Err(ClientError::NotHeld { answer } | ClientError::Refused { answer }) => {
            say(&format!(
                "the server refused the request ({}): {}",
                answer.status, answer.problem.detail
            ));
            Err(exit::USAGE)
        }
    }
}

/// Starts the command, or returns 127 (not found) or 126 (cannot run).
fn spawn(args: &ExecArgs, holder: &Holder, grant: &Lease) -> Result<Child, u8> {
    let Some((program, rest)) = args.command.split_first() else {
        say("no command given after --");
        return Err(exit::USAGE);
    };
    let fence = grant.fence.map(|f| f.to_string()).unwrap_or_default();
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("LOCKD_NAME", &holder.name)
        .env("LOCKD_TOKEN", holder.token.expose())
        .env("LOCKD_FENCE", fence)
        .env("LOCKD_SERVER", &args.server.server);
    if let Some(key) = &args.server.api_key {
        // So that `lockd status` in the command may ask, as with the
        // variable (a key from --api-key would otherwise be lost).
        command.env("LOCKD_API_KEY", key);
    }
    if let Some(ca_cert) = &args.server.ca_cert {
        // So that `lockd status` in the command trusts the server too.
        command.env(
            "LOCKD_CA_CERT",
            std::path::absolute(ca_cert).unwrap_or_else(|_| ca_cert.clone()),
        );
    }
    if !args.foreground {
        command.process_group(0);
    }
    let spawned = command.spawn();
    spawned.map_err(|e| {
        say(&format!("cannot run {}: {e}", show(program)));
        if e.kind() == std::io::ErrorKind::NotFound {
            exit::NOT_FOUND_COMMAND
        } else {
            exit::CANNOT_EXECUTE
        }
    })
}

/// Waits for the command to end, forwarding signals to it, and stops it
/// when the lease is lost. Returns its status and why the lease was lost.
async fn supervise(
    child: &mut Child,
    own_group: bool,
    signals: &mut mpsc::UnboundedReceiver<Signal>,
    mut lost_rx: oneshot::Receiver<String>,
    kill_grace: Duration,
) -> (std::io::Result<ExitStatus>, Option<String>) {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let send = |sig: Signal| {
        // The command may have ended already: nothing to do then.
        match pid {
            Some(pid) if own_group => {
                let _ = killpg(pid, sig);
            }
            Some(pid) => {
                let _ = kill(pid, sig);
            }
            None => {}
        }
    };
    let mut lost: Option<String> = None;
    let mut watching = true;
    let mut kill_at: Option<Instant> = None;
    // Ctrl-Z: the command stops with lockd exec, and goes on with it. (While
    // both are stopped the lease may run out; the next renewal then says so
    // and the command is stopped for good.)
    let mut stop_signals = catch(Signal::SIGTSTP);
    let mut cont_signals = catch(Signal::SIGCONT);
    loop {
        let deadline = kill_at.unwrap_or_else(far_future);
        tokio::select! {
            status = child.wait() => {
                if lost.is_some() && own_group {
                    // The lease is gone: nothing the command started may
                    // go on running, whatever it did with SIGTERM.
                    send(Signal::SIGKILL);
                }
                return (status, lost);
            }
            Some(sig) = signals.recv() => send(sig),
            Some(()) = next_of(&mut stop_signals) => {
                if own_group {
                    send(Signal::SIGTSTP);
                }
                let _ = kill(Pid::this(), Signal::SIGSTOP);
            }
            Some(()) = next_of(&mut cont_signals) => {
                if own_group {
                    send(Signal::SIGCONT);
                }
            }
            reason = &mut lost_rx, if watching => {
                watching = false;
                if let Ok(reason) = reason {
                    say(&format!("{reason}; stopping the command (SIGTERM)"));
                    send(Signal::SIGTERM);
                    kill_at = Some(Instant::now() + kill_grace);
                    lost = Some(reason);
                }
            }
            () = sleep_until(deadline), if kill_at.is_some() => {
                say("the command did not stop within --kill-grace-ms; sending SIGKILL");
                send(Signal::SIGKILL);
                kill_at = None;
            }
        }
    }
}

/// When the first lease ends at the earliest, by this process's clock.
///
/// The grant happened between sending the acquire (`sent`) and receiving
/// its answer (`received`). Without a wait that span is one round trip, and
/// `sent + ttl` is the safe end. After a long wait the grant came near the
/// end of it: then the end is counted from the answer, less a tenth of the
/// TTL for the answer's way back. Counting from `sent` there would take a
/// lease granted a moment ago for one already run out.
fn lease_end(sent: Instant, received: Instant, ttl: Duration) -> Instant {
    (sent + ttl).max((received + ttl).checked_sub(ttl / 10).unwrap_or(received))
}

/// Renews the lease when a third of it has passed, until aborted. A
/// renewal that fails for a while (5xx, no answer) is retried sooner; when
/// the lease is lost for good, or runs out before a renewal succeeds, says
/// why on `lost` and stops.
async fn keep_renewing(
    holder: Holder,
    ttl: Duration,
    mut lease_end: Instant,
    lost: oneshot::Sender<String>,
) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let retry = (ttl / 10).max(Duration::from_millis(50));
    let mut next = lease_end.checked_sub(ttl * 2 / 3).unwrap_or(lease_end);
    // The reason of the failures since the last renewal that worked.
    let mut failing: Option<String> = None;
    loop {
        sleep_until(next.min(lease_end)).await;
        let sent = Instant::now();
        if sent >= lease_end {
            let why = failing.map_or_else(
                || "no renewal could be sent in time".to_owned(),
                |f| format!("the renewals failed: {f}"),
            );
            let _ = lost.send(format!("the lease ran out; {why}"));
            return;
        }
        let timeout = (lease_end - sent).min(CALL_LIMIT);
        let answer = holder
            .client
            .extend(&holder.name, holder.token.expose(), Some(ttl_ms), timeout)
            .await;
        match answer {
            Ok(_) => {
                if failing.take().is_some() {
                    say("renewed again");
                }
                lease_end = sent + ttl;
                next = sent + ttl / 3;
                continue;
            }
            Err(ClientError::NotHeld { .. }) => {
                let _ = lost.send("renewal answered 404: the lease is gone".into());
                return;
            }
            Err(ClientError::NotOwner { .. } | ClientError::Held { .. }) => {
                let _ = lost.send("renewal answered 409: another holder has the lock".into());
                return;
            }
            Err(ClientError::Refused { answer }) => {
                let why = answer.problem.detail;
                let _ = lost.send(format!("renewal refused ({}): {why}", answer.status));
                return;
            }
            Err(
                ClientError::RateLimited { answer, .. }
                | ClientError::Unavailable { answer, .. }
                | ClientError::ServerError { answer },
            ) => {
                let why = format!("the server answered {}", answer.status);
                failing = Some(report_failure(failing, why));
            }
            Err(e) => {
                failing = Some(report_failure(failing, e.to_string()));
            }
        }
        next = Instant::now() + retry;
    }
}

/// Says on stderr that renewals began to fail (once per streak), and
/// returns the latest reason.
fn report_failure(before: Option<String>, why: String) -> String {
    if before.is_none() {
        say(&format!(
            "renewal failed ({why}); retrying until the lease ends"
        ));
    }
    why
}

/// A stream of `sig`, caught from now on (`None` if it cannot be).
fn catch(sig: Signal) -> Option<tokio::signal::unix::Signal> {
    signal(SignalKind::from_raw(sig as i32)).ok()
}

/// The next `sig` from a stream of [`catch`]; never, without one.
async fn next_of(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Catches the forwarded signals from now on, instead of letting them stop
/// this process.
fn catch_signals() -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
    let (tx, rx) = mpsc::unbounded_channel();
    for sig in FORWARDED {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}

/// The exit code for the command's status: its own code, or 128 + N when
/// signal N killed it.
fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => signal_code(sig),
        (None, None) => 1,
    }
}

fn signal_code(sig: i32) -> u8 {
    u8::try_from(sig)
        .ok()
        .and_then(|s| exit::SIGNAL_BASE.checked_add(s))
        .unwrap_or(u8::MAX)
}

/// `hostname:pid`.
fn default_owner() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

fn show(program: &OsString) -> String {
    program.to_string_lossy().into_owned()
}

fn say(message: &str) {
    eprintln!("lockd exec: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn exit_status_maps_to_the_code_a_shell_reports() {
        assert_eq!(status_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(status_code(ExitStatus::from_raw(3 << 8)), 3);
        // Killed by SIGKILL (9) and SIGTERM (15).
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(status_code(ExitStatus::from_raw(15)), 143);
    }

    #[test]
    fn a_lease_granted_after_a_long_wait_ends_a_ttl_after_the_answer() {
        let sent = Instant::now();
        let ttl = Duration::from_millis(1000);
        // No wait: counted from the request.
        let quick = sent + Duration::from_millis(5);
        assert_eq!(lease_end(sent, quick, ttl), sent + ttl);
        // A 3 s wait: counted from the answer, less a tenth of the TTL.
        let late = sent + Duration::from_secs(3);
        assert_eq!(
            lease_end(sent, late, ttl),
            late + Duration::from_millis(900)
        );
    }

    #[test]
    fn the_default_owner_is_host_and_pid() {
        let owner = default_owner();
        assert!(
            owner.ends_with(&format!(":{}", std::process::id())),
            "{owner}"
        );
    }
}
