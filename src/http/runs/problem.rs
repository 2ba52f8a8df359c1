//! The refusals of runs: their problem types (each a [`LeaseProblem`],
//! answered as a [`Kind::Leased`]), and how the lock core's
//! [`StartRefusal`] and [`RunMiss`] become one.

use axum::http::StatusCode;

use crate::http::problem::{ApiError, Kind, LeaseProblem};
use crate::lock::run::{RunMiss, StartRefusal};

/// Every problem type only a run answers with.
pub const PROBLEMS: [&LeaseProblem; 4] = [
    &RUN_IN_PROGRESS,
    &FINGERPRINT_MISMATCH,
    &NOT_RUN_OWNER,
    &RUN_NOT_FOUND,
];

/// 409 `run-in-progress`: another attempt holds the run.
pub const RUN_IN_PROGRESS: LeaseProblem = LeaseProblem {
    status: StatusCode::CONFLICT,
    slug: "run-in-progress",
    title: "Another attempt is running",
};

/// 422 `fingerprint-mismatch`: the key was first used with another
/// fingerprint.
pub const FINGERPRINT_MISMATCH: LeaseProblem = LeaseProblem {
    status: StatusCode::UNPROCESSABLE_ENTITY,
    slug: "fingerprint-mismatch",
    title: "The run was started with another fingerprint",
};

/// 409 `not-run-owner`: the token does not hold the run's live attempt.
pub const NOT_RUN_OWNER: LeaseProblem = LeaseProblem {
    status: StatusCode::CONFLICT,
    slug: "not-run-owner",
    title: "The token does not hold the run's attempt",
};

/// 404 `run-not-found`: the run is unknown, or its retention ended.
pub const RUN_NOT_FOUND: LeaseProblem = LeaseProblem {
    status: StatusCode::NOT_FOUND,
    slug: "run-not-found",
    title: "No such run",
};

/// A 404 `run-not-found`.
pub fn run_not_found() -> ApiError {
    ApiError::new(
        Kind::Leased(&RUN_NOT_FOUND),
        "no run has this key: it was never started, or its retention ended",
    )
}

impl From<StartRefusal> for ApiError {
    fn from(refusal: StartRefusal) -> Self {
        match refusal {
            StartRefusal::InProgress { left, waited } => {
                let then = if waited {
                    "it did not end within wait_ms; retry then"
                } else {
                    "retry then, or start with wait_ms"
                };
                ApiError::held_for(
                    Kind::Leased(&RUN_IN_PROGRESS),
                    left,
                    |ms| {
                        format!(
                            "another attempt is running this job; its lease ends in at most {ms} ms, when it completes, is abandoned or runs out; {then}"
                        )
                    },
                    |no_ttl| format!("another attempt is running this job: {no_ttl}"),
                )
            }
            StartRefusal::FingerprintMismatch => ApiError::new(
                Kind::Leased(&FINGERPRINT_MISMATCH),
                "this key was first used with another fingerprint: the same key with another payload is not the same job; nothing was changed",
            ),
        }
    }
}

impl From<RunMiss> for ApiError {
    fn from(miss: RunMiss) -> Self {
        match miss {
            RunMiss::Unknown => run_not_found(),
            RunMiss::NotOwner { done: true } => ApiError::new(
                Kind::Leased(&NOT_RUN_OWNER),
                "the run is done: it has no live attempt to complete, abandon or extend; nothing was changed (GET it, or POST to read its result)",
            ),
            RunMiss::NotOwner { done: false } => ApiError::new(
                Kind::Leased(&NOT_RUN_OWNER),
                "this token does not hold the run's live attempt: another attempt holds it, or this one was abandoned, broken by an admin or its lease ran out (and may have been taken over); nothing was changed",
            ),
        }
    }
}
