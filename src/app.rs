//! Builds the application from [`Settings`] and runs it until shut down.
//! `main` only parses flags, sets up logging and calls [`Application`];
//! tests build the same application on port 0.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Auth, KeysError};
use crate::cli::RedisMode;
use crate::config::{RedisUrl, Settings, StoreSettings, node_address};
use crate::http::admission::Admission;
use crate::http::browsers::Browsers;
use crate::http::limits::Limits;
use crate::http::routes::{metrics_router, router};
use crate::http::state::{App, AppState};
use crate::lock::memory::MemoryBackend;
use crate::lock::redis::connect::{self, ConnectReports, RedisTls, RedisTlsError};
use crate::lock::redis::topology;
use crate::lock::redis::{Endpoint, RedisBackend, RedisConfig};
use crate::lock::redlock::{Redlock, quorum};
use crate::lock::{Backend, LockError, LockNode, Locks, Single, Store};
use crate::metrics::{Instrumented, MasterStatus, Metrics, PoolStatus};
use crate::transport::{TlsError, Transport};

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
    /// The Redis servers are not what `--redis-mode` says (a cluster node
    /// given to Redlock, a plain server given as a cluster seed).
    #[error("invalid settings: {0}")]
    Topology(String),
    /// The API keys file could not be loaded.
    #[error("{0}")]
    Keys(#[from] KeysError),
    /// The metrics registry could not be built.
    #[error("cannot build metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The TLS certificate or key cannot be used.
    #[error("invalid settings: {0}")]
    Tls(#[from] TlsError),
    /// A TLS file for Redis (`--redis-ca-cert`, `--redis-client-cert`,
    /// `--redis-client-key`) cannot be used.
    #[error("invalid settings: {0}")]
    RedisTls(#[from] RedisTlsError),
}

impl StartupError {
    /// Whether the operator's settings are at fault (a value out of range,
    /// an unusable TLS file or keys file), as with a bad flag, rather than the
    /// environment (an address in use).
    pub fn is_settings(&self) -> bool {
        matches!(
            self,
            Self::Settings(_)
                | Self::Topology(_)
                | Self::Tls(_)
                | Self::RedisTls(_)
                | Self::Keys(_)
        )
    }
}

/// A bound, ready-to-run lockd.
pub struct Application {
    listener: TcpListener,
    router: Router,
    /// `--metrics-listen`: its listener and router.
    metrics: Option<(TcpListener, Router)>,
    /// Cancelled when shutdown begins: `/readyz` turns 503, every wait ends,
    /// and so does the release-event connection.
    stopping: CancellationToken,
    /// How long requests in flight get to finish once shutdown begins.
    shutdown_timeout: Duration,
    /// The API keys, reloaded on SIGHUP.
    auth: Option<Arc<Auth>>,
    /// TLS or not, and the limits on request heads.
    transport: Transport,
    /// SIGHUP, caught from the first step of start-up: a SIGHUP that came
    /// while lockd reached Redis or bound its address would otherwise take
    /// the default action and stop lockd.
    hangups: std::io::Result<tokio::signal::unix::Signal>,
}

impl Application {
    /// Builds the backend the settings ask for (memory with `dev`, Redis
    /// with one URL, Redlock with several), binds the listener and builds the
    /// router.
    ///
    /// # Errors
    /// [`StartupError`] when the address cannot be bound, a Redis TLS file
    /// cannot be used, or the backend cannot be built. Redis being down is
    /// not an error, nor is a Redis server whose TLS certificate cannot be
    /// verified (it is logged): requests get 503 until it comes back.
    pub async fn build(settings: &Settings) -> Result<Self, StartupError> {
        let hangups = hangups();
        // A keys file that does not load is a bad setting: said first, on
        // its own, before anything reaches Redis.
        if let Some(path) = &settings.auth.keys_file {
            Auth::load(path)?;
        }
        let tls = redis_tls(&settings.store)?;
        let reports = ConnectReports::default();
        if !settings.store.dev {
            check_topology(&settings.store, &tls, &reports).await?;
        }
        let metrics = Arc::new(Metrics::new(settings.metrics.max_namespaces)?);
        let backend = build_backend(settings, &metrics, &tls, &reports)?;
        Self::assemble(settings, backend, metrics, hangups).await
    }

    /// Like [`Application::build`], with a backend of the caller's (tests
    /// use this to keep a handle on a [`MemoryBackend`]).
    ///
    /// # Errors
    /// As for [`Application::build`].
    pub async fn with_backend(
        settings: &Settings,
        backend: Arc<dyn Backend>,
    ) -> Result<Self, StartupError> {
        let hangups = hangups();
        let metrics = Arc::new(Metrics::new(settings.metrics.max_namespaces)?);
        metrics.watch_pool("custom", PoolStatus::default);
        let node = Arc::new(Instrumented::new(backend, metrics.clone(), "custom".into()));
        Self::assemble(settings, Arc::new(Single::new(node)), metrics, hangups).await
    }

    async fn assemble(
        settings: &Settings,
        backend: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        hangups: std::io::Result<tokio::signal::unix::Signal>,
    ) -> Result<Self, StartupError> {
        let (state, auth, stopping) = shared_state(settings, backend, metrics)?;
        let transport = Transport::from_settings(&settings.listen)?;
        let listener = bind(settings.listen.addr).await?;
        let metrics = match settings.metrics.listen {
            Some(addr) => {
                let browsers = Browsers::new(
                    addr,
                    &settings.listen.cors_allow_origins,
                    &settings.listen.allowed_hosts,
                );
                Some((bind(addr).await?, metrics_router(state.clone(), &browsers)))
            }
            None => None,
        };
        Ok(Self {
            listener,
            router: router(state, metrics.is_none()),
            metrics,
            stopping,
            shutdown_timeout: settings.service.shutdown_timeout,
            auth,
            transport,
            hangups,
        })
    }

    /// Whether the main listener serves HTTPS (`--tls-cert`, `--tls-key`).
    pub fn is_tls(&self) -> bool {
        self.transport.is_tls()
    }

    /// The address the listener is bound to (useful with port 0).
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The address `/metrics` is served on, when `--metrics-listen` is set.
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub fn metrics_addr(&self) -> std::io::Result<Option<SocketAddr>> {
        self.metrics
            .as_ref()
            .map(|(listener, _)| listener.local_addr())
            .transpose()
    }

    /// Serves requests until `shutdown` completes. Then, at once: `/readyz`
    /// answers 503, the listener stops accepting, and every wait ends (those
    /// requests get 503 `shutting-down` with `Retry-After`); the requests in
    /// flight get up to `--shutdown-timeout-ms` to finish, and it returns.
    /// The metrics listener, if any, serves until the main one is done.
    ///
    /// # Errors
    /// None at present: accept errors are logged and accepting goes on
    /// ([`Transport::serve`]).
    pub async fn run_until<F>(self, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(reload_keys_on_sighup(
            self.hangups,
            self.auth.clone(),
            self.stopping.clone(),
        ));
        let main = CancellationToken::new();
        let metrics = CancellationToken::new();
        let metrics_server = self.metrics.map(|(listener, router)| {
            let transport = self.transport.plain();
            let handle = metrics.clone();
            tokio::spawn(async move { transport.serve(listener, router, handle).await })
        });
        let serve = self
            .transport
            .serve(self.listener, self.router, main.clone());
        tokio::pin!(serve);
        tokio::select! {
            // Only once `main` is cancelled, which the other arm does.
            () = &mut serve => {}
            () = shutdown => {
                // Readiness turns 503 and every wait ends at once; the
                // listener stops accepting, idle connections are closed and
                // the requests in flight finish.
                self.stopping.cancel();
                main.cancel();
                // A client that never finishes its request must not hold
                // the process for ever: past the shutdown timeout this
                // returns, and the process exits with the connections still
                // open.
                if tokio::time::timeout(self.shutdown_timeout, &mut serve).await.is_err() {
                    tracing::warn!(timeout = ?self.shutdown_timeout, "requests still open after the shutdown timeout; closing them");
                }
            }
        }
        // Also stops the release-event task when the server failed.
        self.stopping.cancel();
        metrics.cancel();
        if let Some(server) = metrics_server {
            // Scrapes are short; a stuck one is not waited for.
            let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
        }
        Ok(())
    }
}

/// The main router of `settings`, as [`Application::build`] builds it
/// (with the backend the settings ask for: memory with `dev`), but bound to
/// no port: tests call it in-process with `tower::ServiceExt::oneshot`.
/// Needs a Tokio runtime (the lock service starts its release events).
///
/// # Errors
/// As for [`Application::build`], binding aside.
pub fn build_router(settings: &Settings) -> Result<Router, StartupError> {
    let metrics = Arc::new(Metrics::new(settings.metrics.max_namespaces)?);
    let tls = redis_tls(&settings.store)?;
    let backend = build_backend(settings, &metrics, &tls, &ConnectReports::default())?;
    let (state, _, _) = shared_state(settings, backend, metrics)?;
    Ok(router(state, settings.metrics.listen.is_none()))
}

/// The state the routers share, with the API keys (reloaded on SIGHUP) and
/// the token cancelled when shutdown begins.
fn shared_state(
    settings: &Settings,
    backend: Arc<dyn Store>,
    metrics: Arc<Metrics>,
) -> Result<(AppState, Option<Arc<Auth>>, CancellationToken), StartupError> {
    let limits = Limits::from_settings(&settings.limits)
        .map_err(|e| StartupError::Settings(e.to_string()))?;
    let auth = match &settings.auth.keys_file {
        Some(path) => {
            let auth = Auth::load(path)?;
            tracing::info!(file = %path.display(), keys = auth.keys().len(), "API keys loaded");
            Some(Arc::new(auth))
        }
        None => {
            if settings.auth.insecure_no_auth {
                tracing::warn!(listen = %settings.listen.addr, "no API keys (--insecure-no-auth): anyone who can reach lockd can take and release any lock");
            }
            None
        }
    };
    let stopping = CancellationToken::new();
    let contention = metrics.clone();
    let locks = Locks::new(backend, settings.limits.max_waiters.get(), stopping.clone())
        .on_contention(Arc::new(move |name| contention.observe_contention(name)));
    locks.set_max_watchers(settings.limits.max_watchers.get());
    let state = AppState::new(App {
        locks: Arc::new(locks),
        limits,
        metrics,
        stopping: stopping.clone(),
        auth: auth.clone(),
        admission: Admission::new(
            settings.limits.max_requests.get(),
            settings.limits.max_waiters.get(),
        ),
        browsers: Browsers::new(
            settings.listen.addr,
            &settings.listen.cors_allow_origins,
            &settings.listen.allowed_hosts,
        ),
        dev: settings.store.dev,
        history_length: settings.store.history_length,
    });
    Ok((state, auth, stopping))
}

/// Reloads the API keys at every SIGHUP of `hangups` until `stop`. A file
/// that no longer loads leaves the keys in force as they were. Without a
/// keys file a SIGHUP is logged and otherwise ignored (it does not stop
/// lockd).
async fn reload_keys_on_sighup(
    hangups: std::io::Result<tokio::signal::unix::Signal>,
    auth: Option<Arc<Auth>>,
    stop: CancellationToken,
) {
    let mut hangups = match hangups {
        Ok(hangups) => hangups,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; API keys will not be reloaded");
            return;
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        let Some(auth) = &auth else {
            tracing::info!("SIGHUP: nothing to reload (no --auth-keys-file)");
            continue;
        };
        match auth.reload() {
            Ok(0) => {
                tracing::warn!(file = %auth.path().display(), "API keys reloaded: the file has no keys, so every request that needs a key is refused")
            }
            Ok(keys) => tracing::info!(file = %auth.path().display(), keys, "API keys reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "API keys NOT reloaded; the previous keys stay in force")
            }
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartupError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Bind { addr, source })
}

/// The TLS files of `store` for `rediss://` URLs, read and checked; none
/// in dev mode, which uses no Redis. Files given while no URL is
/// `rediss://` are checked all the same, and a warning says they are not
/// used.
fn redis_tls(store: &StoreSettings) -> Result<RedisTls, StartupError> {
    if store.dev {
        return Ok(RedisTls::default());
    }
    let files = &store.redis_tls;
    let tls = RedisTls::load(
        files.ca_cert.as_deref(),
        files
            .client
            .as_ref()
            .map(|client| (client.cert.as_path(), client.key.as_path())),
    )?;
    if tls.is_set() && !store.redis_urls.iter().any(|u| connect::is_tls(u.expose())) {
        tracing::warn!(
            "--redis-ca-cert or --redis-client-cert is set, but no --redis-url is rediss://: \
             they apply to rediss:// URLs only, so they are not used"
        );
    }
    Ok(tls)
}

/// Checks that the Redis URLs of `store` are what its mode says (see
/// [`topology::check`]), each probe's TLS failure reported where its
/// backend will report it.
///
/// # Errors
/// [`StartupError::Topology`] when a URL is not.
async fn check_topology(
    store: &StoreSettings,
    tls: &RedisTls,
    reports: &ConnectReports,
) -> Result<(), StartupError> {
    let mode = match store.mode() {
        RedisMode::Single => topology::Mode::Single,
        RedisMode::Redlock => topology::Mode::Redlock,
        RedisMode::Cluster => topology::Mode::Cluster,
        RedisMode::Sentinel => topology::Mode::Sentinel,
    };
    let targets: Vec<topology::Target<'_>> = store
        .redis_urls
        .iter()
        .map(|url| {
            let node = node_address(url.expose());
            let report = match mode {
                topology::Mode::Cluster => reports.node(&cluster_name(&store.redis_urls), tls),
                _ => reports.node(&node, tls),
            };
            topology::Target {
                url: url.expose(),
                shown: url.to_string(),
                node,
                report,
            }
        })
        .collect();
    let expected = topology::Expected {
        mode,
        sentinel_master: store.sentinel_master.as_deref(),
        min_replicas_acked: store.min_replicas_acked,
    };
    topology::check(&expected, &targets, tls)
        .await
        .map_err(|wrong| StartupError::Topology(wrong.0))
}

/// The name of a Redis Cluster in logs: its seeds, `host:port` each.
fn cluster_name(seeds: &[RedisUrl]) -> String {
    let seeds: Vec<String> = seeds.iter().map(|u| node_address(u.expose())).collect();
    format!("{} (Redis Cluster seeds)", seeds.join(", "))
}

/// The lock store for `settings`, each node instrumented, its clients
/// built with `tls`, its TLS failures reported to `reports`.
fn build_backend(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    tls: &RedisTls,
    reports: &ConnectReports,
) -> Result<Arc<dyn Store>, StartupError> {
    let instrument = |backend: Arc<dyn Backend>, node: String| -> Arc<dyn Backend> {
        Arc::new(Instrumented::new(backend, metrics.clone(), node))
    };
    let store = &settings.store;
    if store.dev {
        tracing::warn!(
            "dev mode: locks are kept in this process's memory and are NOT shared \
             with other lockd processes; do not use this in production"
        );
        // No connections: the pool gauges read 0, so dashboards look the same.
        metrics.watch_pool("memory", PoolStatus::default);
        metrics.set_store_mode("memory");
        let memory = MemoryBackend::with_fence_retention(store.fence_retention)
            .with_history_length(store.history_length);
        let node = instrument(Arc::new(memory), "memory".into());
        return Ok(Arc::new(Single::new(node)));
    }
    let mode = store.mode();
    metrics.set_store_mode(mode.as_str());
    let redlock = mode == RedisMode::Redlock;
    // What every backend shares; Redlock's nodes watch for restarts, wait
    // for no replicas, and leave cleanup to Redlock.
    let config = |endpoint: Endpoint, report, timeout: Duration| RedisConfig {
        endpoint,
        tls: tls.clone(),
        report,
        key_prefix: store.key_prefix.clone(),
        timeout,
        pool_size: store.pool_size.get(),
        fence_retention: store.fence_retention,
        history_length: store.history_length,
        restart_delay: redlock.then(|| settings.redlock_restart_delay()),
        min_replicas_acked: if redlock { 0 } else { store.min_replicas_acked },
        replica_ack_timeout: store.replica_ack_timeout,
        standalone: !redlock,
    };
    let exposed = || -> Vec<String> {
        store
            .redis_urls
            .iter()
            .map(|u| u.expose().to_owned())
            .collect()
    };
    if mode == RedisMode::Cluster {
        let seeds: Vec<String> = store.redis_urls.iter().map(ToString::to_string).collect();
        tracing::info!(?seeds, "using a Redis Cluster");
        let backend = RedisBackend::new(&config(
            Endpoint::Cluster(exposed()),
            reports.node(&cluster_name(&store.redis_urls), tls),
            store.redis_timeout,
        ))?;
        let watched = backend.clone();
        metrics.watch_pool("cluster", move || pool_status(&watched));
        if let Some(view) = backend.cluster_view() {
            metrics.watch_master(move || MasterStatus {
                addresses: view.masters(),
                failovers: view.new_masters(),
            });
        }
        let node = instrument(Arc::new(backend), "cluster".into());
        return Ok(Arc::new(Single::new(node)));
    }
    if let (RedisMode::Sentinel, Some(master)) = (mode, &store.sentinel_master) {
        let sentinels: Vec<String> = store.redis_urls.iter().map(ToString::to_string).collect();
        tracing::info!(?sentinels, master = %master, "using the master that Redis Sentinel names");
        let backend = RedisBackend::new(&config(
            Endpoint::Sentinel {
                sentinels: exposed(),
                master: master.clone(),
            },
            reports.node(&format!("the master of {master}"), tls),
            store.redis_timeout,
        ))?;
        let watched = backend.clone();
        metrics.watch_pool("sentinel", move || pool_status(&watched));
        if let Some(sentinels) = backend.sentinels() {
            metrics.watch_master(move || MasterStatus {
                addresses: sentinels.master_addr().into_iter().collect(),
                failovers: sentinels.failovers(),
            });
        }
        let node = instrument(Arc::new(backend), "sentinel".into());
        return Ok(Arc::new(Single::new(node)));
    }
    let node = |url: &RedisUrl, timeout: Duration| -> Result<Arc<dyn Backend>, StartupError> {
        let backend = RedisBackend::new(&config(
            Endpoint::Server(url.expose().to_owned()),
            reports.node(&node_address(url.expose()), tls),
            timeout,
        ))?;
        let watched = backend.clone();
        metrics.watch_pool(&node_address(url.expose()), move || pool_status(&watched));
        Ok(instrument(Arc::new(backend), node_address(url.expose())))
    };
    let urls = &store.redis_urls;
    if let (RedisMode::Single, [url]) = (mode, urls.as_slice()) {
        tracing::info!(redis = %url, "using one Redis (a failover can lose locks; see docs/design.md)");
        return Ok(Arc::new(Single::new(node(url, store.redis_timeout)?)));
    }
    let shown: Vec<String> = urls.iter().map(ToString::to_string).collect();
    tracing::info!(nodes = ?shown, quorum = quorum(urls.len()), "using Redlock");
    if urls.len() == 2 {
        tracing::warn!(
            "Redlock over 2 nodes needs both to answer (quorum 2): either one down stops \
             all locking; use 3 or 5 nodes"
        );
    }
    let nodes = urls
        .iter()
        .map(|url| node(url, store.node_timeout).map(|node| -> Arc<dyn LockNode> { node }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Redlock::new(
        nodes,
        store.drift_factor,
        settings.limits.max_ttl,
    )))
}

/// The pool gauges of one backend.
fn pool_status(backend: &RedisBackend) -> PoolStatus {
    let status = backend.pool().status();
    PoolStatus {
        size: status.size,
        available: status.available,
        waiting: status.waiting,
        in_restart_delay: backend.in_restart_delay(),
    }
}

/// Catches SIGHUP from now on (tokio keeps a signal's handler installed
/// for the life of the process once it is set).
fn hangups() -> std::io::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
}

/// A future that completes on SIGINT (Ctrl-C) or SIGTERM.
///
/// The handlers are installed when this is called, not when the future is
/// first polled: a signal that arrives after the call and before the first
/// poll is kept for it, where it would otherwise take the default action
/// and kill the process (exit by signal, no graceful shutdown). Call it
/// before start-up, which may take seconds when Redis is slow to answer,
/// and stop starting when it completes first.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut caught = Vec::new();
    for (kind, what) in [
        (SignalKind::interrupt(), "SIGINT (Ctrl-C)"),
        (SignalKind::terminate(), "SIGTERM"),
    ] {
        match signal(kind) {
            Ok(stream) => caught.push(stream),
            Err(e) => tracing::error!(error = %e, "cannot listen for {what}"),
        }
    }
    async move {
        let arrivals = caught.iter_mut().map(|s| Box::pin(s.recv()));
        if arrivals.len() == 0 {
            std::future::pending::<()>().await;
        }
        futures_util::future::select_all(arrivals).await;
        tracing::info!("shutting down: finishing requests in flight");
    }
}
