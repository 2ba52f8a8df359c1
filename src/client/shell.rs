//! `lockd acquire`, `extend`, `release` and `status`: one HTTP call each.
//! The server's answer goes to stdout as it is (JSON; nothing for a 204),
//! a one-line reason to stderr when it is not 2xx, and the exit code says
//! how it went (see [`exit_code`]).

use std::time::Duration;

use reqwest::StatusCode;

use super::api::{AcquireParams, Answer, CallError, LockClient};
use super::args::{AcquireArgs, ExtendArgs, ReleaseArgs, ServerArg, StatusArgs};
use super::exit;

/// How long a call may take beyond any wait it asks for.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The exit code for an answer: 0 for 2xx, 1 for 404 `lock-not-held`
/// (the lock is free, or the lease is gone), 75 for 409 and 429 (try
/// again later), 69 for 5xx, 64
/// for any other 4xx (including a 404 that is not lockd's "not held": a
/// wrong `--server` or an empty name).
pub fn exit_code(status: StatusCode, slug: &str) -> u8 {
    match status {
        s if s.is_success() => 0,
        StatusCode::NOT_FOUND if slug == "lock-not-held" => exit::NOT_FOUND,
        StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS => exit::CONFLICT,
        s if s.is_server_error() => exit::UNAVAILABLE,
        _ => exit::USAGE,
    }
}

/// `lockd acquire`.
pub async fn acquire(args: AcquireArgs) -> u8 {
    let params = AcquireParams {
        token: args.token.as_deref(),
        ttl_ms: args.ttl_ms,
        wait_ms: args.wait_ms,
        owner: args.owner.as_deref(),
    };
    let timeout = Duration::from_millis(args.wait_ms) + CALL_TIMEOUT;
    call(&args.server, |c| async move {
        c.acquire(&args.name, &params, timeout).await
    })
    .await
}

/// `lockd extend`.
pub async fn extend(args: ExtendArgs) -> u8 {
    call(&args.server, |c| async move {
        c.extend(&args.name, &args.token.token, args.ttl_ms, CALL_TIMEOUT)
            .await
    })
    .await
}

/// `lockd release`.
pub async fn release(args: ReleaseArgs) -> u8 {
    call(&args.server, |c| async move {
        c.release(&args.name, &args.token.token, CALL_TIMEOUT).await
    })
    .await
}

/// `lockd status`.
pub async fn status(args: StatusArgs) -> u8 {
    call(&args.server, |c| async move {
        c.status(&args.name, CALL_TIMEOUT).await
    })
    .await
}

async fn call<F, Fut>(server: &ServerArg, send: F) -> u8
where
    F: FnOnce(LockClient) -> Fut,
    Fut: Future<Output = Result<Answer, CallError>>,
{
    let client = match LockClient::new(
        &server.server,
        server.api_key.as_deref(),
        server.ca_cert.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lockd: {e}");
            return exit::USAGE;
        }
    };
    match send(client).await {
        Ok(answer) => {
            if !answer.body.is_empty() {
                println!("{}", answer.body);
            }
            if !answer.status.is_success() {
                let detail = answer.problem().detail;
                eprintln!("lockd: {}: {detail}", answer.status);
            }
            exit_code(answer.status, answer.problem().slug())
        }
        Err(e) => {
            eprintln!("lockd: {e}");
            exit::UNAVAILABLE
        }
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
