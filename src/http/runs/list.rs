//! `GET /runs`: the runs kept (running, done or pending), page by page,
//! without tokens.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};

use super::model::{RunList, RunStatus};
use crate::auth::ListScope;
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::StrictQuery;
use crate::http::listing::{ListQuery, ListRequest};
use crate::http::locks::model::{CursorSchema, NamePrefixSchema, PageLimitSchema};
use crate::http::problem::{ApiError, KeyRefusals, Problem, StoreError};
use crate::lock::{Kind, Locks};
use crate::metrics::Metrics;

/// List the runs whose keys start with `prefix` (every run still kept:
/// `running`, `done` within its result's retention, or `pending`), each as
/// `GET /runs/{key}` shows it (never a token), at most `limit` a page.
/// Paged as `GET /locks`: follow `next_cursor` until it is `null`.
#[utoipa::path(
    get,
    path = "/runs",
    operation_id = "listRuns",
    tag = "runs",
    params(
        ("prefix" = Option<NamePrefixSchema>, Query, description = "List the keys that start with it; absent or empty: every key (with an API key limited to some prefixes: every key under them). Outside the key's prefixes: 403"),
        ("limit" = Option<PageLimitSchema>, Query, description = "The most runs of the page (1 to 1000, default 100)"),
        ("cursor" = Option<CursorSchema>, Query, description = "The `next_cursor` of the previous page, as it is (opaque); absent: the first page"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "One page of runs", body = RunList),
        (status = 400, description = "A prefix no key can start with, a limit out of 1..=1000, or a cursor this listing did not give", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
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
) -> Result<Json<RunList>, ApiError> {
    let req = ListRequest::parse(Kind::Run, query, &scope)?;
    let outcome = within(
        deadline,
        locks.list_runs(&req.prefixes, req.from.clone(), req.limit),
    )
    .await;
    metrics.observe_inspect(&outcome);
    let page = outcome.map_err(timeout_or)?;
    Ok(Json(RunList {
        runs: page
            .items
            .into_iter()
            .map(|entry| RunStatus::new(&entry.key, entry.info))
            .collect(),
        next_cursor: req.next_cursor(page.next),
    }))
}
