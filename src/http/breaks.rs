//! What the three `DELETE` routes (`/locks/{name}`, `/semaphores/{name}`,
//! `/runs/{key}`) share for an admin's break: the `force` and `fence`
//! query parameters, and the break itself (`?force=true`), which ends the
//! live leases of a name whatever their token.
//!
//! The key check ([`super::auth`]) asks for the `admin` permission before
//! a `force` request gets here, and refuses it outright when lockd has no
//! API keys (unless `--dev`); it leaves the [`Caller`] for the record.
//! Each break is logged at `warn` (who broke what: never a token),
//! counted in `lockd_breaks_total{kind}`, told to watchers as `broken`
//! and kept in the history with the key's id.

use std::sync::Arc;

use axum::Json;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Caller;
use super::deadline::{Deadline, timeout_or, within};
use super::locks::input::given_token;
use super::locks::model::{LockMode, LockNameSchema};
use super::problem::{ApiError, Kind as Problem};
use crate::lock::history::BrokenLease;
use crate::lock::{Kind, Locks, Meta, Subject};
use crate::metrics::Metrics;

/// Query parameters of a `DELETE`: `force=true` breaks (an admin's), with
/// `fence` to end one lease of several; without them it is the holder's
/// release, which takes none.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForceQuery {
    /// `true` to break the live lease(s) whatever their token; `false`, or
    /// absent, for a release with the holder's token.
    pub force: Option<String>,
    /// With `force=true`: the fence of the one lease to end (a shared
    /// lease, a permit); absent: every live one.
    pub fence: Option<String>,
}

/// What a `DELETE` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delete {
    /// The holder's release, with its token.
    Release,
    /// An admin's break: the lease of this fence, or every live one.
    Break(Option<u64>),
}

impl ForceQuery {
    /// What the query asks for.
    ///
    /// # Errors
    /// 400 for a `force` other than `true` or `false`, or a `fence` that is
    /// not a whole number or comes without `force=true`.
    pub fn parse(self) -> Result<Delete, ApiError> {
        let force = match self.force.as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => {
                return Err(ApiError::invalid(
                    "force must be `true` (break the live lease, whatever its token: needs an admin key) or `false`",
                ));
            }
        };
        let fence = self
            .fence
            .map(|f| {
                let digits = !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit());
                digits
                    .then(|| f.parse::<u64>().ok())
                    .flatten()
                    .ok_or_else(|| {
                        ApiError::invalid("fence must be a whole number, as a grant gave it")
                    })
            })
            .transpose()?;
        match (force, fence) {
            (true, fence) => Ok(Delete::Break(fence)),
            (false, None) => Ok(Delete::Release),
            (false, Some(_)) => Err(ApiError::invalid(
                "fence names the lease to break: it goes with force=true (a holder's release names its lease by its token)",
            )),
        }
    }
}

/// One lease a break ended: never its token.
#[derive(Debug, Serialize, ToSchema)]
pub struct BrokenHolder {
    /// Its fencing token: the next grant's is larger, so storage that
    /// checks fences refuses the broken holder's late writes.
    pub fence: u64,
    /// A lock's lease: `exclusive` or `shared` (absent for a permit or a
    /// run's attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// The holder's label, `null` when it gave none.
    pub owner: Option<String>,
    /// The holder's metadata, `null` when it gave none.
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
}

/// The answer to a break (200).
#[derive(Debug, Serialize, ToSchema)]
pub struct Broken {
    /// The lock's or semaphore's name (absent for a run).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<LockNameSchema>)]
    pub name: Option<String>,
    /// The run's key (absent for a lock or a semaphore).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<LockNameSchema>)]
    pub key: Option<String>,
    /// The leases ended, at least one.
    pub broken: Vec<BrokenHolder>,
}

/// Breaks the live leases of `subject` (the one of `fence`, when given)
/// for `caller`: the answer says whose leases ended.
///
/// # Errors
/// 400 when a token was given (a break needs none: it is not the holder's
/// release); `nothing` (a 404 of the subject's kind) when no live lease
/// matched; 501 for a kind the store does not keep; 503 as any call.
pub async fn break_leases(
    locks: &Arc<Locks>,
    metrics: &Metrics,
    deadline: Deadline,
    (headers, body_token): (&HeaderMap, Option<&str>),
    caller: Option<Caller>,
    (subject, fence): (Subject, Option<u64>),
    nothing: impl FnOnce(String) -> ApiError,
) -> Result<Json<Broken>, ApiError> {
    if given_token(headers, body_token)?.is_some() {
        return Err(ApiError::invalid(
            "force=true breaks the lease whatever its token, and takes none: drop the token, or drop force=true to release your own lease",
        ));
    }
    // The key check leaves a caller on every request it let break.
    let by = caller.ok_or_else(|| ApiError::new(Problem::Forbidden, NO_ADMIN))?;
    let outcome = within(deadline, locks.break_leases(&subject, fence, by.id())).await;
    let broken = outcome.map_err(timeout_or)?;
    if broken.is_empty() {
        return Err(nothing(match fence {
            Some(fence) => format!("nothing to break: no live lease has fence {fence}"),
            None => "nothing to break: no lease is live".into(),
        }));
    }
    metrics.observe_breaks(subject.kind(), broken.len());
    for lease in &broken {
        tracing::warn!(
            kind = subject.kind().as_str(),
            name = %subject.name(),
            fence = lease.fence,
            owner = lease.owner.as_deref().unwrap_or(""),
            by = by.id(),
            "broke a lease: its holder can no longer extend or release it, and its fence is refused by storage that checks fences"
        );
    }
    let name = subject.name().to_string();
    let (name, key) = match subject.kind() {
        Kind::Run => (None, Some(name)),
        Kind::Lock | Kind::Semaphore => (Some(name), None),
    };
    Ok(Json(Broken {
        name,
        key,
        broken: broken.into_iter().map(holder).collect(),
    }))
}

/// Why a break was refused for want of a caller (never reached: the key
/// check refuses first).
const NO_ADMIN: &str = "breaking a lease needs an API key with the admin permission";

fn holder(lease: BrokenLease) -> BrokenHolder {
    BrokenHolder {
        fence: lease.fence,
        mode: lease.mode.map(Into::into),
        owner: lease.owner,
        meta: lease.meta.as_ref().map(Meta::to_value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(force: Option<&str>, fence: Option<&str>) -> Result<Delete, ApiError> {
        ForceQuery {
            force: force.map(str::to_owned),
            fence: fence.map(str::to_owned),
        }
        .parse()
    }

    #[test]
    fn force_and_fence_parse_strictly() {
        assert_eq!(query(None, None).ok(), Some(Delete::Release));
        assert_eq!(query(Some("false"), None).ok(), Some(Delete::Release));
        assert_eq!(query(Some("true"), None).ok(), Some(Delete::Break(None)));
        assert_eq!(
            query(Some("true"), Some("17")).ok(),
            Some(Delete::Break(Some(17)))
        );
        assert!(query(Some("1"), None).is_err());
        assert!(query(Some("true"), Some("-1")).is_err());
        assert!(query(Some("true"), Some("+5")).is_err());
        assert!(query(Some("true"), Some("")).is_err());
        assert!(query(None, Some("17")).is_err());
    }
}
