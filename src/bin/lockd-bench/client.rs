//! A small lockd HTTP client for the benchmarks.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

/// A lockd server reached over keep-alive HTTP connections.
#[derive(Clone)]
pub struct Lockd {
    http: reqwest::Client,
    base: String,
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
}

impl Lockd {
    /// A client for the lockd at `base` (`http://host:port`).
    pub fn new(base: &str) -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(usize::MAX)
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap_or_default();
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    /// `POST /locks/{name}`: `Ok(Some(grant))` on 201 or 200, `Ok(None)` on
    /// 409, an error on anything else.
    pub async fn acquire(
        &self,
        name: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<Option<Grant>, BenchError> {
        let url = format!(
            "{}/locks/{name}?ttl_ms={ttl_ms}&wait_ms={wait_ms}",
            self.base
        );
        let response = self.http.post(url).send().await?;
        let at = Instant::now();
        match response.status().as_u16() {
            200 | 201 => {
                let body: Value = response.json().await?;
                let token = body["token"].as_str().ok_or("no token")?.to_owned();
                let fence = body["fence"].as_u64().ok_or("no fence")?;
                Ok(Some(Grant { token, fence, at }))
            }
            409 => Ok(None),
            status => Err(format!("acquire answered {status}: {}", response.text().await?).into()),
        }
    }

    /// `POST /locks/{name}`, whatever the answer.
    pub async fn try_acquire(&self, name: &str, ttl_ms: u64, wait_ms: u64) -> Attempt {
        let url = format!(
            "{}/locks/{name}?ttl_ms={ttl_ms}&wait_ms={wait_ms}",
            self.base
        );
        let Ok(response) = self.http.post(url).send().await else {
            return Attempt {
                status: None,
                grant: None,
            };
        };
        let at = Instant::now();
        let status = response.status().as_u16();
        let grant = match status {
            200 | 201 => response.json::<Value>().await.ok().and_then(|body| {
                Some(Grant {
                    token: body["token"].as_str()?.to_owned(),
                    fence: body["fence"].as_u64()?,
                    at,
                })
            }),
            _ => {
                let _ = response.bytes().await;
                None
            }
        };
        Attempt {
            status: Some(status),
            grant,
        }
    }

    /// `DELETE /locks/{name}`: the status, `None` when no answer came.
    pub async fn try_release(&self, name: &str, token: &str) -> Option<u16> {
        let url = format!("{}/locks/{name}", self.base);
        let response = self
            .http
            .delete(url)
            .header("Lock-Token", token)
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        let _ = response.bytes().await;
        Some(status)
    }

    /// `DELETE /locks/{name}`; returns when the 204 arrived.
    pub async fn release(&self, name: &str, token: &str) -> Result<Instant, BenchError> {
        let url = format!("{}/locks/{name}", self.base);
        let response = self
            .http
            .delete(url)
            .header("Lock-Token", token)
            .send()
            .await?;
        let at = Instant::now();
        match response.status().as_u16() {
            204 => Ok(at),
            status => Err(format!("release answered {status}: {}", response.text().await?).into()),
        }
    }

    /// The sum of every sample of a gauge or counter from `/metrics` (all
    /// its label values: `lockd_waiters` has one per namespace).
    pub async fn metric(&self, name: &str) -> Result<f64, BenchError> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
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

/// A lock name no earlier run used.
pub fn fresh_name(scenario: &str) -> String {
    format!("bench:{scenario}:{:016x}", rand::random::<u64>())
}
