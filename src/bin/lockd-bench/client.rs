//! The benchmarks' view of a lockd server, over lockd's own typed client
//! ([`LockClient`]): grants with the time they arrived, and the status of
//! each answer where a scenario counts them.

use std::time::Duration;

use lockd::client::api::{AcquireParams, ClientError, LockClient, RunStart, Target};
use tokio::time::Instant;

/// How long one request may take (a waiting acquire included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A lockd server reached over keep-alive HTTP connections.
#[derive(Clone)]
pub struct Lockd {
    client: LockClient,
    /// With a limit, names are semaphores of that limit: an acquire takes
    /// a permit and a release gives it back.
    semaphore_limit: Option<u32>,
    /// Locks are taken shared (`mode: "shared"`) rather than exclusive.
    shared: bool,
}

/// A grant: the token and fence, and when the 201 arrived.
#[derive(Debug, Clone)]
pub struct Grant {
    pub token: String,
    pub fence: u64,
    pub at: Instant,
}

/// Why a benchmark stopped.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// One request's outcome, for scenarios that count errors instead of
/// stopping at the first.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The HTTP status; `None` when no answer came (connection error).
    pub status: Option<u16>,
    /// The grant, on 201 or 200.
    pub grant: Option<Grant>,
    /// A run's start found the run done (200 with its result): no attempt.
    pub done: bool,
}

impl Lockd {
    /// A client for the lockd at `base` (`http://host:port`).
    pub fn new(base: &str) -> Result<Self, BenchError> {
        Ok(Self {
            client: LockClient::new(base, None, None)?,
            semaphore_limit: None,
            shared: false,
        })
    }

    /// The same server, with every name a semaphore of `limit` (`None`:
    /// locks).
    #[must_use]
    pub fn with_semaphores(mut self, limit: Option<u32>) -> Self {
        self.semaphore_limit = limit;
        self
    }

    /// The same server, with every lock taken shared (`mode: "shared"`)
    /// when `shared`, exclusive otherwise.
    #[must_use]
    pub fn with_shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    fn target<'a>(&self, name: &'a str) -> Target<'a> {
        Target::new(name, self.semaphore_limit.is_some())
    }

    /// `POST /locks/{name}` for a new grant under a token the server
    /// generates.
    /// Returns the answer's status (201) with the grant.
    async fn post(
        &self,
        name: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<(u16, Grant), ClientError> {
        let params = AcquireParams {
            ttl_ms: Some(ttl_ms),
            wait_ms,
            limit: self.semaphore_limit,
            shared: self.shared,
            ..AcquireParams::default()
        };
        let reply = self
            .client
            .acquire(self.target(name), &params, REQUEST_TIMEOUT)
            .await?;
        let at = Instant::now();
        let Some(fence) = reply.value.fence else {
            return Err(ClientError::Unexpected {
                status: reply.status,
                body: String::new(),
                why: "no fence".into(),
            });
        };
        let grant = Grant {
            token: reply.value.token,
            fence,
            at,
        };
        Ok((reply.status.as_u16(), grant))
    }

    /// `POST /locks/{name}`: `Ok(Some(grant))` on 201 or 200, `Ok(None)` on
    /// 409, an error on anything else.
    pub async fn acquire(
        &self,
        name: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<Option<Grant>, BenchError> {
        match self.post(name, ttl_ms, wait_ms).await {
            Ok((_, grant)) => Ok(Some(grant)),
            Err(ClientError::Held { .. }) => Ok(None),
            Err(e) => Err(failed("acquire", &e)),
        }
    }

    /// `POST /locks/{name}`, whatever the answer.
    pub async fn try_acquire(&self, name: &str, ttl_ms: u64, wait_ms: u64) -> Attempt {
        match self.post(name, ttl_ms, wait_ms).await {
            Ok((status, grant)) => Attempt {
                status: Some(status),
                grant: Some(grant),
                done: false,
            },
            Err(e) => Attempt {
                status: e.status().map(|s| s.as_u16()),
                grant: None,
                done: false,
            },
        }
    }

    /// `POST /runs/{key}`, whatever the answer: a grant for a new attempt
    /// (201), `done` when the run's result is still kept (200).
    pub async fn try_start_run(&self, key: &str, ttl_ms: u64) -> Attempt {
        let params = AcquireParams {
            ttl_ms: Some(ttl_ms),
            ..AcquireParams::default()
        };
        match self.client.start_run(key, &params, REQUEST_TIMEOUT).await {
            Ok(reply) => {
                let status = Some(reply.status.as_u16());
                match reply.value {
                    RunStart::Attempt(lease) => Attempt {
                        status,
                        grant: Some(Grant {
                            token: lease.token,
                            // An attempt always has a fence; no cycle reads it.
                            fence: lease.fence.unwrap_or_default(),
                            at: Instant::now(),
                        }),
                        done: false,
                    },
                    RunStart::Done { .. } => Attempt {
                        status,
                        grant: None,
                        done: true,
                    },
                }
            }
            Err(e) => Attempt {
                status: e.status().map(|s| s.as_u16()),
                grant: None,
                done: false,
            },
        }
    }

    /// `PUT /runs/{key}/result` with a small result, kept `retention_ms`
    /// (the server's longest when `None`): the status, `None` when no
    /// answer came.
    pub async fn try_complete_run(
        &self,
        key: &str,
        token: &str,
        retention_ms: Option<u64>,
    ) -> Option<u16> {
        let result = serde_json::json!({ "ok": true });
        match self
            .client
            .complete_run_keeping(key, token, &result, retention_ms, REQUEST_TIMEOUT)
            .await
        {
            Ok(reply) => Some(reply.status.as_u16()),
            Err(e) => e.status().map(|s| s.as_u16()),
        }
    }

    /// `DELETE /locks/{name}`: the status, `None` when no answer came.
    pub async fn try_release(&self, name: &str, token: &str) -> Option<u16> {
        match self
            .client
            .release(self.target(name), token, REQUEST_TIMEOUT)
            .await
        {
            Ok(reply) => Some(reply.status.as_u16()),
            Err(e) => e.status().map(|s| s.as_u16()),
        }
    }

    /// `DELETE /locks/{name}`; returns when the 204 arrived.
    pub async fn release(&self, name: &str, token: &str) -> Result<Instant, BenchError> {
        match self
            .client
            .release(self.target(name), token, REQUEST_TIMEOUT)
            .await
        {
            Ok(_) => Ok(Instant::now()),
            Err(e) => Err(failed("release", &e)),
        }
    }

    /// The sum of every sample of a gauge or counter from `/metrics` (all
    /// its label values: `lockd_waiters` has one per namespace).
    pub async fn metric(&self, name: &str) -> Result<f64, BenchError> {
        let text = self.client.metrics(REQUEST_TIMEOUT).await?;
        let values: Vec<f64> = text
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(name)?;
                let value = match rest.strip_prefix('{') {
                    Some(labelled) => labelled.split_once("} ")?.1,
                    None => rest.strip_prefix(' ')?,
                };
                value.trim().parse::<f64>().ok()
            })
            .collect();
        if values.is_empty() {
            return Err(format!("no metric {name}").into());
        }
        Ok(values.iter().sum())
    }

    /// Waits until `lockd_waiters` is at least `n`.
    pub async fn until_waiting(&self, n: usize, limit: Duration) -> Result<(), BenchError> {
        let started = Instant::now();
        loop {
            if self.metric("lockd_waiters").await? >= n as f64 {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(format!("fewer than {n} waiters after {limit:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// What a scenario says when `what` failed: the status and the server's
/// body when it answered, the reason when it did not.
fn failed(what: &str, e: &ClientError) -> BenchError {
    match e.refusal() {
        Some(answer) => format!(
            "{what} answered {}: {}",
            answer.status.as_u16(),
            answer.body
        )
        .into(),
        None => format!("{what}: {e}").into(),
    }
}

/// A lock name no earlier run used.
pub fn fresh_name(scenario: &str) -> String {
    format!("bench:{scenario}:{:016x}", rand::random::<u64>())
}
