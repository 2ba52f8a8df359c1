//! Builds the application from [`Settings`] and runs it until shut down.
//! `main` only parses flags, sets up logging and calls [`Application`];
//! tests build the same application on port 0.

use std::future::{Future, IntoFuture as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Settings, node_address};
use crate::http::locks::input::{TtlPolicy, WaitPolicy};
use crate::http::routes::router;
use crate::http::state::AppState;
use crate::lock::memory::MemoryBackend;
use crate::lock::redis::{RedisBackend, RedisConfig, redact_url};
use crate::lock::redlock::{RedlockBackend, quorum};
use crate::lock::{LockBackend, LockError, Locks, Ttl};
use crate::metrics::{Instrumented, Metrics};

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The lock backend could not be built (for example, a bad Redis URL).
    #[error("{0}")]
    Backend(#[from] LockError),
    /// A setting is out of range.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// The metrics registry could not be built.
    #[error("cannot build metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// A bound, ready-to-run lockd.
pub struct Application {
    listener: TcpListener,
    router: Router,
    /// Cancelled when shutdown begins: ends every wait and the release-event
    /// connection.
    stopping: CancellationToken,
}

impl Application {
    /// Builds the backend the settings ask for (memory with `dev`, Redis
    /// with one URL, Redlock with several), binds the listener and builds the
    /// router.
    ///
    /// # Errors
    /// [`StartupError`] when the address cannot be bound or the backend
    /// cannot be built. Redis being down is not an error: requests get 503
    /// until it comes back.
    pub async fn build(settings: &Settings) -> Result<Self, StartupError> {
        check(settings)?;
        let metrics = Arc::new(Metrics::new()?);
        let backend = build_backend(settings, &metrics)?;
        Self::assemble(settings, backend, metrics).await
    }

    /// Like [`Application::build`], with a backend of the caller's (tests
    /// use this to keep a handle on a [`MemoryBackend`]).
    ///
    /// # Errors
    /// As for [`Application::build`].
    pub async fn with_backend(
        settings: &Settings,
        backend: Arc<dyn LockBackend>,
    ) -> Result<Self, StartupError> {
        check(settings)?;
        let metrics = Arc::new(Metrics::new()?);
        let backend = Arc::new(Instrumented::new(backend, metrics.clone(), "custom".into()));
        Self::assemble(settings, backend, metrics).await
    }

    async fn assemble(
        settings: &Settings,
        backend: Arc<dyn LockBackend>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StartupError> {
        let default = Ttl::from_millis(
            settings.default_ttl_ms,
            settings.max_ttl_ms,
            "default_ttl_ms",
        )
        .map_err(|e| StartupError::Settings(e.to_string()))?;
        let stopping = CancellationToken::new();
        let state = AppState {
            locks: Locks::new(backend, settings.max_waiters, stopping.clone()),
            ttl: TtlPolicy {
                default,
                max_ms: settings.max_ttl_ms,
            },
            wait: WaitPolicy {
                max_ms: settings.max_wait_ms,
            },
            metrics,
        };
        let listener =
            TcpListener::bind(settings.listen)
                .await
                .map_err(|source| StartupError::Bind {
                    addr: settings.listen,
                    source,
                })?;
        Ok(Self {
            listener,
            router: router(state),
            stopping,
        })
    }

    /// The address the listener is bound to (useful with port 0).
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves requests until `shutdown` completes, then ends every wait
    /// (those requests get 503 `shutting-down`), finishes the requests in
    /// flight and returns.
    ///
    /// # Errors
    /// When the listener fails.
    pub async fn run_until<F>(self, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stopping = self.stopping.clone();
        let (began, shutdown_began) = tokio::sync::oneshot::channel::<()>();
        let serve = axum::serve(self.listener, self.router).with_graceful_shutdown(async move {
            shutdown.await;
            // Ends every wait, so that waiting requests finish at once.
            stopping.cancel();
            let _ = began.send(());
        });
        // A client that never finishes its request must not hold the process
        // for ever: past the grace period, the open connections are dropped.
        let grace_over = async {
            match shutdown_began.await {
                Ok(()) => tokio::time::sleep(SHUTDOWN_GRACE).await,
                Err(_) => std::future::pending().await,
            }
        };
        let result = tokio::select! {
            result = serve.into_future() => result,
            () = grace_over => {
                tracing::warn!(grace = ?SHUTDOWN_GRACE, "connections still open after the shutdown grace period; closing them");
                Ok(())
            }
        };
        // Also stops the release-event task when the server failed.
        self.stopping.cancel();
        result
    }
}

/// How long a graceful shutdown waits for requests in flight.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn check(settings: &Settings) -> Result<(), StartupError> {
    settings
        .check()
        .map_err(|e| StartupError::Settings(e.to_string()))
}

/// The lock backend for `settings`, each node instrumented.
fn build_backend(
    settings: &Settings,
    metrics: &Arc<Metrics>,
) -> Result<Arc<dyn LockBackend>, StartupError> {
    let instrument = |backend: Arc<dyn LockBackend>, node: String| -> Arc<dyn LockBackend> {
        Arc::new(Instrumented::new(backend, metrics.clone(), node))
    };
    if settings.dev {
        tracing::warn!(
            "dev mode: locks are kept in this process's memory and are NOT shared \
             with other lockd processes; do not use this in production"
        );
        return Ok(instrument(Arc::new(MemoryBackend::new()), "memory".into()));
    }
    let node = |url: &String, timeout_ms: u64| -> Result<Arc<dyn LockBackend>, StartupError> {
        let backend = RedisBackend::new(&RedisConfig {
            url: url.clone(),
            key_prefix: settings.key_prefix.clone(),
            timeout: Duration::from_millis(timeout_ms),
            pool_size: settings.pool_size,
        })?;
        Ok(instrument(Arc::new(backend), node_address(url)))
    };
    let urls = &settings.redis_url;
    if let [url] = urls.as_slice() {
        tracing::info!(redis = %redact_url(url), "using one Redis (a failover can lose locks; see the README)");
        return node(url, settings.redis_timeout_ms);
    }
    let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
    tracing::info!(nodes = ?shown, quorum = quorum(urls.len()), "using Redlock");
    if urls.len() == 2 {
        tracing::warn!(
            "Redlock over 2 nodes needs both to answer (quorum 2): either one down stops \
             all locking; use 3 or 5 nodes"
        );
    }
    let nodes = urls
        .iter()
        .map(|url| node(url, settings.node_timeout_ms))
        .collect::<Result<Vec<_>, _>>()?;
    let max_ttl = Ttl::from_millis(settings.max_ttl_ms, settings.max_ttl_ms, "max_ttl_ms")
        .map_err(|e| StartupError::Settings(e.to_string()))?;
    Ok(Arc::new(RedlockBackend::new(
        nodes,
        settings.drift_factor,
        max_ttl,
    )))
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}
