//! HTTP answers as tests look at them: [`Reply`].

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An HTTP answer, body read as text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    /// Reads a whole answer; `Err` when the body does not arrive.
    pub async fn read(response: reqwest::Response) -> Result<Self, reqwest::Error> {
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await?;
        Ok(Self {
            status,
            headers,
            text,
        })
    }

    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| {
            panic!(
                "body of a {} is not JSON ({e}): {:?}",
                self.status, self.text
            )
        })
    }

    /// A string member of the JSON body.
    pub fn str(&self, field: &str) -> String {
        self.json()[field]
            .as_str()
            .unwrap_or_else(|| panic!("no string `{field}` in {}", self.text))
            .to_owned()
    }

    /// An integer member of the JSON body.
    pub fn u64(&self, field: &str) -> u64 {
        self.json()[field]
            .as_u64()
            .unwrap_or_else(|| panic!("no integer `{field}` in {}", self.text))
    }

    /// The token of a grant.
    pub fn token(&self) -> String {
        self.str("token")
    }

    /// The fence of a grant, extend or inspect answer.
    pub fn fence(&self) -> u64 {
        self.u64("fence")
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    }

    /// Asserts the status, with the body in the message.
    #[track_caller]
    pub fn expect_status(&self, status: u16) -> &Self {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.text
        );
        self
    }

    /// Asserts that this is an RFC 9457 problem document with `status` and
    /// `urn:lockd:problem:<slug>`, with a title, a detail and the request
    /// id, and returns it.
    #[track_caller]
    pub fn expect_problem(&self, status: u16, slug: &str) -> Value {
        self.expect_status(status);
        let content_type = self.header("content-type").unwrap_or_default();
        assert!(
            content_type.starts_with(PROBLEM_JSON),
            "content-type {content_type:?} is not {PROBLEM_JSON}; body: {}",
            self.text
        );
        let body = self.json();
        assert_eq!(
            body["type"],
            format!("urn:lockd:problem:{slug}"),
            "{}",
            self.text
        );
        assert_eq!(body["status"], status, "{}", self.text);
        for member in ["title", "detail"] {
            assert!(
                body[member].as_str().is_some_and(|s| !s.is_empty()),
                "problem without `{member}`: {}",
                self.text
            );
        }
        assert!(
            body["request_id"].is_string(),
            "problem without `request_id`: {}",
            self.text
        );
        body
    }
}
