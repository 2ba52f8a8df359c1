//! `lockd acquire`, `extend`, `release`, `status` and `run ...`: one HTTP
//! call each,
//! to the first of the servers that is usable ([`Servers`]). The server's
//! answer goes to stdout as it is (JSON; nothing for a 204), a one-line
//! reason to stderr when it is not 2xx (naming the servers passed over),
//! and the exit code says how it went (see [`exit_code`]).

use std::time::Duration;

use reqwest::StatusCode;

use super::api::{AcquireParams, ClientError, ProblemInfo, Refusal, Target};
use super::args::{
    AcquireArgs, BreakArgs, ExtendArgs, HistoryArgs, ReleaseArgs, RunCommand, ServerArg,
    StatusArgs, check_name,
};
use super::exit;
use super::servers::{Answered, Failure, Servers};
use crate::lock::Token;

/// How long a call may take beyond any wait it asks for, over all the
/// servers it tries.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The exit code for an answer: 0 for 2xx, 1 for 404 `lock-not-held`
/// (the lock is free, or the lease is gone), 75 for 409 and 429 (try
/// again later), 69 for 5xx, 64
/// for any other 4xx (including a 404 that is not lockd's "not held": a
/// wrong `--server` or an empty name).
pub fn exit_code(status: StatusCode, slug: &str) -> u8 {
    if status.is_success() {
        return 0;
    }
    error_code(&ClientError::from_refusal(Refusal {
        status,
        body: String::new(),
        problem: ProblemInfo {
            problem_type: format!("urn:lockd:problem:{slug}"),
            ..ProblemInfo::default()
        },
    }))
}

/// The exit code for a call that did not succeed (see [`exit_code`]).
pub(super) fn error_code(error: &ClientError) -> u8 {
    match error {
        ClientError::NotHeld { .. } => exit::NOT_FOUND,
        ClientError::Held { .. }
        | ClientError::NotOwner { .. }
        | ClientError::RateLimited { .. } => exit::CONFLICT,
        ClientError::Unavailable { .. }
        | ClientError::ServerError { .. }
        | ClientError::Unreachable(_) => exit::UNAVAILABLE,
        ClientError::Refused { .. } => exit::USAGE,
        // The server said 2xx: the call worked, whatever its body.
        ClientError::Unexpected { .. } => 0,
    }
}

/// `lockd acquire`. Without `--token`, the token is chosen here, so that
/// an acquire tried again on the next server renews a grant whose answer
/// was lost.
pub async fn acquire(args: AcquireArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    let params = AcquireParams {
        token: args.token.as_deref(),
        ttl_ms: args.ttl_ms,
        wait_ms: args.wait_ms,
        owner: args.owner.as_deref(),
        meta: args.meta.as_ref(),
        limit: args.semaphore.limit,
        fingerprint: None,
        shared: args.shared,
    };
    let target = Target::new(&args.name, args.semaphore.semaphore);
    call(&args.server, |s| async move {
        s.acquire(target, &params, CALL_TIMEOUT).await
    })
    .await
}

/// `lockd extend`.
pub async fn extend(args: ExtendArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    call(&args.server, |s| async move {
        let target = Target::new(&args.name, args.semaphore.semaphore);
        s.extend(target, &args.token.token, args.ttl_ms, CALL_TIMEOUT)
            .await
    })
    .await
}

/// `lockd release`.
pub async fn release(args: ReleaseArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    call(&args.server, |s| async move {
        let target = Target::new(&args.name, args.semaphore.semaphore);
        s.release(target, &args.token.token, CALL_TIMEOUT).await
    })
    .await
}

/// `lockd status`.
pub async fn status(args: StatusArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    call(&args.server, |s| async move {
        s.status(
            Target::new(&args.name, args.semaphore.semaphore),
            CALL_TIMEOUT,
        )
        .await
    })
    .await
}

/// `lockd break`: an admin's break (the key needs `admin`).
pub async fn break_leases(args: BreakArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    call(&args.server, |s| async move {
        s.break_leases(args.kind.target(&args.name), args.fence, CALL_TIMEOUT)
            .await
    })
    .await
}

/// `lockd history`.
pub async fn history(args: HistoryArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    call(&args.server, |s| async move {
        s.history(args.kind.target(&args.name), CALL_TIMEOUT).await
    })
    .await
}

/// `lockd run ...`: one call on a run.
pub async fn run(command: RunCommand) -> u8 {
    if let Err(e) = check_name(command.key()) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    match command {
        RunCommand::Start(args) => {
            let token = args
                .token
                .clone()
                .unwrap_or_else(|| Token::generate().expose().to_owned());
            let params = AcquireParams {
                token: Some(&token),
                ttl_ms: args.ttl_ms,
                wait_ms: args.wait_ms,
                owner: args.owner.as_deref(),
                meta: args.meta.as_ref(),
                limit: None,
                fingerprint: args.fingerprint.as_deref(),
                shared: false,
            };
            call(&args.server, |s| async move {
                s.start_run(&args.key, &params, CALL_TIMEOUT).await
            })
            .await
        }
        RunCommand::Complete(args) => {
            let result: serde_json::Value = match serde_json::from_str(&args.result) {
                Ok(result) => result,
                Err(e) => {
                    eprintln!("lockd: --result is not JSON: {e}");
                    return exit::USAGE;
                }
            };
            call(&args.server, |s| async move {
                s.complete_run(&args.key, &args.token.token, &result, CALL_TIMEOUT)
                    .await
            })
            .await
        }
        RunCommand::Abandon(args) => {
            call(&args.server, |s| async move {
                s.release(Target::Run(&args.key), &args.token.token, CALL_TIMEOUT)
                    .await
            })
            .await
        }
        RunCommand::Extend(args) => {
            call(&args.server, |s| async move {
                s.extend(
                    Target::Run(&args.key),
                    &args.token.token,
                    args.ttl_ms,
                    CALL_TIMEOUT,
                )
                .await
            })
            .await
        }
        RunCommand::Status(args) => {
            call(&args.server, |s| async move {
                s.status(Target::Run(&args.key), CALL_TIMEOUT).await
            })
            .await
        }
    }
}

async fn call<T, F, Fut>(server: &ServerArg, send: F) -> u8
where
    F: FnOnce(Servers) -> Fut,
    Fut: Future<Output = Result<Answered<T>, Failure>>,
{
    let servers = match server.servers() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lockd: {e}");
            return exit::USAGE;
        }
    };
    let failure = match send(servers).await {
        Ok(answered) => {
            print_body(&answered.reply.body);
            return 0;
        }
        Err(f) => f,
    };
    match &failure.error {
        ClientError::Unexpected { body, .. } => print_body(body),
        ClientError::Unreachable(_) => eprintln!("lockd: {failure}"),
        refused => {
            if let Some(answer) = refused.refusal() {
                print_body(&answer.body);
                eprintln!("lockd: {failure}");
            }
        }
    }
    error_code(&failure.error)
}

/// The server's answer, as sent, on stdout (nothing for an empty body).
fn print_body(body: &str) {
    if !body.is_empty() {
        println!("{body}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_status() {
        assert_eq!(exit_code(StatusCode::CREATED, ""), 0);
        assert_eq!(exit_code(StatusCode::NO_CONTENT, ""), 0);
        assert_eq!(exit_code(StatusCode::NOT_FOUND, "lock-not-held"), 1);
        assert_eq!(exit_code(StatusCode::NOT_FOUND, "route-not-found"), 64);
        assert_eq!(exit_code(StatusCode::NOT_FOUND, ""), 64);
        assert_eq!(exit_code(StatusCode::CONFLICT, "lock-held"), 75);
        assert_eq!(exit_code(StatusCode::TOO_MANY_REQUESTS, "rate-limited"), 75);
        assert_eq!(exit_code(StatusCode::BAD_REQUEST, "invalid-request"), 64);
        assert_eq!(exit_code(StatusCode::SERVICE_UNAVAILABLE, ""), 69);
        assert_eq!(exit_code(StatusCode::INTERNAL_SERVER_ERROR, ""), 69);
    }
}
