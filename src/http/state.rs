//! What every handler shares.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::http::admission::Admission;
use crate::http::limits::Limits;
use crate::lock::Locks;
use crate::metrics::Metrics;

/// The application state handed to every handler.
#[derive(Clone)]
pub struct AppState {
    /// The lock service (waiting included) over the instrumented backend.
    pub locks: Locks,
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
}
