//! What wraps every request: a request ID, a tracing span with one access
//! log line, HTTP metrics, and problem documents for errors raised below
//! the handlers (`normalize`).
//!
//! The request ID comes from the client's `x-request-id` header when it is
//! usable (1 to 128 visible ASCII characters), or is a fresh UUID. It is
//! returned in the response's `x-request-id`, named in the request's log
//! lines and given as `request_id` in problem documents.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::Response;
use axum::routing::Route;
use futures_util::future::BoxFuture;
use percent_encoding::percent_decode_str;
use tower_layer::Layer;
use tower_service::Service;
use tracing::field::Empty;
use tracing::{Instrument as _, Level, Span};

use super::access;
use super::problem::{self, Problem};
use crate::metrics::Metrics;

/// The request ID header.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The most characters of a lock name from the path put in the span.
const MAX_LOGGED_NAME: usize = 200;

/// The longest client-chosen request ID kept.
const MAX_REQUEST_ID: usize = 128;

/// What some answers must carry beside the telemetry's own: given a
/// request's path, a function that puts it on the answer (the browser
/// pages' headers, `pages::dress`), or `None`.
pub type Dress = fn(&str) -> Option<fn(&mut Response)>;

/// Puts the telemetry around `app`, with `checks` (the layers every
/// request passes first, [`super::target`] and the body limit) right
/// inside it; `metrics` counts its requests; `dress` is applied to every
/// answer, whatever answered it (a route, a check, the 404 fallback).
///
/// One `Router::layer` for both: axum wraps each route in a boxed `Route`
/// once per `layer` call, and every request (a parked waiter's for as long
/// as it waits) holds each box. So `checks` are applied to each route here,
/// inside the telemetry's service, rather than by layers of their own.
///
/// One layer does it all, in this order: an unusable client `x-request-id`
/// is replaced (`usable_request_id`), the ID set on the request; the
/// span opens and wraps the rest; the request is counted in flight; below
/// it, the answer is normalized; then the HTTP metrics and the access
/// line record it (499 if the client went away), and the ID is copied to
/// the answer. One layer rather than six (tower-http's request-ID and trace
/// layers and three `from_fn` middlewares), each of which cloned its inner
/// service and boxed a future per request: measured in docs/performance.md.
pub fn wrap<L>(app: Router, metrics: Arc<Metrics>, checks: L, dress: Dress) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service:
        Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    app.layer(tower_layer::layer_fn(move |route| Telemetry {
        inner: checks.layer(route),
        metrics: metrics.clone(),
        dress,
    }))
}

/// The service [`wrap`] puts around a router.
#[derive(Clone)]
struct Telemetry<S> {
    inner: S,
    metrics: Arc<Metrics>,
    dress: Dress,
}

impl<S> Service<Request> for Telemetry<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let id = match request.headers().get(X_REQUEST_ID) {
            Some(id) if usable_request_id(id.as_bytes()) => id.clone(),
            _ => fresh_request_id(),
        };
        request.headers_mut().insert(X_REQUEST_ID, id.clone());
        let key = KeySlot::default();
        request.extensions_mut().insert(key.clone());
        let route = request.extensions().get::<MatchedPath>().cloned();
        // The name from the path, percent-decoded as the handler parses it (so
        // `x%3Ay` is logged as `x:y`, the lock it is), here so that a request
        // refused before its handler ran (a token in the URL, a body over the
        // limit) is still found by lock name.
        let name = route
            .as_ref()
            .filter(|r| NAMED.contains(&r.as_str()))
            .and_then(|_| request.uri().path().rsplit('/').next().map(logged_name));
        let mut pending = Pending {
            method: request.method().clone(),
            route,
            name,
            id,
            key,
            started: Instant::now(),
            span: Span::none(),
            answered: false,
            metrics: self.metrics.clone(),
        };
        // A browser page's headers go on every answer under its path,
        // refusals included.
        let dress = (self.dress)(request.uri().path());
        // The span takes the line's first fields; the answer's come later.
        let span = request_span(&pending.line(0, "", None, 0.0));
        pending.span = span.clone();
        pending.metrics.http_in_flight.inc();
        // The service that was made ready goes; a fresh clone stays.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let answer = inner.call(request);
        Box::pin(
            async move {
                let mut pending = pending;
                let Ok(response) = answer.await;
                let mut response = normalize(response, &pending.id);
                if let Some(dress) = dress {
                    dress(&mut response);
                }
                pending.answered(&response);
                response
                    .headers_mut()
                    .entry(X_REQUEST_ID)
                    .or_insert_with(|| pending.id.clone());
                Ok(response)
            }
            .instrument(span),
        )
    }
}

/// The routes whose last path segment is a name the span and the access
/// line give: `lock` on the first, `semaphore` on the second.
const NAMED: [&str; 2] = ["/locks/{name}", "/semaphores/{name}"];

/// Where the API key's id goes once the key check has found it
/// ([`note_key`]), for the access line. [`wrap`]'s layer puts one in each
/// request's extensions.
#[derive(Clone, Debug, Default)]
pub struct KeySlot(Arc<OnceLock<Arc<str>>>);

/// Names the API key `id` in the request's span and access line.
pub fn note_key(request: &Request, id: &Arc<str>) {
    Span::current().record("key", &**id);
    if let Some(KeySlot(slot)) = request.extensions().get::<KeySlot>() {
        let _ = slot.set(id.clone());
    }
}

/// Whether a client's `x-request-id` can be kept: 1 to 128 visible ASCII
/// characters. Another (empty, too long, spaces or control characters) is
/// replaced by a fresh one.
fn usable_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID).contains(&id.len()) && id.iter().all(|c| (0x21..=0x7e).contains(c))
}

/// A fresh request ID: a random (version 4) UUID from the thread's random
/// number generator (`rand::rng()`, a CSPRNG seeded from the system), not
/// from a `getrandom` system call per request as tower-http's
/// `MakeRequestUuid` does (measured: two system calls per lock cycle).
fn fresh_request_id() -> HeaderValue {
    let id = uuid_v4(rand::random());
    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// `bits` as a version 4 UUID (RFC 9562): 122 of its bits, the version
/// and variant set, in the 8-4-4-4-12 hexadecimal form. Written digit by
/// digit: `format!` with five `{:0Nx}` took about 3,300 instructions a
/// request (docs/performance.md).
fn uuid_v4(bits: u128) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let v = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let mut out = String::with_capacity(36);
    for i in 0..32 {
        if matches!(i, 8 | 12 | 16 | 20) {
            out.push('-');
        }
        let nibble = (v >> (124 - 4 * i)) & 0xf;
        out.push(char::from(HEX[nibble as usize]));
    }
    out
}

/// The request's ID, once [`wrap`]'s layer has set it.
pub fn request_id(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
}

/// Turns an error response that is not already a problem document (router
/// 404 and 405, body-limit 413, timeout 503) into one
/// ([`problem::as_problem`]), and writes the request's ID into every
/// problem document.
fn normalize(response: Response, id: &HeaderValue) -> Response {
    let response = problem::as_problem(response);
    match id.to_str() {
        Ok(id) => problem::with_request_id(response, id.to_owned()),
        Err(_) => response,
    }
}

/// The request's span, from the first fields of `line`. It names the
/// method, route template, lock name (`lock`, or `semaphore` on
/// `/semaphores/{name}`), request ID, the API key's id (recorded by the key
/// check), and, once answered, status, result and latency (recorded only
/// when the access line goes through tracing, [`log_through_tracing`]). It
/// never names the query string, a lock token or a secret.
fn request_span(line: &access::Line<'_>) -> Span {
    tracing::info_span!(
        "request",
        method = %line.method,
        route = line.route,
        lock = line.lock,
        semaphore = line.semaphore,
        request_id = line.request_id,
        key = Empty,
        status = Empty,
        result = Empty,
        detail = Empty,
        latency_ms = Empty,
    )
}

/// Writes the access line through tracing: records the answer's fields
/// into the request's span, then logs `answered` in it (target
/// `lockd::access`). What [`access::write`] writes when it has a writer,
/// byte for byte.
fn log_through_tracing(span: &Span, line: &access::Line<'_>) {
    span.record("status", line.status);
    span.record("result", line.result);
    if let Some(detail) = line.detail {
        span.record("detail", detail);
    }
    span.record("latency_ms", line.latency_ms);
    span.in_scope(|| tracing::info!(target: "lockd::access", "answered"));
}

/// A raw path segment as the lock name it stands for: percent-decoded
/// (left raw when that is not UTF-8, which is refused anyway), and cut to
/// [`MAX_LOGGED_NAME`] characters.
fn logged_name(raw: &str) -> String {
    let decoded = percent_decode_str(raw).decode_utf8();
    let name = decoded.as_deref().unwrap_or(raw);
    match name.char_indices().nth(MAX_LOGGED_NAME) {
        Some((end, _)) => name[..end].to_owned(),
        None => name.to_owned(),
    }
}

/// A request being served: counted by method, route template (never the
/// raw path, which would make one series per lock name) and status, timed,
/// counted in flight, and written as the access log line once answered. A
/// request dropped before its answer (the client went away) is counted and
/// logged with status 499, as nginx does.
struct Pending {
    metrics: Arc<Metrics>,
    method: Method,
    route: Option<MatchedPath>,
    /// The name from the path on [`NAMED`] routes.
    name: Option<String>,
    id: HeaderValue,
    key: KeySlot,
    started: Instant,
    span: Span,
    answered: bool,
}

impl Pending {
    fn answered(&mut self, response: &Response) {
        self.answered = true;
        let problem = response.extensions().get::<Problem>();
        let result = problem.map_or("ok", Problem::slug);
        // A client error's detail says what was wrong with the request; it
        // never carries a token. 5xx details stay out of the line (the
        // error itself is logged where it happened).
        let detail = problem
            .filter(|p| (400..500).contains(&p.status))
            .map(|p| mask_quoted(&p.detail));
        self.log(response.status().as_u16(), result, detail.as_deref());
    }

    /// The route's template, or `unmatched`.
    fn route(&self) -> &str {
        self.route.as_ref().map_or("unmatched", MatchedPath::as_str)
    }

    /// The request's access line, answered with `status`, `result`,
    /// `detail`, after `latency_ms`.
    fn line<'a>(
        &'a self,
        status: u16,
        result: &'a str,
        detail: Option<&'a str>,
        latency_ms: f64,
    ) -> access::Line<'a> {
        let route = self.route();
        let name = self.name.as_deref();
        access::Line {
            method: self.method.as_str(),
            route,
            lock: name.filter(|_| route == NAMED[0]),
            semaphore: name.filter(|_| route == NAMED[1]),
            request_id: self.id.to_str().unwrap_or(""),
            key: self.key.0.get().map(|k| &**k),
            status,
            result,
            detail,
            latency_ms,
        }
    }

    fn log(&self, status: u16, result: &str, detail: Option<&str>) {
        let took = self.started.elapsed();
        let status_label = status.to_string();
        self.metrics.observe_http(
            method_label(&self.method),
            self.route(),
            &status_label,
            took,
        );
        // Whole microseconds, shown in milliseconds.
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let line = self.line(status, result, detail, f64::from(micros) / 1000.0);
        self.span.in_scope(|| {
            if tracing::enabled!(target: "lockd::access", Level::INFO) && !access::write(&line) {
                log_through_tracing(&self.span, &line);
            }
        });
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.metrics.http_in_flight.dec();
        if !self.answered {
            self.log(CLIENT_CLOSED, "client-closed", None);
        }
    }
}

/// `detail` with its quoted parts (in `"` or in `` ` ``) masked as `…`: a
/// JSON or query error quotes the value or the field name at fault, and a
/// client may have put a token in the wrong place (even as a field name).
/// The client gets the whole detail; the log does not.
///
/// A quoted value may hold quotes of either kind itself (a field name with
/// a backtick in it), so which quote closes it cannot be told: everything
/// from the first quote to the last is masked, and everything to the end
/// when the quotes are odd in number (one is open). Only the words before
/// the first quote and after the last, lockd's own, are kept.
fn mask_quoted(detail: &str) -> String {
    let is_quote = |c: char| c == '"' || c == '`';
    let (Some(first), Some(last)) = (detail.find(is_quote), detail.rfind(is_quote)) else {
        return detail.to_owned();
    };
    let mut out = String::with_capacity(detail.len());
    out.push_str(&detail[..=first]);
    out.push('…');
    if first < last && detail.matches(is_quote).count() % 2 == 0 {
        out.push_str(&detail[last..]);
    }
    out
}

/// The status counted and logged for a request whose client went away
/// before the answer (nginx's "client closed request").
const CLIENT_CLOSED: u16 = 499;

/// The method as a metric label: the standard methods by name, anything
/// else as `other`, so that a client cannot create series at will.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Mutex;
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::FormatTime;

    /// What tracing-subscriber's `fmt` writes, kept.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("kept").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Kept {
        type Writer = Kept;
        fn make_writer(&'a self) -> Kept {
            self.clone()
        }
    }

    const AT: &str = "2026-12-07T01:40:45.515235Z";

    struct FixedTime;

    impl FormatTime for FixedTime {
        fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
            w.write_str(AT)
        }
    }

    /// The access line as tracing-subscriber's `fmt` writes it, set up as
    /// `lockd serve` sets it up (src/main.rs), the time fixed.
    fn through_tracing(line: &access::Line<'_>, json: bool, ansi: bool) -> String {
        let kept = Kept::default();
        let logs = tracing_subscriber::fmt()
            .with_writer(kept.clone())
            .with_timer(FixedTime)
            .with_ansi(ansi);
        let log = || {
            let span = request_span(line);
            if let Some(key) = line.key {
                span.record("key", key);
            }
            log_through_tracing(&span, line);
        };
        if json {
            let logs = logs.json().with_current_span(true).with_span_list(false);
            tracing::subscriber::with_default(logs.finish(), log);
        } else {
            tracing::subscriber::with_default(logs.finish(), log);
        }
        let written = kept.0.lock().expect("kept").clone();
        String::from_utf8(written).expect("utf-8")
    }

    /// The access line as lockd writes it itself.
    fn by_lockd(line: &access::Line<'_>, json: bool, ansi: bool) -> String {
        let mut out = Vec::new();
        if json {
            line.json(&AT, &mut out);
        } else {
            line.text(
                &AT,
                if ansi { &access::ANSI } else { &access::PLAIN },
                &mut out,
            );
        }
        String::from_utf8(out).expect("utf-8")
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9:/{}_.-]{1,40}",
            any::<String>(),
            r#"[ "\\\n\t\u{1b}\u{7f}é…`]{0,12}"#,
        ]
    }

    proptest! {
        /// lockd's own access line is the line tracing-subscriber would
        /// write for the request's span and event, byte for byte, in both
        /// formats and with colours: quotes, escapes, control characters,
        /// any Unicode, fields present or not.
        #[test]
        fn the_access_line_is_written_as_tracing_would_write_it(
            method in prop_oneof![Just("POST".to_owned()), Just("DELETE".to_owned()), "[A-Z]{1,12}"],
            route in text(),
            name in proptest::option::of(text()),
            semaphore in any::<bool>(),
            request_id in text(),
            key in proptest::option::of(text()),
            status in 100u16..600,
            result in text(),
            detail in proptest::option::of(text()),
            micros in any::<u32>(),
        ) {
            let line = access::Line {
                method: &method,
                route: &route,
                lock: name.as_deref().filter(|_| !semaphore),
                semaphore: name.as_deref().filter(|_| semaphore),
                request_id: &request_id,
                key: key.as_deref(),
                status,
                result: &result,
                detail: detail.as_deref(),
                latency_ms: f64::from(micros) / 1000.0,
            };
            for (json, ansi) in [(false, false), (false, true), (true, false)] {
                prop_assert_eq!(by_lockd(&line, json, ansi), through_tracing(&line, json, ansi));
            }
        }
    }

    proptest! {
        /// Digit by digit, the UUID `format!` would write.
        #[test]
        fn uuid_v4_writes_what_format_would(bits in any::<u128>()) {
            let v = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
            let formatted = format!(
                "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                v >> 96,
                (v >> 80) & 0xffff,
                (v >> 64) & 0xffff,
                (v >> 48) & 0xffff,
                v & 0xffff_ffff_ffff
            );
            prop_assert_eq!(uuid_v4(bits), formatted);
        }
    }

    #[test]
    fn request_ids_are_version_4_uuids() {
        assert_eq!(uuid_v4(0), "00000000-0000-4000-8000-000000000000");
        assert_eq!(uuid_v4(u128::MAX), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        let id = uuid_v4(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(id, "01234567-89ab-4def-8123-456789abcdef");
        let (a, b) = (uuid_v4(rand::random()), uuid_v4(rand::random()));
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
    }

    #[test]
    fn lock_names_are_logged_percent_decoded_and_cut() {
        assert_eq!(logged_name("x%3Ay"), "x:y");
        assert_eq!(logged_name("x:y"), "x:y");
        assert_eq!(logged_name("bad%FF"), "bad%FF");
        let long = "é".repeat(MAX_LOGGED_NAME + 5);
        assert_eq!(logged_name(&long).chars().count(), MAX_LOGGED_NAME);
    }

    #[test]
    fn quoted_values_are_masked() {
        assert_eq!(
            mask_quoted(r#"invalid type: string "s3cret-token", expected u64"#),
            r#"invalid type: string "…", expected u64"#
        );
        assert_eq!(mask_quoted("no quotes"), "no quotes");
        assert_eq!(mask_quoted(r#"a "b" c "d"#), r#"a "…"#);
        assert_eq!(mask_quoted(r#"a "b" c "d" e"#), r#"a "…" e"#);
        assert_eq!(
            mask_quoted("unknown field `s3cret-as-a-name`, expected one of `token`"),
            "unknown field `…`"
        );
        assert_eq!(
            mask_quoted(r#"mode must be "a" or "b", got `c`."#),
            r#"mode must be "…`."#
        );
        // A value in one kind of quote holding two of the other, after
        // lockd's own quoted words of that other kind: no tail leaks.
        assert_eq!(
            mask_quoted(r#"mode "a" got `x"s3cret"tail`"#),
            r#"mode "…`"#
        );
        // A quote inside the value: nothing after it leaks.
        assert_eq!(
            mask_quoted("unknown field `a`s3cret`, expected one of `x`, `y`"),
            "unknown field `…"
        );
        assert_eq!(
            mask_quoted("unknown field `x`s3cret`y`, expected `ttl_ms`"),
            "unknown field `…`"
        );
        assert_eq!(mask_quoted(r#"bad "a"s3cret" value"#), r#"bad "…"#);
    }

    proptest! {
        /// Whatever a client puts between quotes, with quotes of either
        /// kind in it, none of it is in the masked detail.
        #[test]
        fn a_quoted_secret_never_leaks(
            before in prop_oneof![
                "[a-z :,]{0,12}",
                "[a-z ]{0,5}\"[a-z]{1,5}\"[a-z ]{0,5}",
                "[a-z ]{0,5}`[a-z]{1,5}`[a-z ]{0,5}",
            ],
            secret in "[A-Za-z0-9_-]{8,20}",
            around in proptest::collection::vec(prop_oneof![Just("`"), Just("\""), Just("x"), Just(", ")], 0..6),
            quote in prop_oneof![Just('`'), Just('"')],
            after in "[a-z :,`]{0,20}",
        ) {
            let value: String = around.iter().copied().chain([secret.as_str()]).chain(around.iter().copied()).collect();
            let detail = format!("{before}{quote}{value}{quote}{after}");
            let masked = mask_quoted(&detail);
            prop_assert!(!masked.contains(&secret), "{detail} -> {masked}");
        }
    }
}
