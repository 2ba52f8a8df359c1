//! `GET /locks`: the held locks, page by page, without their tokens.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};

use super::model::{CursorSchema, ListedLock, LockList, NamePrefixSchema, PageLimitSchema};
use crate::auth::ListScope;
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::StrictQuery;
use crate::http::listing::{ListQuery, ListRequest};
use crate::http::problem::{ApiError, KeyRefusals, Problem, StoreError};
use crate::lock::Kind;
use crate::lock::Locks;
use crate::metrics::Metrics;

/// List the held locks whose names start with `prefix`, as `GET
/// /locks/{name}` shows each (never a token), at most `limit` a page.
/// Follow `next_cursor` until it is `null`: a page may hold fewer than
/// `limit` locks, even none, before the last (each page costs lockd and
/// Redis a bounded amount of work). A lock held for the whole listing is
/// in it; one released before it began is not; a lock may appear twice.
/// With an API key limited to some prefixes: a `prefix` under one of them,
/// or none to list every name under them.
#[utoipa::path(
    get,
    path = "/locks",
    operation_id = "listLocks",
    tag = "locks",
    params(
        ("prefix" = Option<NamePrefixSchema>, Query, description = "List the names that start with it; absent or empty: every name (with an API key limited to some prefixes: every name under them). Outside the key's prefixes: 403"),
        ("limit" = Option<PageLimitSchema>, Query, description = "The most locks of the page (1 to 1000, default 100)"),
        ("cursor" = Option<CursorSchema>, Query, description = "The `next_cursor` of the previous page, as it is (opaque); absent: the first page"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "One page of held locks", body = LockList),
        (status = 400, description = "A prefix no name can start with, a limit out of 1..=1000, or a cursor this listing did not give", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
pub async fn list(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    Extension(deadline): Extension<Deadline>,
    Extension(scope): Extension<ListScope>,
    StrictQuery(query): StrictQuery<ListQuery>,
) -> Result<Json<LockList>, ApiError> {
    let req = ListRequest::parse(Kind::Lock, query, &scope)?;
    let outcome = within(
        deadline,
        locks.list_locks(&req.prefixes, req.from.clone(), req.limit),
    )
    .await;
    metrics.observe_inspect(&outcome);
    let page = outcome.map_err(timeout_or)?;
    Ok(Json(LockList {
        locks: page
            .items
            .into_iter()
            .map(|entry| ListedLock::new(&entry.name, entry.info))
            .collect(),
        next_cursor: req.next_cursor(page.next),
    }))
}
