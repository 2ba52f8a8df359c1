//! lockd built in-process over a store: [`TestApp`], and [`backend_tests!`].

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use lockd::app::Application;
use lockd::cli::RedisMode;
use lockd::config::Settings;
use lockd::lock::memory::MemoryBackend;
use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use serde_json::Value;

use super::{
    Cluster, MASTER_NAME, PREFIX, RedisServer, Reply, SentinelSet, lock_key, metric, shared_cluster,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

static TRACING: LazyLock<()> = LazyLock::new(|| {
    if let Some(filter) = std::env::var_os("TEST_LOG") {
        // `TEST_LOG=1`: everything at debug; otherwise a filter, such as
        // `TEST_LOG=lockd=debug`.
        let filter = match filter.to_str() {
            Some("1") | None => "debug".to_owned(),
            Some(filter) => filter.to_owned(),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
});

/// The store behind a [`TestApp`], kept so tests can look at it directly.
pub enum Store {
    /// A real redis-server, shared by every [`TestApp::sibling`].
    Redis(Arc<RedisServer>),
    /// Redlock: several real redis-servers, in the order of the settings'
    /// `store.redis_urls` (which may reach them through proxies).
    Redlock(Vec<Arc<RedisServer>>),
    /// The in-memory backend.
    Memory(Arc<MemoryBackend>),
    /// A Redis Cluster: the one shared by the tests of this binary, or a
    /// test's own.
    Cluster(Arc<Cluster>),
    /// A master with replicas under Sentinel.
    Sentinel(Arc<SentinelSet>),
}

/// A lockd served on a loopback port, with its store.
pub struct TestApp {
    /// Where lockd listens.
    pub addr: SocketAddr,
    /// Where `/metrics` is served when `settings.metrics.listen` was set.
    pub metrics_addr: Option<SocketAddr>,
    /// An HTTP client (with a timeout, so no test can hang).
    pub client: reqwest::Client,
    /// The store lockd uses.
    pub store: Store,
    /// The settings lockd was built with.
    pub settings: Settings,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    served: Mutex<Option<JoinHandle<std::io::Result<()>>>>,
}

/// The default test settings: any port, and a short Redis timeout.
fn test_settings(redis_url: String) -> Settings {
    let mut settings = Settings::default();
    settings.listen.addr = "127.0.0.1:0".parse().expect("valid address");
    settings.store.redis_urls = vec![redis_url.into()];
    // Tests that restart Redlock nodes test other things than the
    // delayed restart, which has tests of its own that turn it on.
    settings.store.redlock_restart_delay = Some(Duration::ZERO);
    settings
}

/// Settings that wait for `n` replica acknowledgements
/// (`--min-replicas-acked`), with time for a busy machine: 800 ms rather
/// than the default 200 ms (below the 1 s Redis timeout).
pub fn with_acks(settings: &mut Settings, n: usize) {
    settings.store.min_replicas_acked = n;
    settings.store.replica_ack_timeout = Duration::from_millis(800);
}

/// How much of a lease a request sent at `sent` may have lost by its
/// answer, in ms: the time since, and 4 ms for Redlock's fixed drift
/// allowance (2 ms) and the rounding down of the elapsed time on both
/// sides. A grant or an extend reports the TTL less the time since lockd
/// sent the script (and Redlock its drift), in whole milliseconds.
pub fn lease_slack_ms(sent: std::time::Instant) -> u64 {
    u64::try_from(super::ms_since(sent)).expect("not negative") + 4
}

/// Checks that `ttl_ms` is what is left of a lease of `asked` ms granted
/// or extended by a request sent at `sent`: at most `asked` (never more
/// than the lease), and short of it by no more than [`lease_slack_ms`],
/// so that a slow machine cannot fail it.
#[track_caller]
pub fn assert_lease_ms(ttl_ms: Option<u64>, asked: u64, sent: std::time::Instant) {
    let ttl_ms = ttl_ms.expect("a ttl_ms");
    let slack = lease_slack_ms(sent);
    assert!(
        ttl_ms <= asked && ttl_ms + slack >= asked,
        "ttl_ms {ttl_ms} for a lease of {asked} ms, sent {} ms before",
        slack - 4
    );
}

/// Checks that `pttl`, a lease's PTTL read from the store, is what is
/// left of a lease of `asked` ms granted or extended by a request sent at
/// `sent`: at most `asked`, and short of it by no more than the time
/// since (so that a slow machine cannot fail it).
#[track_caller]
pub fn assert_pttl_since(pttl: i64, asked: u64, sent: std::time::Instant) {
    let since = super::ms_since(sent);
    let asked = i64::try_from(asked).expect("fits");
    assert!(
        pttl <= asked && pttl + since + 2 >= asked,
        "PTTL {pttl} for a lease of {asked} ms, {since} ms after the request was sent"
    );
}

impl TestApp {
    /// lockd over a fresh redis-server.
    pub async fn redis() -> Self {
        Self::redis_with(|_| {}).await
    }

    /// lockd over a fresh redis-server, with settings changed by `tweak`.
    pub async fn redis_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let server = Arc::new(RedisServer::spawn().await);
        Self::redis_on(server, tweak).await
    }

    /// Another lockd on the same redis-server as `self` (which must use
    /// Redis), with settings changed by `tweak`: two instances sharing one
    /// Redis, as in a deployment.
    pub async fn sibling(&self, tweak: impl FnOnce(&mut Settings)) -> Self {
        match &self.store {
            Store::Redis(server) => Self::redis_on(server.clone(), tweak).await,
            Store::Redlock(nodes) => {
                let urls = self
                    .settings
                    .store
                    .redis_urls
                    .iter()
                    .map(|u| u.expose().to_owned());
                Self::redlock_over(nodes.clone(), urls.collect(), tweak).await
            }
            Store::Cluster(cluster) => Self::cluster_on(cluster.clone(), tweak).await,
            Store::Sentinel(set) => Self::sentinel_on(set.clone(), tweak).await,
            Store::Memory(_) => panic!("instances share only a Redis store"),
        }
    }

    /// lockd in Sentinel mode over `set` (`--redis-mode sentinel`, the
    /// Sentinels' URLs, `--sentinel-master`), with settings changed by
    /// `tweak`.
    pub async fn sentinel_on(set: Arc<SentinelSet>, tweak: impl FnOnce(&mut Settings)) -> Self {
        LazyLock::force(&TRACING);
        let mut settings = test_settings(String::new());
        settings.store.redis_urls = set.sentinel_urls().into_iter().map(Into::into).collect();
        settings.store.redis_mode = Some(RedisMode::Sentinel);
        settings.store.sentinel_master = Some(MASTER_NAME.to_owned());
        tweak(&mut settings);
        let app = Application::build(&settings)
            .await
            .expect("build lockd over Sentinel");
        Self::serve(app, Store::Sentinel(set), settings)
    }

    /// lockd in cluster mode over the shared Redis Cluster
    /// ([`shared_cluster`]), seeded with one master, with settings changed
    /// by `tweak`. Tests on it must use lock names of their own.
    pub async fn cluster_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let cluster = tokio::task::spawn_blocking(shared_cluster)
            .await
            .expect("start the cluster");
        Self::cluster_on(cluster, tweak).await
    }

    /// lockd in cluster mode over `cluster`, seeded with one master.
    pub async fn cluster_on(cluster: Arc<Cluster>, tweak: impl FnOnce(&mut Settings)) -> Self {
        LazyLock::force(&TRACING);
        let mut settings = test_settings(cluster.master_urls()[0].clone());
        settings.store.redis_mode = Some(RedisMode::Cluster);
        tweak(&mut settings);
        let app = Application::build(&settings)
            .await
            .expect("build lockd over the Redis Cluster");
        Self::serve(app, Store::Cluster(cluster), settings)
    }

    /// lockd running Redlock over `n` fresh redis-servers, with settings
    /// changed by `tweak`.
    pub async fn redlock(n: usize, tweak: impl FnOnce(&mut Settings)) -> Self {
        let nodes: Vec<Arc<RedisServer>> =
            futures::future::join_all((0..n).map(|_| RedisServer::spawn()))
                .await
                .into_iter()
                .map(Arc::new)
                .collect();
        let urls = nodes.iter().map(|node| node.url()).collect();
        Self::redlock_over(nodes, urls, tweak).await
    }

    /// lockd running Redlock over 3 fresh redis-servers, for the
    /// conformance tests of [`backend_tests!`], with settings changed by
    /// `tweak`. Its drift factor is 0: Redlock reports the validity of a
    /// lease, `ttl − elapsed − (ttl × drift_factor + 2 ms)`, and with the
    /// default 1 % a lease of 30 s would read 300 ms short, past the
    /// [`lease_slack_ms`] the conformance tests allow for the time on the
    /// wire. The drift allowance has tests of its own (`lock::redlock`).
    /// Each node gets the single Redis's timeout (`redis_timeout_ms`, not
    /// the 50 ms `node_timeout_ms` default), so that a test's bursts of concurrent
    /// requests queue for the pool as they do on one Redis, rather than
    /// time out as a quorum failure.
    pub async fn redlock_conformance(tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::redlock(3, |settings| {
            settings.store.drift_factor = 0.0;
            settings.store.node_timeout = settings.store.redis_timeout;
            tweak(settings);
        })
        .await
    }

    /// lockd running Redlock over `nodes`, reached at `urls` (one per node,
    /// in the same order: its own URL, or a [`LinkProxy`]'s in front of it),
    /// with settings changed by `tweak`.
    pub async fn redlock_over(
        nodes: Vec<Arc<RedisServer>>,
        urls: Vec<String>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        assert_eq!(nodes.len(), urls.len(), "one URL per node");
        assert!(nodes.len() >= 2, "Redlock needs several nodes");
        LazyLock::force(&TRACING);
        let mut settings = test_settings(String::new());
        settings.store.redis_urls = urls.into_iter().map(Into::into).collect();
        tweak(&mut settings);
        let app = Application::build(&settings)
            .await
            .expect("build lockd over Redlock");
        Self::serve(app, Store::Redlock(nodes), settings)
    }

    /// The Redlock nodes, in the order of `store.redis_urls` (panics for other
    /// stores).
    pub fn nodes(&self) -> &[Arc<RedisServer>] {
        match &self.store {
            Store::Redlock(nodes) => nodes,
            _ => panic!("this test needs the Redlock backend"),
        }
    }

    /// Redlock node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes()[i]
    }

    /// The `node` label of node `i` in lockd's metrics: `host:port` of the
    /// URL lockd uses for it.
    pub fn node_label(&self, i: usize) -> String {
        let url = self.settings.store.redis_urls[i].expose();
        url.strip_prefix("redis://")
            .unwrap_or(url)
            .trim_end_matches('/')
            .to_owned()
    }

    /// lockd over `server` (such as one from
    /// [`RedisServer::spawn_persistent`]), with settings changed by `tweak`.
    pub async fn redis_on(server: Arc<RedisServer>, tweak: impl FnOnce(&mut Settings)) -> Self {
        LazyLock::force(&TRACING);
        let mut settings = test_settings(server.url());
        tweak(&mut settings);
        let app = Application::build(&settings)
            .await
            .expect("build lockd over Redis");
        Self::serve(app, Store::Redis(server), settings)
    }

    /// lockd over the in-memory backend.
    pub async fn memory() -> Self {
        Self::memory_with(|_| {}).await
    }

    /// lockd over the in-memory backend, with settings changed by `tweak`.
    pub async fn memory_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        LazyLock::force(&TRACING);
        let mut settings = test_settings("redis://127.0.0.1:1".into());
        tweak(&mut settings);
        let backend = Arc::new(
            MemoryBackend::with_fence_retention(settings.store.fence_retention)
                .with_history_length(settings.store.history_length),
        );
        let app = Application::with_backend(&settings, backend.clone())
            .await
            .expect("build lockd over memory");
        Self::serve(app, Store::Memory(backend), settings)
    }

    fn serve(app: Application, store: Store, settings: Settings) -> Self {
        let addr = app.local_addr().expect("local address");
        let metrics_addr = app.metrics_addr().expect("metrics address");
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(app.run_until(async move {
            let _ = rx.await;
        }));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client");
        Self {
            addr,
            metrics_addr,
            client,
            store,
            settings,
            shutdown: Mutex::new(Some(tx)),
            served: Mutex::new(Some(served)),
        }
    }

    /// Begins the graceful shutdown, as SIGTERM does in `main`: lockd stops
    /// accepting connections, ends every wait (503 `shutting-down`) and
    /// finishes the requests in flight.
    pub fn shut_down(&self) {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }

    /// Whether the server finished (after [`Self::shut_down`]) within
    /// `within`, without an error.
    pub async fn stopped_within(&self, within: Duration) -> bool {
        let Some(mut served) = self.served.lock().unwrap().take() else {
            return true;
        };
        match tokio::time::timeout(within, &mut served).await {
            Ok(result) => matches!(result, Ok(Ok(()))),
            Err(_) => {
                *self.served.lock().unwrap() = Some(served);
                false
            }
        }
    }

    /// An HTTP client that gives up (hangs up) after `timeout`, for use with
    /// [`Self::try_send_via`].
    pub fn client_with_timeout(timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .expect("HTTP client")
    }

    /// Sends `POST path` `n` times from a client that hangs up after
    /// 300 ms: each must be a wait not answered by then.
    pub async fn hang_up_waits(&self, path: &str, n: usize) {
        let impatient = Self::client_with_timeout(Duration::from_millis(300));
        for _ in 0..n {
            let hung_up = self
                .try_send_via(&impatient, Method::POST, path, &[], None)
                .await;
            assert!(hung_up.is_err(), "the wait was answered: {hung_up:?}");
        }
    }

    /// The Redis server (panics for the memory backend).
    pub fn redis_server(&self) -> &RedisServer {
        match &self.store {
            Store::Redis(server) => server,
            _ => panic!("this test needs the single-Redis backend"),
        }
    }

    /// Whether the store is one Redis (not Redlock, not memory).
    pub fn is_redis(&self) -> bool {
        matches!(self.store, Store::Redis(_))
    }

    /// Whether the store is Redlock over several Redis nodes.
    pub fn is_redlock(&self) -> bool {
        matches!(self.store, Store::Redlock(_))
    }

    /// How many nodes each lock operation goes to: Redlock's nodes, else 1.
    pub fn node_count(&self) -> usize {
        match &self.store {
            Store::Redlock(nodes) => nodes.len(),
            _ => 1,
        }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends any request. `path` includes any query string.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        let what = format!("{method} {path}");
        self.try_send(method, path, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{what}: no HTTP answer: {e}"))
    }

    /// Like [`Self::send`], but a request that gets no HTTP answer (the
    /// connection was dropped, or it timed out) is an `Err`.
    pub async fn try_send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Reply, reqwest::Error> {
        self.try_send_via(&self.client, method, path, headers, body)
            .await
    }

    /// Like [`Self::try_send`], through `client` (such as one from
    /// [`Self::client_with_timeout`]).
    pub async fn try_send_via(
        &self,
        client: &reqwest::Client,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Reply, reqwest::Error> {
        let mut request = client.request(method, self.url(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        Reply::read(request.send().await?).await
    }

    /// A waiting acquire, `POST /locks/{name}` with `{"ttl_ms", "wait_ms"}`,
    /// on its own task: its answer, or `Err` when none came within
    /// `wait_ms` and 10 s more.
    pub fn spawn_wait(
        &self,
        name: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> JoinHandle<Result<Reply, reqwest::Error>> {
        let request = self
            .client
            .post(self.url(&format!("/locks/{name}")))
            .json(&serde_json::json!({ "ttl_ms": ttl_ms, "wait_ms": wait_ms }))
            .timeout(Duration::from_millis(wait_ms) + Duration::from_secs(10));
        tokio::spawn(async move { Reply::read(request.send().await?).await })
    }

    /// Sends a request with an optional JSON body.
    pub async fn send_json(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Reply {
        let body = body.map(|b| serde_json::to_vec(&b).expect("serialize JSON"));
        let mut all = headers.to_vec();
        if body.is_some() {
            all.push((CONTENT_TYPE.as_str(), "application/json"));
        }
        self.send(method, path, &all, body).await
    }

    /// `POST /locks/{name}` with an optional JSON body.
    pub async fn acquire(&self, name: &str, body: Option<Value>) -> Reply {
        self.send_json(Method::POST, &format!("/locks/{name}"), &[], body)
            .await
    }

    /// `POST /locks/{name}` with `{"ttl_ms": ttl_ms}`.
    pub async fn acquire_ttl(&self, name: &str, ttl_ms: u64) -> Reply {
        self.acquire(name, Some(serde_json::json!({ "ttl_ms": ttl_ms })))
            .await
    }

    /// `PATCH /locks/{name}` with the token in `Lock-Token` and an optional
    /// JSON body.
    pub async fn extend(&self, name: &str, token: &str, body: Option<Value>) -> Reply {
        self.send_json(
            Method::PATCH,
            &format!("/locks/{name}"),
            &[("Lock-Token", token)],
            body,
        )
        .await
    }

    /// `PATCH /locks/{name}` to `ttl_ms`.
    pub async fn extend_ttl(&self, name: &str, token: &str, ttl_ms: u64) -> Reply {
        self.extend(name, token, Some(serde_json::json!({ "ttl_ms": ttl_ms })))
            .await
    }

    /// `DELETE /locks/{name}` with the token in `Lock-Token`.
    pub async fn release(&self, name: &str, token: &str) -> Reply {
        self.send(
            Method::DELETE,
            &format!("/locks/{name}"),
            &[("Lock-Token", token)],
            None,
        )
        .await
    }

    /// `GET /locks/{name}`.
    pub async fn inspect(&self, name: &str) -> Reply {
        self.get(&format!("/locks/{name}")).await
    }

    /// `GET <path>`.
    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[], None).await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        reply.expect_status(200);
        reply.text
    }

    /// Waits until the samples of the gauge `name` that have `labels`
    /// add up to `n`; panics after 5 s, saying what they added up to.
    pub async fn until_gauge(&self, name: &str, labels: &[(&str, &str)], n: f64) {
        let until = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let now = super::metric(&self.metrics().await, name, labels).unwrap_or(0.0);
            if now == n {
                return;
            }
            assert!(
                std::time::Instant::now() < until,
                "{name} is {now}, not {n}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many lock operations reached the backend so far (from
    /// `lockd_backend_duration_seconds_count`, any op but `ping`).
    pub async fn backend_calls(&self) -> u64 {
        let text = self.metrics().await;
        ["acquire", "extend", "release", "inspect"]
            .iter()
            .map(|op| {
                metric(&text, "lockd_backend_duration_seconds_count", &[("op", op)]).unwrap_or(0.0)
                    as u64
            })
            .sum()
    }

    /// Who holds `name` according to the store: the token and the remaining
    /// lease in ms (Redis: `GET` and `PTTL` of the lock key; memory: `peek`;
    /// Redlock: the token a quorum of nodes holds, with the shortest PTTL).
    pub async fn holder(&self, name: &str) -> Option<(String, i64)> {
        match &self.store {
            Store::Redis(server) => server.get_with_pttl(&lock_key(name)).await,
            // The holder by Redlock's rule: the token a quorum of nodes
            // holds, with the shortest of their leases.
            Store::Redlock(nodes) => {
                let key = lock_key(name);
                let held =
                    futures::future::join_all(nodes.iter().map(|node| node.get_with_pttl(&key)))
                        .await;
                let held: Vec<(String, i64)> = held.into_iter().flatten().collect();
                let quorum = nodes.len() / 2 + 1;
                held.iter()
                    .map(|(token, _)| token)
                    .find(|token| held.iter().filter(|(t, _)| t == *token).count() >= quorum)
                    .map(|token| {
                        let pttl = held
                            .iter()
                            .filter(|(t, _)| t == token)
                            .map(|(_, pttl)| *pttl)
                            .min()
                            .unwrap_or(-1);
                        (token.clone(), pttl)
                    })
            }
            Store::Cluster(cluster) => {
                let (cluster, key) = (cluster.clone(), lock_key(name));
                tokio::task::spawn_blocking(move || cluster.get_with_pttl(&key))
                    .await
                    .expect("read the cluster")
            }
            Store::Sentinel(set) => {
                set.server(set.master_port())
                    .get_with_pttl(&lock_key(name))
                    .await
            }
            Store::Memory(backend) => backend.peek(name).map(|(token, left)| {
                (
                    token,
                    i64::try_from(left.as_millis()).expect("lease fits in i64"),
                )
            }),
        }
    }

    /// Sets the lock key of `name` as a client other than lockd might:
    /// with no TTL (and no fence, no holder hash). Redis only.
    pub async fn set_lock_key_without_ttl(&self, name: &str) {
        self.redis_server()
            .cmd::<()>(::redis::cmd("SET").arg(lock_key(name)).arg("foreign"))
            .await;
    }

    /// The holder's token only.
    pub async fn holder_token(&self, name: &str) -> Option<String> {
        self.holder(name).await.map(|(token, _)| token)
    }

    /// How many lock and semaphore records the store has (Redis: keys
    /// under the prefix except `:fence` counters, i.e. lock, meta, permits
    /// and holders keys; memory: held locks and live permits; Redlock: the
    /// most any node has).
    pub async fn lock_key_count(&self) -> usize {
        match &self.store {
            Store::Redis(server) => server
                .keys()
                .await
                .iter()
                .filter(|k| {
                    k.starts_with(PREFIX) && !k.ends_with(":fence") && !k.ends_with(":history")
                })
                .count(),
            // The most any node has: each node keeps its own copy.
            Store::Redlock(nodes) => {
                let mut most = 0;
                for node in nodes {
                    let count = node
                        .keys()
                        .await
                        .iter()
                        .filter(|k| {
                            k.starts_with(PREFIX)
                                && !k.ends_with(":fence")
                                && !k.ends_with(":history")
                        })
                        .count();
                    most = most.max(count);
                }
                most
            }
            Store::Memory(backend) => backend.held_count() + backend.permit_count(),
            Store::Cluster(_) => panic!("the shared cluster has other tests' keys"),
            Store::Sentinel(set) => set
                .server(set.master_port())
                .keys()
                .await
                .iter()
                .filter(|k| {
                    k.starts_with(PREFIX) && !k.ends_with(":fence") && !k.ends_with(":history")
                })
                .count(),
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Generates one `#[tokio::test]` per backend for each listed
/// `async fn name(app: &TestApp)` of the calling file: `redis::name` over a
/// fresh redis-server, `memory::name` over the in-memory backend and
/// `redlock::name` over Redlock on 3 fresh redis-servers.
///
/// `backend_tests!(mod m = |s: &mut Settings| ...; name, ...)` does the same
/// with settings changed by the closure, as `m::redis::name`,
/// `m::memory::name` and `m::redlock::name`. In both forms a name may carry attributes, such as
/// `#[ignore = "bug: ..."]`, given to both of its tests.
#[allow(unused_macros)]
macro_rules! backend_tests {
    (mod $module:ident = $tweak:expr; $($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod $module {
            mod redis {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $name() {
                        let app = crate::support::TestApp::redis_with($tweak).await;
                        super::super::$name(&app).await;
                    }
                )*
            }
            mod memory {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $name() {
                        let app = crate::support::TestApp::memory_with($tweak).await;
                        super::super::$name(&app).await;
                    }
                )*
            }
            mod redlock {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $name() {
                        let app = crate::support::TestApp::redlock_conformance($tweak).await;
                        super::super::$name(&app).await;
                    }
                )*
            }
        }
    };
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn $name() {
                    let app = crate::support::TestApp::redis().await;
                    super::$name(&app).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn $name() {
                    let app = crate::support::TestApp::memory().await;
                    super::$name(&app).await;
                }
            )*
        }
        mod redlock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn $name() {
                    let app = crate::support::TestApp::redlock_conformance(|_| {}).await;
                    super::$name(&app).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use backend_tests;

/// Generates one `#[tokio::test]` per backend that keeps every kind of
/// lease (a fresh redis-server, `redis::name`, and the in-memory backend,
/// `memory::name`) for each listed `async fn name(app: &TestApp)` of the
/// calling file: the tests of a kind Redlock refuses (semaphores, runs,
/// shared locks), which test its 501 on their own.
#[allow(unused_macros)]
macro_rules! redis_and_memory_tests {
    ($($name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&crate::support::TestApp::redis().await).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&crate::support::TestApp::memory().await).await;
                }
            )*
        }
    };
}
pub(crate) use redis_and_memory_tests;
