//! `lockd watch NAME`: a lock's (or semaphore's) changes as JSON lines on
//! stdout, for shell scripts. Each line is one event of
//! `GET /locks/{name}/events`: its `data` object with `event` (the kind)
//! and `id` put first, e.g.
//! `{"event":"acquired","id":"17-2","name":"job","fence":17,...}`.
//!
//! When the stream is lost (the server shut down, the network failed),
//! it says so on stderr and connects again, to the next server when
//! several are given, after a pause that doubles from 100 ms up to 5 s; the
//! new stream's first event is a fresh `state`. A refusal that retrying
//! will not cure (400, 401, 403, 404, 501) ends it with the shell
//! subcommands' exit codes. With `--until-free` it exits 0 as soon as an
//! event says the lock is free.

use std::time::Duration;

use serde_json::Value;

use super::api::{ClientError, Target};
use super::args::{WatchArgs, check_name};
use super::exit;
use super::servers::Failure;
use super::shell::error_code;
use crate::backoff::ExponentialBackoff;

/// The pauses between connections: 100 ms doubling up to 5 s.
const RECONNECT: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// How long opening a stream may take, over all servers.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// `lockd watch`.
pub async fn watch(args: WatchArgs) -> u8 {
    if let Err(e) = check_name(&args.name) {
        eprintln!("lockd: {e}");
        return exit::USAGE;
    }
    let servers = match args.server.servers() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lockd: {e}");
            return exit::USAGE;
        }
    };
    let target = Target::new(&args.name, args.semaphore.semaphore);
    let mut pauses = RECONNECT.pauses();
    let mut connected_before = false;
    loop {
        let why = match servers.open_events(target, OPEN_TIMEOUT).await {
            Ok(answered) => {
                let stream = answered.reply.value.0.lock().await.take();
                let Some(response) = stream else { continue };
                if !is_event_stream(&response) {
                    eprintln!(
                        "lockd: {} answered {} without an event stream: is it a lockd with watches (GET /locks/{{name}}/events)?",
                        servers.current(),
                        response.status()
                    );
                    return exit::USAGE;
                }
                if connected_before {
                    eprintln!(
                        "lockd: watching {} again, through {}",
                        args.name,
                        servers.current()
                    );
                }
                connected_before = true;
                let idle = Duration::from_millis(args.idle_timeout_ms);
                match follow(response, args.until_free, idle).await {
                    Ended::Free => return 0,
                    // The pauses start again only after a stream that gave
                    // events: one that ends at once backs off as a refusal.
                    Ended::Lost { why, events } => {
                        if events > 0 {
                            pauses.reset();
                        }
                        // That server is going away, or hangs: the next
                        // one is asked first.
                        servers.pass_over_current();
                        why
                    }
                }
            }
            Err(failure) => match give_up(&failure) {
                Some(code) => {
                    if let Some(answer) = failure.error.refusal() {
                        eprintln!("{}", answer.body);
                    }
                    eprintln!("lockd: {failure}");
                    return code;
                }
                None => failure.to_string(),
            },
        };
        let pause = pauses.next_pause();
        let what = if connected_before {
            "was lost"
        } else {
            "could not be opened"
        };
        eprintln!(
            "lockd: the watch of {} {what} ({why}); connecting again in {} ms",
            args.name,
            pause.as_millis()
        );
        tokio::time::sleep(pause).await;
    }
}

/// The exit code of a failure that retrying will not cure, as the shell
/// subcommands give it ([`error_code`]); `None` for one to retry (no
/// answer, 5xx, 429).
fn give_up(failure: &Failure) -> Option<u8> {
    match &failure.error {
        ClientError::Unavailable { .. }
        | ClientError::ServerError { .. }
        | ClientError::Unreachable(_)
        | ClientError::RateLimited { .. }
        | ClientError::Unexpected { .. } => None,
        // 501: Redlock mode has no watches; retrying will not give one.
        ClientError::Refused { answer } if answer.status.as_u16() == 501 => Some(exit::UNAVAILABLE),
        refused => Some(error_code(refused)),
    }
}

/// How a stream ended.
enum Ended {
    /// `--until-free`, and an event said the lock is free.
    Free,
    /// The stream was lost: why, and how many events it gave.
    Lost {
        /// Why.
        why: String,
        /// Events printed from it.
        events: usize,
    },
}

/// Whether `response` is a Server-Sent Events stream.
fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Prints the events of `response` as JSON lines until it ends, or stays
/// silent for `idle` (a server or a link that hangs).
async fn follow(mut response: reqwest::Response, until_free: bool, idle: Duration) -> Ended {
    let mut parser = Parser::default();
    let mut events = 0;
    loop {
        let Ok(chunk) = tokio::time::timeout(idle, response.chunk()).await else {
            let why = format!(
                "nothing came for {} ms, not even a keep-alive",
                idle.as_millis()
            );
            return Ended::Lost { why, events };
        };
        let chunk = match chunk {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                let why = "the server ended the stream".into();
                return Ended::Lost { why, events };
            }
            Err(e) => {
                // reqwest says "error decoding response body" of a
                // connection cut mid-stream.
                let why = format!("the connection broke: {e}");
                return Ended::Lost { why, events };
            }
        };
        for event in parser.push(&String::from_utf8_lossy(&chunk)) {
            events += 1;
            println!("{}", event.line());
            if until_free && event.says_free() {
                return Ended::Free;
            }
        }
    }
}

/// One Server-Sent Event.
#[derive(Debug, Default, Clone, PartialEq)]
struct SseEvent {
    event: String,
    id: String,
    data: String,
}

impl SseEvent {
    /// The JSON line: `event` and `id`, then the fields of `data` (or
    /// `data` as a string when it is not a JSON object).
    fn line(&self) -> String {
        let head = format!(
            "{{\"event\":{},\"id\":{}",
            Value::from(self.event.as_str()),
            Value::from(self.id.as_str())
        );
        // The server's object as sent (its fields in its order), after
        // `event` and `id`.
        match serde_json::from_str::<Value>(&self.data) {
            Ok(Value::Object(fields)) if fields.is_empty() => format!("{head}}}"),
            Ok(Value::Object(_)) => {
                let data = self.data.trim();
                format!("{head},{}", &data[1..])
            }
            _ => format!("{head},\"data\":{}}}", Value::from(self.data.as_str())),
        }
    }

    /// Whether the event says nobody holds the lock (or any permit).
    fn says_free(&self) -> bool {
        let data: Value = serde_json::from_str(&self.data).unwrap_or_default();
        match self.event.as_str() {
            "state" => data["held"] == Value::Bool(false),
            "released" | "expired" | "broken" => {
                // A semaphore may still have other permits: the next
                // `state`-like answer is not sent, so a lock's end is
                // free, and a semaphore's needs its count.
                data.get("holders").is_none_or(|h| h == &Value::from(0))
            }
            _ => false,
        }
    }
}

/// Splits a byte stream into events (the `text/event-stream` format:
/// `field: value` lines, a blank line ending each event, `:` comments).
#[derive(Debug, Default)]
struct Parser {
    buffer: String,
    current: SseEvent,
}

impl Parser {
    /// Adds `text`; returns the events it completed.
    fn push(&mut self, text: &str) -> Vec<SseEvent> {
        self.buffer.push_str(text);
        let mut done = Vec::new();
        while let Some(end) = self.buffer.find('\n') {
            let line: String = self.buffer.drain(..=end).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                let event = std::mem::take(&mut self.current);
                if !event.event.is_empty() || !event.data.is_empty() {
                    done.push(event);
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.current.event = value.to_owned(),
                "id" => self.current.id = value.to_owned(),
                "data" => {
                    if !self.current.data.is_empty() {
                        self.current.data.push('\n');
                    }
                    self.current.data.push_str(value);
                }
                _ => {}
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_are_parsed_whole() {
        let mut parser = Parser::default();
        assert!(parser.push(": keep-alive\n\nevent: sta").is_empty());
        let events =
            parser.push("te\nid: 0-1\ndata: {\"name\":\"job\",\"held\":false}\n\nevent: acq");
        assert_eq!(
            events,
            vec![SseEvent {
                event: "state".into(),
                id: "0-1".into(),
                data: "{\"name\":\"job\",\"held\":false}".into(),
            }]
        );
        assert_eq!(
            events[0].line(),
            r#"{"event":"state","id":"0-1","name":"job","held":false}"#
        );
        assert!(events[0].says_free());
        let events = parser.push("uired\r\nid: 5-2\r\ndata: {\"fence\":5}\r\n\r\n");
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0].line(),
            r#"{"event":"acquired","id":"5-2","fence":5}"#
        );
        assert!(!events[0].says_free());
    }

    #[test]
    fn an_end_frees_a_lock_but_not_a_semaphore_with_permits_left() {
        let ended = |event: &str, data: &str| SseEvent {
            event: event.into(),
            id: String::new(),
            data: data.into(),
        };
        assert!(ended("released", r#"{"fence":1}"#).says_free());
        assert!(ended("expired", r#"{"fence":1}"#).says_free());
        assert!(ended("broken", r#"{"fence":1,"broken_by":"ops"}"#).says_free());
        assert!(!ended("expired", r#"{"fence":1,"holders":1}"#).says_free());
        assert!(ended("expired", r#"{"fence":1,"holders":0}"#).says_free());
        assert!(!ended("state", r#"{"held":true}"#).says_free());
    }
}
