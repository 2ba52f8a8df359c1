//! What the handlers and layers share: one [`App`] behind one `Arc`
//! ([`AppState`]), from which each handler or layer takes only the part it
//! uses (`State<Arc<Locks>>`, `State<Arc<Metrics>>`, `State<Limits>`, ...)
//! through [`FromRef`]. Handing a request the state is one reference count;
//! no part of it that holds a lock (such as a `CancellationToken`) is
//! cloned on the way.
//!
//! Only the router and the application name [`AppState`]: the layers and
//! handlers below know the parts alone.

use std::ops::Deref;
use std::sync::Arc;

use axum::extract::FromRef;
use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::http::admission::Admission;
use crate::http::browsers::Browsers;
use crate::http::limits::Limits;
use crate::lock::Locks;
use crate::lock::history::HistoryLength;
use crate::metrics::Metrics;

/// Everything the HTTP side shares, built once at start-up.
pub struct App {
    /// The lock service (waiting included) over the instrumented backend.
    pub locks: Arc<Locks>,
    /// Default and maximum TTL, maximum wait, and the request timeout.
    pub limits: Limits,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Cancelled when shutdown begins: `/readyz` answers 503 from then on.
    pub stopping: CancellationToken,
    /// The API keys, when `--auth-keys-file` is set; `None`: no key needed.
    pub auth: Option<Arc<Auth>>,
    /// The cap on `/locks` requests in flight.
    pub admission: Admission,
    /// Who may call the main listener from a browser, and by which names.
    pub browsers: Browsers,
    /// `--dev`: locks in memory, and an admin's break allowed without API
    /// keys (never otherwise).
    pub dev: bool,
    /// How many leases each name's history keeps (`--history-length`).
    pub history_length: HistoryLength,
}

/// The router's state: the one [`App`], shared.
#[derive(Clone)]
pub struct AppState(pub Arc<App>);

impl AppState {
    /// The state holding `app`.
    pub fn new(app: App) -> Self {
        Self(Arc::new(app))
    }
}

impl Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

impl FromRef<AppState> for Arc<Locks> {
    fn from_ref(state: &AppState) -> Self {
        state.locks.clone()
    }
}

impl FromRef<AppState> for Limits {
    fn from_ref(state: &AppState) -> Self {
        state.limits
    }
}

impl FromRef<AppState> for Arc<Metrics> {
    fn from_ref(state: &AppState) -> Self {
        state.metrics.clone()
    }
}

impl FromRef<AppState> for CancellationToken {
    fn from_ref(state: &AppState) -> Self {
        state.stopping.clone()
    }
}

impl FromRef<AppState> for Option<Arc<Auth>> {
    fn from_ref(state: &AppState) -> Self {
        state.auth.clone()
    }
}

impl FromRef<AppState> for HistoryLength {
    fn from_ref(state: &AppState) -> Self {
        state.history_length
    }
}

impl FromRef<AppState> for Admission {
    fn from_ref(state: &AppState) -> Self {
        state.admission.clone()
    }
}
