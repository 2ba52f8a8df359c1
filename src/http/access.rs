//! The access line: one per request, target `lockd::access`, written by
//! lockd itself straight into the log writer ([`crate::logs::Batched`])
//! rather than through tracing-subscriber's `fmt` formatter.
//!
//! The line is the very one that formatter writes for the request's span
//! and its `answered` event (the format documented in docs/operations.md;
//! a unit test in [`super::telemetry`] holds the two to the byte, in both
//! formats). Formatting it through tracing cost about 13 µs of lockd's CPU
//! per acquire+release cycle (docs/performance.md): each field recorded
//! into the span is formatted and appended to the span's text (in JSON, the
//! span's object is parsed and written again), then the event looks the
//! span up and copies it. Here the line is written once, from the values.
//!
//! Set up by [`send_to`] at start-up, in the log's format (with colours on
//! a terminal). Without it, as in tests that run the router in-process,
//! the line goes through tracing's formatter.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::OnceLock;
use std::time::SystemTime;

use serde::Serialize;
use tracing_subscriber::fmt::MakeWriter as _;

use crate::logs::Batched;

/// How access lines are written, as the rest of the log (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// tracing-subscriber's `Full` text format, without colours.
    Text,
    /// The same with its ANSI colours, for a terminal.
    Colour,
    /// tracing-subscriber's JSON format with the current span (`"span"`).
    Json,
}

/// Where access lines go once [`send_to`] has been called.
struct Sink {
    writer: Batched,
    format: Format,
}

static SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    /// The line being written, kept between lines (its capacity reused).
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// From now on, access lines are written by lockd into `writer`, in
/// `format`, whenever the log filter enables target `lockd::access` at
/// `info`. Returns false (and changes nothing) when called before.
pub fn send_to(writer: Batched, format: Format) -> bool {
    SINK.set(Sink { writer, format }).is_ok()
}

/// What the access line of one answered request says: the request span's
/// fields, with `key`, `status`, `result`, `detail` and `latency_ms` as
/// they would have been recorded into it, in that order.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    /// The HTTP method, as sent.
    pub method: &'a str,
    /// The route's template, such as `/locks/{name}`, or `unmatched`.
    pub route: &'a str,
    /// The lock name from the path, on `/locks/{name}`.
    pub lock: Option<&'a str>,
    /// The semaphore name from the path, on `/semaphores/{name}`.
    pub semaphore: Option<&'a str>,
    /// The request's ID.
    pub request_id: &'a str,
    /// The API key's id, once the key check has found the key.
    pub key: Option<&'a str>,
    /// The answer's status (499 when the client went away).
    pub status: u16,
    /// `ok` or the problem's slug.
    pub result: &'a str,
    /// What was wrong with a 4xx request, quotes masked.
    pub detail: Option<&'a str>,
    /// Whole microseconds, in milliseconds.
    pub latency_ms: f64,
}

/// Writes `line` when [`send_to`] has set a writer up: true. False when
/// there is none; the caller logs through tracing instead. Whether the
/// filter enables the line is the caller's to check.
pub fn write(line: &Line<'_>) -> bool {
    let Some(sink) = SINK.get() else {
        return false;
    };
    let at = humantime::format_rfc3339_micros(SystemTime::now());
    LINE.with_borrow_mut(|buf| {
        buf.clear();
        match sink.format {
            Format::Text => line.text(&at, &PLAIN, buf),
            Format::Colour => line.text(&at, &ANSI, buf),
            Format::Json => line.json(&at, buf),
        }
        let _ = sink.writer.make_writer().write_all(buf);
        buf.shrink_to(KEPT_CAPACITY);
    });
    true
}

/// The capacity a thread's line buffer is cut back to after a long line.
const KEPT_CAPACITY: usize = 4 << 10;

impl Line<'_> {
    /// Appends the line in tracing-subscriber's `Full` text format, in
    /// `style` ([`PLAIN`] or its colours, [`ANSI`]), newline included:
    /// `{at}  INFO request{method=POST route="/locks/{name}" lock="a"
    /// request_id="…" status=201 result="ok" latency_ms=1.2}: lockd::access:
    /// answered`. Strings are written with `{:?}`, as its field formatter
    /// writes them.
    pub fn text(&self, at: &dyn std::fmt::Display, style: &Style, out: &mut Vec<u8>) {
        let _ = self.write_text(at, style, out);
    }

    fn write_text(
        &self,
        at: &dyn std::fmt::Display,
        style: &Style,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let &Style {
            bold,
            dim,
            italic,
            green,
            end,
        } = style;
        // The fixed parts are copied; `write!` costs about 130
        // instructions a piece (docs/performance.md).
        let put = |out: &mut Vec<u8>, parts: &[&str]| {
            for part in parts {
                out.extend_from_slice(part.as_bytes());
            }
        };
        let name = |out: &mut Vec<u8>, name: &str| {
            put(out, &[" ", italic, name, end, dim, "=", end]);
        };
        // A string field, left out when absent, as tracing leaves out an
        // `Option` that is `None`.
        let string = |out: &mut Vec<u8>, field: &str, value: Option<&str>| match value {
            Some(value) => {
                name(out, field);
                quoted(out, value)
            }
            None => Ok(()),
        };
        put(out, &[dim]);
        write!(out, "{at}")?;
        put(out, &[end, " ", green, " INFO", end, " "]);
        put(
            out,
            &[bold, "request", end, bold, "{", end, italic, "method"],
        );
        put(out, &[end, dim, "=", end, self.method]);
        string(out, "route", Some(self.route))?;
        string(out, "lock", self.lock)?;
        string(out, "semaphore", self.semaphore)?;
        string(out, "request_id", Some(self.request_id))?;
        string(out, "key", self.key)?;
        name(out, "status");
        write!(out, "{}", self.status)?;
        string(out, "result", Some(self.result))?;
        string(out, "detail", self.detail)?;
        name(out, "latency_ms");
        write!(out, "{:?}", self.latency_ms)?;
        put(out, &[bold, "}", end, dim, ":", end, " "]);
        put(
            out,
            &[dim, "lockd::access", end, dim, ":", end, " answered\n"],
        );
        Ok(())
    }

    /// Appends the line in tracing-subscriber's JSON format with the
    /// current span, newline included: `{"timestamp":…,"level":"INFO",
    /// "fields":{"message":"answered"},"target":"lockd::access",
    /// "span":{…,"name":"request"}}`, the span's fields in the order of
    /// their names, as serde_json's map keeps them. `at` needs no escaping
    /// (an RFC 3339 time).
    pub fn json(&self, at: &dyn std::fmt::Display, out: &mut Vec<u8>) {
        let _ = write!(
            out,
            r#"{{"timestamp":"{at}","level":"INFO","fields":{{"message":"answered"}},"target":"lockd::access","span":"#
        );
        let _ = serde_json::to_writer(
            &mut *out,
            &JsonSpan {
                detail: self.detail,
                key: self.key,
                latency_ms: self.latency_ms,
                lock: self.lock,
                method: self.method,
                request_id: self.request_id,
                result: self.result,
                route: self.route,
                semaphore: self.semaphore,
                status: self.status,
                name: "request",
            },
        );
        out.extend_from_slice(b"}\n");
    }
}

/// `s` as `{:?}` writes a `str`: in double quotes, escaped. Copied as it
/// is when there is nothing to escape (printable ASCII, no `"` or `\`).
fn quoted(out: &mut Vec<u8>, s: &str) -> std::io::Result<()> {
    if s.bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        Ok(())
    } else {
        write!(out, "{s:?}")
    }
}

/// The escape sequences tracing-subscriber's text format writes around
/// each part of a line: none for [`PLAIN`], ANSI's for [`ANSI`].
#[derive(Debug)]
pub struct Style {
    bold: &'static str,
    dim: &'static str,
    italic: &'static str,
    green: &'static str,
    end: &'static str,
}

/// No colours.
pub const PLAIN: Style = Style {
    bold: "",
    dim: "",
    italic: "",
    green: "",
    end: "",
};

/// tracing-subscriber's colours: the time, `=`, `:` and the target dimmed,
/// the span's name and braces bold, field names in italics, `INFO` green.
pub const ANSI: Style = Style {
    bold: "\x1b[1m",
    dim: "\x1b[2m",
    italic: "\x1b[3m",
    green: "\x1b[32m",
    end: "\x1b[0m",
};

/// The span's fields by name, then its name.
#[derive(Serialize)]
struct JsonSpan<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    latency_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    lock: Option<&'a str>,
    method: &'a str,
    request_id: &'a str,
    result: &'a str,
    route: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    semaphore: Option<&'a str>,
    status: u16,
    name: &'a str,
}
