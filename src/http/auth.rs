//! The API-key check in front of `/locks/{name}` and `/metrics` (see
//! [`crate::auth`] for the keys file).
//!
//! A request must carry `Authorization: Bearer <secret>` (RFC 6750 §2.1).
//! - No header: 401 with `WWW-Authenticate: Bearer realm="lockd"`.
//! - A header that is not one well-formed Bearer credential: 401 with
//!   `error="invalid_request"`.
//! - A secret no key has: 401 with `error="invalid_token"`.
//! - A known key over its `requests_per_second`: 429 with `Retry-After`.
//! - A known key without the permission the method needs, or a lock name
//!   outside the key's prefixes: 403. A listing (`GET /locks`,
//!   `GET /semaphores`) needs `read`; its handler gets the key's
//!   [`ListScope`] and refuses a `prefix` outside it (403).
//!
//! All are problem documents; none says which keys exist. The check runs
//! before the body is read, so a refused request writes nothing. The key's
//! id (never its secret) is recorded in the request's span.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::{ApiError, Kind};
use crate::auth::{Auth, ListScope, Permission};

const NO_KEY: &str = r#"Bearer realm="lockd""#;
const BAD_REQUEST: &str = r#"Bearer realm="lockd", error="invalid_request""#;
const BAD_KEY: &str = r#"Bearer realm="lockd", error="invalid_token""#;

/// Who asked for a break, for its record: the id of the API key, or `dev`
/// when `--dev` runs with no keys. Left in the request's extensions by
/// [`guard_locks`] for the requests it let break, and for no other.
#[derive(Debug, Clone)]
pub struct Caller(Arc<str>);

impl Caller {
    /// The key's id (`dev` without keys).
    pub fn id(&self) -> &str {
        &self.0
    }
}

/// Guards `/locks/{name}` (and `/semaphores/{name}`, `/runs/{key}`): the
/// permission comes from the method (POST acquire, PATCH extend, DELETE
/// and PUT release: a run's completion ends its attempt, GET read; a
/// DELETE with `force=true`, a break, admin), and the name must be under
/// one of the key's prefixes. Without API keys, a break is refused unless
/// `breaks_without_keys` (`--dev`). Returns the request to serve, with the
/// [`Caller`] of a break.
///
/// # Errors
/// The refusal (401, 403 or 429) to answer instead.
pub async fn guard_locks(
    auth: Option<&Auth>,
    breaks_without_keys: bool,
    request: Request,
) -> Result<Request, Response> {
    let permission = match *request.method() {
        Method::POST => Permission::Acquire,
        Method::PATCH => Permission::Extend,
        Method::DELETE if asks_to_break(&request) => Permission::Admin,
        Method::DELETE | Method::PUT => Permission::Release,
        _ => Permission::Read,
    };
    if permission == Permission::Admin && auth.is_none() && !breaks_without_keys {
        return Err(ApiError::new(Kind::Forbidden, NO_KEYS_NO_BREAKS).into_response());
    }
    let (mut parts, body) = request.into_parts();
    // A listing has no name in its path: the key's prefixes go to the
    // handler, which checks the `prefix` asked for against them.
    let listing = parts
        .extensions
        .get::<MatchedPath>()
        .is_some_and(|route| LISTINGS.contains(&route.as_str()));
    // The name as the handler sees it (percent-decoded). One that cannot be
    // decoded is no one's: the handler would refuse it with 400 anyway.
    let name = if listing {
        None
    } else {
        Some(
            axum::RequestPartsExt::extract::<Path<String>>(&mut parts)
                .await
                .map(|Path(name)| name)
                .unwrap_or_default(),
        )
    };
    let mut request = Request::from_parts(parts, body);
    match check(auth, &request, permission, name.as_deref()) {
        Ok((scope, key)) => {
            if listing {
                request.extensions_mut().insert(scope);
            }
            if permission == Permission::Admin {
                let id = key.unwrap_or_else(|| Arc::from("dev"));
                request.extensions_mut().insert(Caller(id));
            }
            Ok(request)
        }
        Err(refusal) => Err(refusal.into_response()),
    }
}

/// Why a break is refused on a lockd without API keys.
const NO_KEYS_NO_BREAKS: &str = "breaking a lease needs an API key with the admin permission, and this lockd runs without API keys (start it with --auth-keys-file); only --dev breaks without one";

/// Whether a DELETE asks for a break: a `force` parameter that is not
/// `false` (the handler refuses a value other than `true` with 400, so
/// that no spelling of it passes as a release's).
fn asks_to_break(request: &Request) -> bool {
    request.uri().query().is_some_and(|query| {
        url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "force" && v != "false")
    })
}

/// The listing routes, which [`guard_locks`] guards too: a key needs
/// `read`, and the handler gets its [`ListScope`].
const LISTINGS: [&str; 3] = ["/locks", "/semaphores", "/runs"];

/// Guards `/metrics` on the main listener: the key needs `metrics`.
pub async fn guard_metrics(
    State(auth): State<Option<Arc<Auth>>>,
    request: Request,
    next: Next,
) -> Response {
    match check(auth.as_deref(), &request, Permission::Metrics, None) {
        Ok(_) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// The key check; with it passed, the names the caller may list, and the
/// key's id (`None` without keys).
fn check(
    auth: Option<&Auth>,
    request: &Request,
    permission: Permission,
    name: Option<&str>,
) -> Result<(ListScope, Option<Arc<str>>), ApiError> {
    let Some(auth) = auth else {
        return Ok((ListScope::Every, None));
    };
    let secret = bearer_secret(request)?;
    let keys = auth.keys();
    let Some(key) = keys.find(secret) else {
        return Err(ApiError::unauthorized(
            "this API key is not known; check the secret, or ask for a key",
            BAD_KEY,
        ));
    };
    super::telemetry::note_key(request, &key.id);
    if let Err(wait) = key.spend() {
        return Err(ApiError::new(
            Kind::RateLimited,
            "this API key is over its requests_per_second; retry after retry_after_ms",
        )
        .retry_after(wait.max(Duration::from_millis(1))));
    }
    if !key.may(permission) {
        return Err(ApiError::new(
            Kind::Forbidden,
            // Unquoted: the permission is lockd's word, not the client's,
            // so the access log keeps it (it masks quoted parts).
            format!(
                "this API key does not have the {} permission",
                permission.as_str()
            ),
        ));
    }
    if name.is_some_and(|name| !key.covers(name)) {
        return Err(ApiError::new(
            Kind::Forbidden,
            "this API key may not use this lock name: it is outside the key's prefixes",
        ));
    }
    Ok((key.list_scope(), Some(key.id.clone())))
}

/// The secret of the request's one `Authorization: Bearer` header.
fn bearer_secret(request: &Request) -> Result<&str, ApiError> {
    let mut values = request.headers().get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(ApiError::unauthorized(
            "this server needs an API key: send `Authorization: Bearer <secret>`",
            NO_KEY,
        ));
    };
    let malformed = || {
        ApiError::unauthorized(
            "the Authorization header must be one `Bearer <secret>`",
            BAD_REQUEST,
        )
    };
    if values.next().is_some() {
        return Err(malformed());
    }
    let text = value.to_str().map_err(|_| malformed())?;
    let (scheme, secret) = text.split_once(' ').ok_or_else(malformed)?;
    let secret = secret.trim_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer") || secret.is_empty() || secret.contains(' ') {
        return Err(malformed());
    }
    Ok(secret)
}
