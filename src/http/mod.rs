//! The HTTP face of lockd: routes, thin handlers, extractors and the one
//! mapping from errors to RFC 9457 problem documents.
//!
//! # A request's path
//!
//! Before the router, [`crate::transport`] accepts the connection (TLS,
//! hyper's limits on the head) and [`crate::framing`] marks a request
//! target with a `#fragment`. The router ([`routes`]) then picks the route
//! by path (so that every layer knows the route template), or its 404
//! fallback, and the layers run, outermost first. On every route:
//!
//! 1. [`telemetry`], one layer: the request ID is set (the client's
//!    `x-request-id` when usable, or a fresh UUID) and copied to the
//!    response; the request's tracing span opens; any error from below
//!    that is not yet a problem document (router 404 and 405, body-limit
//!    413, timeout 503) becomes one ([`problem`]), with the request ID in
//!    it; an answer under a browser page's path (`/ui`, `/docs`) gets
//!    that page's security headers, whatever answered it
//!    ([`pages::dress`]); the HTTP metrics count and time the request, and
//!    the access log line is written once it is answered (499 if the
//!    client went away).
//! 2. [`target`]: a `#fragment`, a path or query that is not UTF-8 once
//!    percent-decoded, a `token` in the query, or a transfer coding other
//!    than `chunked`: 400; a declared `Content-Length` over the body limit
//!    ([`extract::BODY_LIMIT`], 65 KiB): 413. Both before anything reads
//!    the body.
//! 3. [`browsers`]: an HTTP/1.1 request without exactly one `Host`: 400;
//!    on a loopback listener, a `Host` that is not a loopback name (or an
//!    `--allowed-host`): 421; a browser request from another origin
//!    (`Origin`, `Sec-Fetch-Site: cross-site`) not in
//!    `--cors-allow-origin`: 403. With allowed origins, tower-http's CORS
//!    layer (inside the checks, around each route) answers their
//!    preflights and marks their answers.
//! 4. The body limit of axum's extractors: a chunked body over it is cut
//!    as it is read. Both checks run inside the telemetry's own layer, not
//!    as layers of their own (each router layer boxes every request once
//!    more).
//! 5. An unknown path ends here, at the fallback: 404.
//!
//! On `/locks/{name}`, `/semaphores/{name}` and `/runs/{key}` (with its
//! `/result`), and the listings `/locks` and `/semaphores`, then, in one
//! layer (`routes::gate_locks`):
//!
//! 6. [`admission`]: a slot in the request's room (acquires and inspects,
//!    or extends and releases), else 503 `overloaded` at once.
//! 7. [`auth`]: with API keys on, the key must be known, within its rate
//!    and allowed this method on this name (401, 429, 403); a listing
//!    needs `read`, and its handler gets the key's prefixes to check the
//!    `prefix` asked for; a `DELETE` with `force` (a break) needs `admin`,
//!    and is refused without API keys but in `--dev`. Nothing has read the
//!    body yet.
//! 8. [`deadline`]: the request's [`deadline::Deadline`] (the request
//!    timeout from its arrival) is set, and the whole body is read before
//!    it (413, or 503 `timeout`).
//! 9. The method router: a method the route lacks, 405. No `TimeoutLayer`
//!    here: every wait of a `/locks` request is bounded by its deadline
//!    already (the body read, the lock core call), and a backstop layer
//!    cost each request a boxed future and a timer.
//! 10. The handler ([`locks`], or [`semaphores`] and [`runs`] alike): the extractors
//!     ([`extract`]) parse the name, the query and the JSON body;
//!     `locks::input` turns them into the lock core's types under the
//!     server's [`limits`]; the lock core is called within the deadline (an
//!     acquire: plus its wait, cancel-safe); the outcome is counted; the
//!     answer is a [`locks::model`] type, or an [`problem::ApiError`].
//!     The three `DELETE`s share [`breaks`] (an admin's `force=true`), and
//!     the three `.../history` routes are [`history`].
//!
//! On the watches, `/locks/{name}/events` and `/semaphores/{name}/events`
//! (`routes::gate_watches`): the key check of step 7 alone (a stream lasts
//! until the client leaves or shutdown, so it takes no admission slot and
//! no deadline), then the handler ([`watch`]).
//!
//! On `/healthz`, `/readyz`, `/metrics` (with its own key check) and
//! `/openapi.json`: the request timeout, then the handler ([`ops`]).
//! The pages for a person's browser, outside the document ([`pages`]:
//! `/docs`, the document rendered by Scalar, and the console at `/ui`),
//! get the request timeout and no key check, and every answer of theirs
//! its security headers (CSP, `nosniff`, ...). The `--metrics-listen` router (`/metrics`, `/healthz`,
//! `/readyz`) has steps 1 to 3 (no origin but its own, and on loopback
//! loopback names only), the request timeout and the handlers, and no key
//! check.
//!
//! # Dependencies
//!
//! One way, top to bottom: a module imports only from the layers below
//! it, and `crate::lock` imports nothing from here. [`state`] is named by
//! [`routes`] and `crate::app` alone: the layers and handlers take the
//! parts they use through `FromRef` (`State<Arc<Locks>>`, `State<Limits>`,
//! `State<Arc<Metrics>>`, ...), so none of them knows the whole state.
//!
//! ```text
//!  crate::app   settings -> App; binds the listeners; serves
//!      |
//!  routes       the route list -> the router and the OpenAPI document
//!      |
//!      +-- state     AppState(Arc<App>) and its FromRef parts
//!      +-- openapi   ApiDoc (all but the paths); fit to the limits
//!      |
//!  handlers     locks::{acquire, extend, inspect, release, list}
//!      |        semaphores::{take, extend, inspect, give_back, list}
//!      |        runs::{..}  history  watch (the event streams)   ops
//!      |        pages (/docs, /ui)
//!      |
//!  shared       breaks (the DELETEs' force=true)
//!      |
//!  inputs       locks::input  semaphores::input  listing
//!      |
//!  middleware   telemetry  auth  admission  browsers  target -> deadline
//!      |
//!  leaves       problem  extract  limits  locks::model  semaphores::model
//! ```
//!
//! In detail: `problem` and `locks::model` import nothing from here, and
//! `semaphores::model` only `locks::model` (the shapes they share);
//! `limits`, `listing`, `admission`, `auth` and `telemetry` import
//! `problem` alone, `extract` `problem` and `limits` (the rule of a
//! refused field), and `browsers` `problem`, `telemetry` (the
//! request ID header) and `target` (the one refuse-or-pass service); `deadline` also `extract` and `limits`;
//! `target` also `deadline` (its `closing`) and `extract` (the body limit);
//! `locks::input` imports `limits`, `locks::model` and `problem`, and
//! `semaphores::input` and `runs::input` also `locks::input`; the handlers import their
//! inputs and models (the semaphore ones the lock ones too), `deadline`,
//! `extract`, `limits` and `problem`, and the listings `listing`; the
//! `DELETE`s `breaks`, which imports `auth` (its caller), `deadline`,
//! `locks::input`, `locks::model` and `problem`; `history` imports
//! `deadline`, `extract`, `locks::model` and `problem`; `watch`
//! imports `extract`, `limits`, `problem` and the models; `ops` imports
//! `limits` and `problem`; `pages` imports nothing from here (its
//! submodules `pages::docs` and `pages::console` nothing either); `state` imports `admission`, `browsers` and
//! `limits`;
//! `openapi` imports `ops`, `locks::model`, `limits` and `problem`;
//! `routes` imports the rest.

pub mod access;
pub mod admission;
pub mod auth;
pub mod breaks;
pub mod browsers;
pub mod deadline;
pub mod extract;
pub mod history;
pub mod limits;
pub mod listing;
pub mod locks;
pub mod openapi;
pub mod ops;
pub mod pages;
pub mod problem;
pub mod routes;
pub mod runs;
pub mod semaphores;
pub mod state;
pub mod target;
pub mod telemetry;
pub mod watch;
