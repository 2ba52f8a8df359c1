//! The limits a request is held to, from the settings: the default and
//! longest TTL, the longest wait, and the time any request may take. The
//! handlers resolve a request's `ttl_ms` and `wait_ms` against them; the
//! deadline layer and the OpenAPI document read them too.

use std::time::Duration;

use super::problem::ApiError;
use crate::config::{LimitSettings, whole_millis};
use crate::lock::{ExtendTtl, InvalidInput, Ttl};

/// Every limit of this server that a request's input is held to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Default and maximum TTL.
    pub ttl: TtlPolicy,
    /// Maximum wait.
    pub wait: WaitPolicy,
    /// Longest time a request may take (an acquire: on top of its wait).
    pub request_timeout: Duration,
    /// The largest limit a semaphore may have.
    pub max_semaphore_limit: u32,
    /// Silence after which a watch's stream gets a comment line.
    pub watch_keepalive: Duration,
    /// How long a done run's result is kept at most, and a pending run's
    /// record after its last attempt (`--run-retention-ms`).
    pub run_retention: Duration,
    /// The largest result a run may store, in bytes of JSON
    /// (`--max-result-bytes`).
    pub max_result_bytes: usize,
    /// The largest holder metadata, in bytes of compact JSON
    /// (`--max-meta-bytes`).
    pub max_meta_bytes: usize,
}

impl Limits {
    /// The limits of `settings` (`--default-ttl-ms`, `--max-ttl-ms`,
    /// `--max-wait-ms`, `--request-timeout-ms`, `--max-semaphore-limit`).
    ///
    /// # Errors
    /// When the default TTL is longer than the maximum (which loaded
    /// settings never are; settings edited in code may be).
    pub fn from_settings(settings: &LimitSettings) -> Result<Self, InvalidInput> {
        let max_ms = settings.max_ttl.as_millis();
        let default = Ttl::from_millis(settings.default_ttl.as_millis(), max_ms, "default_ttl_ms")?;
        Ok(Self {
            ttl: TtlPolicy { default, max_ms },
            wait: WaitPolicy {
                max_ms: whole_millis(settings.max_wait),
            },
            request_timeout: settings.request_timeout,
            max_semaphore_limit: settings.max_semaphore_limit,
            watch_keepalive: settings.watch_keepalive,
            run_retention: settings.run_retention,
            max_result_bytes: settings.max_result_bytes,
            max_meta_bytes: settings.max_meta_bytes,
        })
    }
}

impl Limits {
    /// What a numeric field of a request must be, for a field that has a
    /// rule here (`ttl_ms`, `wait_ms`, `limit`): the same words whether the
    /// value came in the query string or in the body.
    pub fn rule(&self, field: &str) -> Option<String> {
        match field {
            "ttl_ms" => Some(
                InvalidInput::Ttl {
                    field: "ttl_ms",
                    max_ms: self.ttl.max_ms,
                }
                .to_string(),
            ),
            "wait_ms" => Some(self.wait.rule()),
            "limit" => Some(limit_rule(self.max_semaphore_limit)),
            "retention_ms" => Some(format!(
                "retention_ms must be an integer number of milliseconds from 1 to {} (--run-retention-ms)",
                self.run_retention.as_millis()
            )),
            _ => None,
        }
    }
}

/// What a semaphore's `limit` must be, with `max_limit` the server's
/// `--max-semaphore-limit`.
pub fn limit_rule(max_limit: u32) -> String {
    format!(
        "limit must be an integer from 1 to {max_limit}: the most holders of this semaphore at once"
    )
}

/// The TTL rules of this server.
#[derive(Debug, Clone, Copy)]
pub struct TtlPolicy {
    /// The TTL when a request gives none.
    pub default: Ttl,
    /// The largest TTL a request may ask for, in milliseconds.
    pub max_ms: u64,
}

impl TtlPolicy {
    /// The TTL from a query's text or a body's integer (at most one of them),
    /// or the default.
    ///
    /// # Errors
    /// 400 when both are given or the value is out of range.
    pub fn resolve(&self, query: Option<&str>, body: Option<u64>) -> Result<Ttl, ApiError> {
        Ok(self.given(query, body)?.unwrap_or(self.default))
    }

    /// The TTL an extend asks for: the one given in the query or the body
    /// (at most one of them), or else the lock's own TTL, with the default
    /// for a lock that records none.
    ///
    /// # Errors
    /// As for [`Self::resolve`].
    pub fn resolve_extend(
        &self,
        query: Option<&str>,
        body: Option<u64>,
    ) -> Result<ExtendTtl, ApiError> {
        Ok(match self.given(query, body)? {
            Some(ttl) => ExtendTtl::To(ttl),
            None => ExtendTtl::Own {
                fallback: self.default,
            },
        })
    }

    fn given(&self, query: Option<&str>, body: Option<u64>) -> Result<Option<Ttl>, ApiError> {
        match (query, body) {
            (Some(_), Some(_)) => Err(ApiError::given_twice("ttl_ms")),
            (Some(text), None) => Ok(Some(Ttl::parse_text(text, self.max_ms, "ttl_ms")?)),
            (None, Some(ms)) => Ok(Some(Ttl::from_millis(ms, self.max_ms, "ttl_ms")?)),
            (None, None) => Ok(None),
        }
    }
}

/// The wait rules of this server.
#[derive(Debug, Clone, Copy)]
pub struct WaitPolicy {
    /// The longest wait a request may ask for, in milliseconds.
    pub max_ms: u64,
}

impl WaitPolicy {
    /// What a `wait_ms` must be.
    pub fn rule(&self) -> String {
        format!(
            "wait_ms must be an integer number of milliseconds from 0 to {}",
            self.max_ms
        )
    }

    /// The wait from a query's text or a body's integer (at most one of
    /// them), or zero.
    ///
    /// # Errors
    /// 400 when both are given, or the value is not an integer in
    /// `0..=max_ms`.
    pub fn resolve(&self, query: Option<&str>, body: Option<u64>) -> Result<Duration, ApiError> {
        let out_of_range = || ApiError::invalid(self.rule());
        let ms = match (query, body) {
            (Some(_), Some(_)) => return Err(ApiError::given_twice("wait_ms")),
            (Some(text), None) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse::<u64>().map_err(|_| out_of_range())?
            }
            (Some(_), None) => return Err(out_of_range()),
            (None, Some(ms)) => ms,
            (None, None) => 0,
        };
        if ms > self.max_ms {
            return Err(out_of_range());
        }
        Ok(Duration::from_millis(ms))
    }
}
