//! The child supervisor of `lockd exec`: starts the command in a process
//! group of its own, forwards signals to it, stops it when the lease is
//! lost, and turns its exit status into an exit code.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use super::lease::Holder;
use super::say;
use crate::client::api::Lease;
use crate::client::args::ExecArgs;
use crate::client::exit;

/// The signals passed on to the command.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Starts the command, or returns 127 (not found) or 126 (cannot run).
pub(super) fn spawn(args: &ExecArgs, holder: &Holder, grant: &Lease) -> Result<Child, u8> {
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
        .env("LOCKD_SERVER", holder.servers.joined())
        .env("LOCKD_SEMAPHORE", if holder.semaphore { "1" } else { "0" });
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
pub(super) async fn supervise(
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
pub(super) fn catch_signals() -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
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
pub(super) fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => signal_code(sig),
        (None, None) => 1,
    }
}

pub(super) fn signal_code(sig: i32) -> u8 {
    u8::try_from(sig)
        .ok()
        .and_then(|s| exit::SIGNAL_BASE.checked_add(s))
        .unwrap_or(u8::MAX)
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

fn show(program: &OsString) -> String {
    program.to_string_lossy().into_owned()
}
