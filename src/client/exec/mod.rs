//! `lockd exec NAME -- CMD [ARGS...]`: run a command while holding a lock,
//! like `flock(1)` across machines (compare `etcdctl lock` and `consul
//! lock`).
//!
//! 1. Take the lock through the first usable server
//!    ([`Servers`](super::servers::Servers)), under a token generated
//!    here, so that a grant whose answer was lost can still be released,
//!    and an acquire tried again on the next server renews that grant
//!    rather than making another.
//! 2. Run the command with `LOCKD_NAME`, `LOCKD_TOKEN`, `LOCKD_FENCE` and
//!    `LOCKD_SERVER` (every server, comma-separated; and `LOCKD_CA_CERT`,
//!    made absolute, with `--ca-cert`) in its environment, in a process
//!    group of its own (unless `--foreground`), so that a signal reaches
//!    every process it started; renew the lease at a third of the TTL
//!    while it runs, through the server that answered last, moving on to
//!    the next when it stops answering; forward SIGINT, SIGTERM, SIGHUP,
//!    SIGQUIT, SIGUSR1 and SIGUSR2 to it.
//! 3. If the lease is lost for good (a renewal answered 404 or 409, or no
//!    server renewed it by `--kill-grace-ms` before its end, at most half
//!    the TTL), send the command SIGTERM, then SIGKILL after
//!    `--kill-grace-ms` (so that, stopped for want of a renewal, it is
//!    gone by the lease's end), and exit 70.
//! 4. When the command ends, however it ends, release the lock, and exit
//!    with its status (128 + N when signal N killed it).
//!
//! With `--once`, NAME is a run's key ([`crate::lock::run`]): the lease is
//! the run's attempt; a done run is not run again (exit 0, saying when it
//! was done); exit 0 completes the run with `{"exit_code": 0}` and another
//! exit abandons the attempt, so that a later run tries again.
//!
//! The exit codes are in [`super::exit`].
//!
//! `lease` keeps the lease (acquire, renew, release, notice its loss);
//! `child` runs the command (spawn, signals, process group, exit status).

mod child;
mod lease;

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::api::{ClientError, Lease, RunStart};
use super::args::ExecArgs;
use super::exit;
use super::servers::Failure;
use crate::lock::Token;
use child::{catch_signals, signal_code, spawn, status_code, supervise};
use lease::{Holder, keep_renewing, lease_end};
// For the tests below.
#[cfg(test)]
use {lease::default_owner, std::process::ExitStatus};

/// Runs `lockd exec` and returns its exit code.
pub async fn run(args: ExecArgs) -> u8 {
    if let Err(e) = super::args::check_name(&args.name) {
        say(&e);
        return exit::USAGE;
    }
    let servers = match args.server.servers() {
        Ok(s) => s,
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
        servers,
        name: args.name.clone(),
        semaphore: args.semaphore.semaphore,
        once: args.once,
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
    let answer = match answer {
        Ok(RunStart::Done {
            completed_at,
            attempt,
            ..
        }) => {
            if !args.quiet {
                say(&format!(
                    "{} was done at {completed_at} (attempt {attempt}); the command was not run",
                    holder.name
                ));
            }
            return 0;
        }
        Ok(RunStart::Attempt(lease)) => Ok(lease),
        Err(failure) => Err(failure),
    };
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
    let kill_grace = Duration::from_millis(args.kill_grace_ms);
    let renewer = tokio::spawn(keep_renewing(
        holder.clone(),
        ttl,
        lease_end,
        kill_grace,
        lost_tx,
    ));
    let (status, lost) = supervise(
        &mut child,
        !args.foreground,
        &mut signals,
        lost_rx,
        kill_grace,
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
    let code = match status {
        Ok(status) => status_code(status),
        Err(e) => {
            say(&format!("cannot wait for the command: {e}"));
            exit::UNAVAILABLE
        }
    };
    if holder.once && code == 0 {
        return holder.complete_after_run(ttl).await;
    }
    // A run's attempt that failed is abandoned, so that a later run tries
    // again; a lock or a permit is released.
    holder.release_after_run(ttl).await;
    code
}

/// The lease, or the exit code when there is none.
async fn take_grant(
    holder: &Holder,
    args: &ExecArgs,
    answer: Result<Lease, Failure>,
) -> Result<Lease, u8> {
    let failure = match answer {
        Ok(lease) => return Ok(lease),
        Err(failure) => failure,
    };
    let (who, tried) = (failure.who(), failure.tried());
    match &failure.error {
        ClientError::Unreachable(e) => {
            // The lock may have been granted just before the answer was lost.
            holder.release_quietly().await;
            say(&format!("{e}{tried}; the command was not run"));
            Err(exit::UNAVAILABLE)
        }
        e @ ClientError::Unexpected { .. } => {
            say(&format!("{e} ({}){tried}", failure.server));
            Err(exit::UNAVAILABLE)
        }
        e @ (ClientError::Held { .. } | ClientError::NotOwner { .. }) => {
            if args.quiet {
                return Err(args.conflict_exit_code);
            }
            let frees = e
                .retry_after()
                .map(|d| format!("; it frees in at most {} ms", d.as_millis()))
                .unwrap_or_default();
            let held = if holder.once {
                format!("another attempt is running {}", holder.name)
            } else if holder.semaphore {
                format!("every permit of {} is held", holder.name)
            } else {
                format!("{} is held by another holder", holder.name)
            };
            say(&format!("{held}{frees}{tried}; the command was not run"));
            Err(args.conflict_exit_code)
        }
        ClientError::RateLimited { answer, .. } => {
            say(&format!(
                "the API key is over its rate limit ({}){tried}; the command was not run",
                answer.problem.detail
            ));
            Err(exit::CONFLICT)
        }
        ClientError::Unavailable { answer, .. } | ClientError::ServerError { answer } => {
            holder.release_quietly().await;
            say(&format!(
                "{who} answered {}: {}{tried}; the command was not run",
                answer.status, answer.problem.detail
            ));
            Err(exit::UNAVAILABLE)
        }
        ClientError::NotHeld { answer } | ClientError::Refused { answer } => {
            say(&format!(
                "{who} refused the request ({}): {}{tried}",
                answer.status, answer.problem.detail
            ));
            Err(exit::USAGE)
        }
    }
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
