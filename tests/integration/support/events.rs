//! A Server-Sent Events reader for the watch streams
//! (`GET /locks/{name}/events`), as a client would read them: fields
//! `event`, `id` and `data` (JSON), a blank line ending each event, and
//! comment lines (`: ...`) counted apart.

use std::time::Duration;

use serde_json::Value;

use super::TestApp;

/// One event of a stream.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// The `event:` field.
    pub event: String,
    /// The `id:` field.
    pub id: String,
    /// The `data:` field, parsed.
    pub data: Value,
}

impl SseEvent {
    /// The `fence` of `data` (panics without one).
    pub fn fence(&self) -> u64 {
        self.data["fence"]
            .as_u64()
            .unwrap_or_else(|| panic!("no fence in {self:?}"))
    }
}

/// An open stream.
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
    /// Comment lines read so far.
    pub comments: usize,
    /// Whether the server ended the stream.
    pub ended: bool,
}

impl EventStream {
    /// Opens `path` on `app` (200 and `text/event-stream` expected) with
    /// `headers`, through a client without a timeout.
    pub async fn open(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> Self {
        match Self::try_open(app, path, headers).await {
            Ok(stream) => stream,
            Err((status, body)) => panic!("GET {path}: {status} {body}"),
        }
    }

    /// As [`Self::open`], or the status and body of a refusal.
    pub async fn try_open(
        app: &TestApp,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Self, (u16, String)> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("HTTP client");
        let mut request = client.get(app.url(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("GET a stream");
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            return Err((status, body));
        }
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "content type {content_type}"
        );
        Ok(Self {
            response,
            buffer: String::new(),
            comments: 0,
            ended: false,
        })
    }

    /// The next event within `within`, or `None` (none came, or the stream
    /// ended: see [`Self::ended`]).
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(event) = self.parse_one() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return None,
                Ok(Ok(Some(chunk))) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(Ok(None)) | Ok(Err(_)) => self.ended = true,
            }
        }
    }

    /// The next event, which must come within 5 s and be of `kind`.
    #[track_caller]
    pub fn expect<'a>(
        &'a mut self,
        kind: &'a str,
    ) -> impl std::future::Future<Output = SseEvent> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            let event = self
                .next(Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("no `{kind}` event in time (at {caller})"));
            assert_eq!(event.event, kind, "{event:?} (at {caller})");
            event
        }
    }

    /// Reads until the stream ends, within `within`; whether it did.
    pub async fn ends_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while !self.ended {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self.next(left).await;
        }
        true
    }

    /// Takes one whole event off the buffer, counting the comments before
    /// it.
    fn parse_one(&mut self) -> Option<SseEvent> {
        loop {
            let end = self.buffer.find("\n\n")?;
            let block: String = self.buffer.drain(..end + 2).collect();
            let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if line.starts_with(':') {
                    self.comments += 1;
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start().to_owned();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim_start().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if event.is_empty() && data.is_empty() {
                continue;
            }
            let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
            return Some(SseEvent { event, id, data });
        }
    }
}
