//! The refusals of semaphores: their problem types (each a
//! [`LeaseProblem`], answered as a [`Kind::Leased`]), and how the lock
//! core's [`Refusal`] becomes one.

use axum::http::StatusCode;

use crate::http::problem::{ApiError, Kind, LeaseProblem};
use crate::lock::semaphore::Refusal;

/// Every problem type only a semaphore answers with.
pub const PROBLEMS: [&LeaseProblem; 4] = [
    &SEMAPHORE_FULL,
    &LIMIT_MISMATCH,
    &PERMIT_NOT_HELD,
    &SEMAPHORE_FREE,
];

/// 409 `semaphore-full`: every permit of the semaphore is held.
pub const SEMAPHORE_FULL: LeaseProblem = LeaseProblem {
    status: StatusCode::CONFLICT,
    slug: "semaphore-full",
    title: "Semaphore is full",
};

/// 409 `limit-mismatch`: the semaphore's permits are held under another
/// limit.
pub const LIMIT_MISMATCH: LeaseProblem = LeaseProblem {
    status: StatusCode::CONFLICT,
    slug: "limit-mismatch",
    title: "Permits are held under another limit",
};

/// 404 `permit-not-held`: the token holds no permit of the semaphore.
pub const PERMIT_NOT_HELD: LeaseProblem = LeaseProblem {
    status: StatusCode::NOT_FOUND,
    slug: "permit-not-held",
    title: "Permit is not held",
};

/// 404 `semaphore-free`: no permit of the semaphore is held.
pub const SEMAPHORE_FREE: LeaseProblem = LeaseProblem {
    status: StatusCode::NOT_FOUND,
    slug: "semaphore-free",
    title: "No permit is held",
};

/// A 404 `permit-not-held`.
pub fn permit_not_held() -> ApiError {
    ApiError::new(
        Kind::Leased(&PERMIT_NOT_HELD),
        "this token holds no permit of this semaphore: it was given back or its lease ran out",
    )
}

/// A 404 `semaphore-free`.
pub fn semaphore_free() -> ApiError {
    ApiError::new(
        Kind::Leased(&SEMAPHORE_FREE),
        "no permit of this semaphore is held: all are free",
    )
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let (error, limit) = match refusal {
            Refusal::Full { retry_after, limit } => (
                ApiError::new(
                    Kind::Leased(&SEMAPHORE_FULL),
                    match limit.get() {
                        1 => format!(
                            "the only permit of this semaphore is held; it runs out in at most {} ms",
                            retry_after.as_millis()
                        ),
                        n => format!(
                            "all {n} permits of this semaphore are held; the earliest runs out in at most {} ms",
                            retry_after.as_millis()
                        ),
                    },
                )
                .retry_after(retry_after),
                limit,
            ),
            Refusal::LimitMismatch { held } => (
                ApiError::new(
                    Kind::Leased(&LIMIT_MISMATCH),
                    format!(
                        "the permits of this semaphore are held under limit {}; ask with that limit, or a new one once every permit is given back or has run out",
                        held.get()
                    ),
                ),
                held,
            ),
        };
        error.with_limit(limit.get())
    }
}
