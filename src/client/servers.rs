//! [`Servers`]: the lockd servers a client knows, in the order of
//! preference, and when a call moves on from one to the next.
//!
//! lockd instances are stateless in front of one store, so any of them may
//! extend or release a lease that another one granted. A call goes to one
//! server, and moves on to the next only when that server is unusable
//! ([`moves_on`]): no answer (refused, timed out, cut off, TLS failed), or
//! 502, 503 or 504. Any other answer is the lock service's word and ends
//! the call: a 409 is never asked again elsewhere. The tries share the
//! call's own time budget, so that a server that hangs leaves time for the
//! next ones. An acquire always carries a token chosen here, so that one
//! tried again elsewhere after a lost answer renews (200) the grant it may
//! have got, and never makes a second one.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use tokio::time::Instant;

use super::api::{
    AcquireParams, BadServer, CallError, ClientError, EventStream, Extended, Lease, LockClient,
    LockStatus, Reply, RunStart, Target,
};
use crate::lock::Token;

/// The lockd servers a client knows, in the order of preference. A call
/// starts with the last server that answered (the first one, at first),
/// and goes on in order, wrapping around, while servers are unusable.
/// Clones share which server that is, so a renewal that had to move on
/// sticks to the server that answered.
#[derive(Clone)]
pub struct Servers {
    clients: Arc<[LockClient]>,
    /// The URLs as given, for `LOCKD_SERVER`.
    given: Arc<[String]>,
    /// The index of the server a call asks first.
    current: Arc<AtomicUsize>,
}

/// Why a call through [`Servers`] did not give what it asked for: what
/// the last server tried answered (or why no answer came), and the servers
/// passed over before it.
#[derive(Debug)]
pub struct Failure {
    /// The last server's answer, or why none came: what the call ended
    /// with.
    pub error: ClientError,
    /// That server, as [`LockClient::server`] shows it.
    pub server: String,
    /// The servers tried before it, in order, each unusable.
    pub passed_over: Vec<Passed>,
    /// The servers not tried because the call's time had run out.
    pub untried: Vec<String>,
    /// Whether more than one server is known (messages then name the one
    /// that answered).
    several: bool,
}

/// A successful answer through [`Servers`], with the servers passed over
/// before it.
#[derive(Debug, Clone)]
pub struct Answered<T> {
    /// The answer.
    pub reply: Reply<T>,
    /// The servers tried before the one that answered, in order, each
    /// unusable (empty when the first server tried answered).
    pub passed_over: Vec<Passed>,
}

/// `, after passing over http://a (no answer: ...), ...`, or "" for none.
pub fn passed_note(passed_over: &[Passed]) -> String {
    if passed_over.is_empty() {
        return String::new();
    }
    let passed: Vec<String> = passed_over
        .iter()
        .map(|p| format!("{} ({})", p.server, p.why))
        .collect();
    format!(", after passing over {}", passed.join(", "))
}

/// A server a call passed over: it was unusable.
#[derive(Debug, Clone)]
pub struct Passed {
    /// The server, as [`LockClient::server`] shows it.
    pub server: String,
    /// Why: no answer (and what happened), or the status and detail of a
    /// 502, 503 or 504.
    pub why: String,
}

impl Failure {
    /// Who answered, for a message: "the server" when only one is known,
    /// else its URL.
    pub fn who(&self) -> &str {
        if self.several {
            &self.server
        } else {
            "the server"
        }
    }

    /// The servers passed over and left untried, for the end of a message:
    /// `, after passing over http://a (no answer: ...)`, or "" when the
    /// first server tried ended the call.
    pub fn tried(&self) -> String {
        let mut note = passed_note(&self.passed_over);
        if !self.untried.is_empty() {
            note.push_str(&format!(
                ", with no time left to try {}",
                self.untried.join(", ")
            ));
        }
        note
    }

    /// The last server's refusal as a shell command reports it: `409
    /// Conflict: ...` when one server is known, `http://b answered 409
    /// Conflict: ...` when several are; then [`Self::tried`]. `None` when
    /// no refusal came.
    pub fn refusal_message(&self) -> Option<String> {
        let answer = self.error.refusal()?;
        let tried = self.tried();
        Some(if self.several {
            format!("{} answered {answer}{tried}", self.server)
        } else {
            format!("{answer}{tried}")
        })
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.refusal_message() {
            Some(refused) => f.write_str(&refused),
            None => write!(f, "{}{}", self.error, self.tried()),
        }
    }
}

/// Whether `error` says that the server is unusable, so that the call moves
/// on to the next server: no answer (the connection was refused or timed
/// out, the TLS handshake failed, the connection broke, or no answer came
/// in the try's time), or 502, 503 or 504 (a proxy's gateway error, or
/// lockd's own 503: its store or quorum unavailable, shutting down,
/// overloaded, too many waiters, timed out). Any other answer (409, 404,
/// 400, 401, 403, 429, 500, ...) is the lock service's word, and stands.
pub fn moves_on(error: &ClientError) -> bool {
    match error {
        ClientError::Unreachable(_) => true,
        other => other.status().is_some_and(|s| {
            matches!(
                s,
                StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            )
        }),
    }
}

/// Why a server was passed over, in words.
fn why_passed(error: &ClientError) -> String {
    match error {
        ClientError::Unreachable(CallError::Unreachable { why, .. }) => {
            format!("no answer: {why}")
        }
        ClientError::Unreachable(CallError::Tls { why, .. }) => why.clone(),
        other => match other.refusal() {
            Some(answer) if answer.problem.detail.is_empty() => answer.status.to_string(),
            Some(answer) => answer.to_string(),
            None => other.to_string(),
        },
    }
}

/// How long one call may take over all the servers it tries: first what
/// the acquire's `wait_ms` may hold a request (any server may use all of
/// it), then a margin for the round trips and the server's own work.
#[derive(Debug, Clone, Copy)]
struct Budget {
    start: Instant,
    wait_until: Instant,
    deadline: Instant,
}

/// What one try gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Try {
    /// The wait it may ask the server for (what is left of `wait_ms`).
    wait: Duration,
    /// How long it may take.
    timeout: Duration,
}

impl Budget {
    fn new(wait: Duration, margin: Duration) -> Self {
        let start = Instant::now();
        Self {
            start,
            wait_until: start + wait,
            deadline: start + wait + margin,
        }
    }

    /// What a try sent at `now` gets, when `left` servers (it included)
    /// may still be tried: what is left of the wait, and an even share of
    /// what is left of the margin, so that a server that hangs leaves time
    /// for the others (the last one gets all that is left).
    fn next_try(&self, now: Instant, left: usize) -> Try {
        let wait = self.wait_until.saturating_duration_since(now);
        let margin = self
            .deadline
            .saturating_duration_since(now.max(self.wait_until));
        let share = u32::try_from(left.max(1)).unwrap_or(u32::MAX);
        Try {
            wait,
            timeout: wait + margin / share,
        }
    }
}

impl Servers {
    /// The servers at `urls` (each `http://` or `https://`; surrounding
    /// white space and empty entries are dropped), in the order of
    /// preference, each sent `api_key` and trusting `ca_cert` as
    /// [`LockClient::new`] says.
    ///
    /// # Errors
    /// [`BadServer::NoServer`] when no URL is left, or the first
    /// [`BadServer`] of [`LockClient::new`].
    pub fn new<S: AsRef<str>>(
        urls: &[S],
        api_key: Option<&str>,
        ca_cert: Option<&Path>,
    ) -> Result<Self, BadServer> {
        let given: Vec<String> = urls
            .iter()
            .map(|u| u.as_ref().trim())
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if given.is_empty() {
            return Err(BadServer::NoServer);
        }
        let clients = given
            .iter()
            .map(|url| LockClient::new(url, api_key, ca_cert))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            clients: clients.into(),
            given: given.into(),
            current: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The URLs as given, comma-separated, in the order of preference: the
    /// value of `LOCKD_SERVER` for a command run under the lock.
    pub fn joined(&self) -> String {
        self.given.join(",")
    }

    /// The server the next call asks first, as [`LockClient::server`]
    /// shows it.
    pub fn current(&self) -> &str {
        self.clients[self.first()].server()
    }

    fn first(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.clients.len()
    }

    /// Makes the next call ask the server after the current one first
    /// (after a stream from the current one was lost: it is going away, or
    /// hangs).
    pub fn pass_over_current(&self) {
        let next = (self.first() + 1) % self.clients.len();
        self.current.store(next, Ordering::Relaxed);
    }

    /// `POST /locks/{name}` ([`LockClient::acquire`]) through the first
    /// usable server. The token is `params.token`, or one chosen here
    /// when `None` (as the server would choose one), so that the acquire
    /// tried again on another server renews the grant a lost answer may
    /// have carried. The whole call takes at most `params.wait_ms` plus
    /// `margin`; a server tried later asks for what is left of the wait.
    ///
    /// # Errors
    /// [`Failure`], with the [`ClientError`] of the last server tried.
    pub async fn acquire<'a>(
        &self,
        target: impl Into<Target<'a>>,
        params: &AcquireParams<'_>,
        margin: Duration,
    ) -> Result<Answered<Lease>, Failure> {
        let target = target.into();
        let generated;
        let token = match params.token {
            Some(token) => token,
            None => {
                generated = Token::generate();
                generated.expose()
            }
        };
        let budget = Budget::new(Duration::from_millis(params.wait_ms), margin);
        self.call(budget, |client, this| {
            let params = AcquireParams {
                token: Some(token),
                wait_ms: u64::try_from(this.wait.as_millis()).unwrap_or(u64::MAX),
                ..params.clone()
            };
            async move { client.acquire(target, &params, this.timeout).await }
        })
        .await
    }

    /// `PATCH /locks/{name}` ([`LockClient::extend`]) through the first
    /// usable server, within `within` in all.
    ///
    /// # Errors
    /// [`Failure`], with the [`ClientError`] of the last server tried.
    pub async fn extend<'a>(
        &self,
        target: impl Into<Target<'a>>,
        token: &str,
        ttl_ms: Option<u64>,
        within: Duration,
    ) -> Result<Answered<Extended>, Failure> {
        let target = target.into();
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.extend(target, token, ttl_ms, this.timeout).await },
        )
        .await
    }

    /// `POST /runs/{key}` ([`LockClient::start_run`]) through the first
    /// usable server, as [`Self::acquire`] takes a lock: under
    /// `params.token`, which must be given, so that a start tried again on
    /// another server renews the attempt a lost answer may have carried.
    ///
    /// # Errors
    /// [`Failure`], with the [`ClientError`] of the last server tried.
    pub async fn start_run(
        &self,
        key: &str,
        params: &AcquireParams<'_>,
        margin: Duration,
    ) -> Result<Answered<RunStart>, Failure> {
        let budget = Budget::new(Duration::from_millis(params.wait_ms), margin);
        self.call(budget, |client, this| {
            let params = AcquireParams {
                wait_ms: u64::try_from(this.wait.as_millis()).unwrap_or(u64::MAX),
                ..params.clone()
            };
            async move { client.start_run(key, &params, this.timeout).await }
        })
        .await
    }

    /// `PUT /runs/{key}/result` ([`LockClient::complete_run`]) through the
    /// first usable server; a completion tried again with the same token
    /// answers the stored run.
    ///
    /// # Errors
    /// [`Failure`], with the [`ClientError`] of the last server tried.
    pub async fn complete_run(
        &self,
        key: &str,
        token: &str,
        result: &serde_json::Value,
        within: Duration,
    ) -> Result<Answered<()>, Failure> {
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.complete_run(key, token, result, this.timeout).await },
        )
        .await
    }

    /// `DELETE /locks/{name}` ([`LockClient::release`]) through the first
    /// usable server, within `within` in all.
    ///
    /// # Errors
    /// [`Failure`], with the [`ClientError`] of the last server tried.
    pub async fn release<'a>(
        &self,
        target: impl Into<Target<'a>>,
        token: &str,
        within: Duration,
    ) -> Result<Answered<()>, Failure> {
        let target = target.into();
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.release(target, token, this.timeout).await },
        )
        .await
    }

    /// `GET /locks/{name}` ([`LockClient::status`]) through the first
    /// usable server, within `within` in all.
    ///
    /// # Errors
    /// [`Failure`], with the [`ClientError`] of the last server tried.
    pub async fn status<'a>(
        &self,
        target: impl Into<Target<'a>>,
        within: Duration,
    ) -> Result<Answered<LockStatus>, Failure> {
        let target = target.into();
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.status(target, this.timeout).await },
        )
        .await
    }

    /// An admin's break of `target` ([`LockClient::break_leases`]) through
    /// the first usable server, within `within` in all.
    ///
    /// # Errors
    /// [`Failure`], as for [`Self::status`].
    pub async fn break_leases(
        &self,
        target: Target<'_>,
        fence: Option<u64>,
        within: Duration,
    ) -> Result<Answered<serde_json::Value>, Failure> {
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.break_leases(target, fence, this.timeout).await },
        )
        .await
    }

    /// The history of `target` ([`LockClient::history`]) through the first
    /// usable server, within `within` in all.
    ///
    /// # Errors
    /// [`Failure`], as for [`Self::status`].
    pub async fn history(
        &self,
        target: Target<'_>,
        within: Duration,
    ) -> Result<Answered<serde_json::Value>, Failure> {
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.history(target, this.timeout).await },
        )
        .await
    }

    /// Opens the watch of `target` on the first server that answers it
    /// (see [`LockClient::open_events`]), each try's answer (status and
    /// headers) within what is left of `within`.
    ///
    /// # Errors
    /// [`Failure`], as for [`Self::status`].
    pub async fn open_events<'a>(
        &self,
        target: impl Into<Target<'a>>,
        within: Duration,
    ) -> Result<Answered<EventStream>, Failure> {
        let target = target.into();
        self.call(
            Budget::new(Duration::ZERO, within),
            |client, this| async move { client.open_events(target, this.timeout).await },
        )
        .await
    }

    /// Sends through one server after another, from the current one, until
    /// one gives an answer that does not [`moves_on`], the servers run out,
    /// or the budget does. The server that answered becomes the current
    /// one.
    async fn call<T, F, Fut>(&self, budget: Budget, mut send: F) -> Result<Answered<T>, Failure>
    where
        F: FnMut(LockClient, Try) -> Fut,
        Fut: Future<Output = Result<Reply<T>, ClientError>>,
    {
        let n = self.clients.len();
        let first = self.first();
        let mut passed_over = Vec::new();
        let mut k = 0;
        loop {
            let i = (first + k) % n;
            let client = &self.clients[i];
            let now = if k == 0 { budget.start } else { Instant::now() };
            let error = match send(client.clone(), budget.next_try(now, n - k)).await {
                Ok(reply) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(Answered { reply, passed_over });
                }
                Err(error) => error,
            };
            let unusable = moves_on(&error);
            let out_of_time = Instant::now() >= budget.deadline;
            if !unusable || k + 1 == n || out_of_time {
                if !unusable {
                    self.current.store(i, Ordering::Relaxed);
                }
                let untried = if unusable {
                    (k + 1..n)
                        .map(|j| self.clients[(first + j) % n].server().to_owned())
                        .collect()
                } else {
                    Vec::new()
                };
                return Err(Failure {
                    error,
                    server: client.server().to_owned(),
                    passed_over,
                    untried,
                    several: n > 1,
                });
            }
            passed_over.push(Passed {
                server: client.server().to_owned(),
                why: why_passed(&error),
            });
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::api::{ProblemInfo, Refusal};

    fn answer(status: u16, slug: &str) -> ClientError {
        let problem = if slug.is_empty() {
            ProblemInfo::default()
        } else {
            ProblemInfo {
                problem_type: format!("urn:lockd:problem:{slug}"),
                detail: "why".into(),
                retry_after_ms: None,
            }
        };
        ClientError::from_refusal(Refusal {
            status: StatusCode::from_u16(status).expect("a status"),
            body: String::new(),
            problem,
        })
    }

    #[test]
    fn only_no_answer_and_gateway_or_unavailable_answers_move_on() {
        let unreachable = ClientError::Unreachable(CallError::Unreachable {
            server: "http://a".into(),
            why: "Connection refused".into(),
        });
        let tls = ClientError::Unreachable(CallError::Tls {
            server: "https://a".into(),
            why: "its certificate could not be verified".into(),
        });
        assert!(moves_on(&unreachable));
        assert!(moves_on(&tls));
        for slug in [
            "backend-unavailable",
            "quorum-unavailable",
            "shutting-down",
            "overloaded",
            "too-many-waiters",
            "timeout",
            "",
        ] {
            assert!(moves_on(&answer(503, slug)), "503 {slug:?}");
        }
        // A proxy's gateway errors, with or without a body lockd knows.
        assert!(moves_on(&answer(502, "")));
        assert!(moves_on(&answer(504, "")));
        // Answers of the lock service stand.
        for (status, slug) in [
            (409, "lock-held"),
            (409, "not-lock-owner"),
            (409, ""),
            (404, "lock-not-held"),
            (404, "route-not-found"),
            (404, ""),
            (400, "invalid-request"),
            (401, "unauthorized"),
            (403, "forbidden"),
            (429, "rate-limited"),
            (500, "backend-error"),
            (500, "internal"),
            (500, ""),
        ] {
            assert!(!moves_on(&answer(status, slug)), "{status} {slug:?}");
        }
        let odd = ClientError::Unexpected {
            status: StatusCode::OK,
            body: "<html>".into(),
            why: "not JSON".into(),
        };
        assert!(!moves_on(&odd));
    }

    #[test]
    fn a_try_gets_the_rest_of_the_wait_and_a_share_of_the_margin() {
        let budget = Budget::new(Duration::from_secs(10), Duration::from_secs(15));
        let start = budget.start;
        // One server: all of it.
        assert_eq!(
            budget.next_try(start, 1),
            Try {
                wait: Duration::from_secs(10),
                timeout: Duration::from_secs(25),
            }
        );
        // The first of three: the whole wait, a third of the margin.
        assert_eq!(
            budget.next_try(start, 3),
            Try {
                wait: Duration::from_secs(10),
                timeout: Duration::from_secs(15),
            }
        );
        // Later, the rest of the wait, and half of the rest of the margin.
        assert_eq!(
            budget.next_try(start + Duration::from_secs(4), 2),
            Try {
                wait: Duration::from_secs(6),
                timeout: Duration::from_secs(6) + Duration::from_millis(7500),
            }
        );
        // Past the wait: no wait asked, a share of what is left.
        assert_eq!(
            budget.next_try(start + Duration::from_secs(21), 2),
            Try {
                wait: Duration::ZERO,
                timeout: Duration::from_secs(2),
            }
        );
        // Past the deadline: nothing.
        assert_eq!(
            budget.next_try(start + Duration::from_secs(30), 1).timeout,
            Duration::ZERO
        );
    }

    #[test]
    fn servers_keep_their_order_and_refuse_an_empty_list() {
        let servers =
            Servers::new(&[" http://a:1 ", "", "https://b:2/lockd"], None, None).expect("valid");
        assert_eq!(servers.joined(), "http://a:1,https://b:2/lockd");
        assert_eq!(servers.current(), "http://a:1");
        assert!(matches!(
            Servers::new(&["", " "], None, None),
            Err(BadServer::NoServer)
        ));
        let empty: [&str; 0] = [];
        assert!(matches!(
            Servers::new(&empty, None, None),
            Err(BadServer::NoServer)
        ));
        // One bad URL spoils the list, and is named.
        let bad = Servers::new(&["http://a:1", "b:2"], None, None).err();
        assert!(
            bad.as_ref()
                .is_some_and(|e| e.to_string().contains("\"b:2\"")),
            "{bad:?}"
        );
    }

    #[test]
    fn a_failure_names_the_servers_passed_over_and_the_one_that_answered() {
        let failure = Failure {
            error: answer(409, "lock-held"),
            server: "http://b".into(),
            passed_over: vec![Passed {
                server: "http://a".into(),
                why: "no answer: Connection refused".into(),
            }],
            untried: vec![],
            several: true,
        };
        assert_eq!(
            failure.to_string(),
            "http://b answered 409 Conflict: why, after passing over http://a (no answer: Connection refused)"
        );
        assert_eq!(failure.who(), "http://b");
        let alone = Failure {
            error: answer(409, "lock-held"),
            server: "http://b".into(),
            passed_over: vec![],
            untried: vec![],
            several: false,
        };
        assert_eq!(alone.to_string(), "409 Conflict: why");
        assert_eq!(alone.who(), "the server");
        assert_eq!(why_passed(&answer(502, "")), "502 Bad Gateway");
        assert_eq!(
            why_passed(&answer(503, "shutting-down")),
            "503 Service Unavailable: why"
        );
    }
}
