//! What every handler shares.

use std::sync::Arc;

use crate::http::locks::input::TtlPolicy;
use crate::lock::LockBackend;
use crate::metrics::Metrics;

/// The application state handed to every handler.
#[derive(Clone)]
pub struct AppState {
    /// The lock store, already wrapped in metrics.
    pub locks: Arc<dyn LockBackend>,
    /// Default and maximum TTL.
    pub ttl: TtlPolicy,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
}
