//! What hyper drops from a request before lockd sees it: a `#fragment` in
//! the request target. The `http` crate cuts a fragment off the URI without
//! a trace, so `GET /locks/a#b` would reach the handlers as `GET /locks/a`.
//! A client never sends a fragment (RFC 9110 §4.2.4 keeps it on the client
//! side), so one that does is confused, or probing, and is refused with 400
//! (see [`crate::http::target`]).
//!
//! [`Watched`] follows the HTTP/1 framing of the bytes hyper reads from a
//! connection (each request head, then its body by `Content-Length` or
//! chunked coding), and notes, for each request head in turn, whether its
//! target had a `#`. [`Flagged`], the connection's service, takes those
//! notes in the same order (hyper serves one request of a connection at a
//! time, and reads a head before it serves it) and marks a request whose
//! target had one with [`FragmentInTarget`].
//!
//! The watcher only looks: it never changes a byte. When the framing is
//! anything it does not follow (an upgrade, a malformed head or chunk,
//! which hyper refuses anyway), it stops watching that connection.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The mark on a request whose target had a `#fragment`.
#[derive(Debug, Clone, Copy)]
pub struct FragmentInTarget;

/// Whether each request head read so far had a fragment, oldest first.
type Notes = Arc<Mutex<VecDeque<bool>>>;

/// Wraps a connection's stream and its service: the stream notes each
/// request head, the service marks the requests.
pub fn watch<S, T>(stream: S, service: T) -> (Watched<S>, Flagged<T>) {
    let notes = Notes::default();
    (
        Watched {
            inner: stream,
            framing: Framing::default(),
            notes: notes.clone(),
        },
        Flagged {
            inner: service,
            notes,
        },
    )
}

/// A connection's stream, read through a `Framing` (which follows its requests).
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    framing: Framing,
    notes: Notes,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let read = &buf.filled()[before..];
            if !read.is_empty() {
                let mut notes = this.notes.lock().unwrap_or_else(PoisonError::into_inner);
                this.framing
                    .feed(read, &mut |fragment| notes.push_back(fragment));
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A connection's service: marks each request whose head had a fragment.
#[derive(Debug, Clone)]
pub struct Flagged<T> {
    inner: T,
    notes: Notes,
}

impl<T, B> tower_service::Service<axum::http::Request<B>> for Flagged<T>
where
    T: tower_service::Service<axum::http::Request<B>>,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = T::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: axum::http::Request<B>) -> Self::Future {
        let fragment = self
            .notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        if fragment == Some(true) {
            request.extensions_mut().insert(FragmentInTarget);
        }
        self.inner.call(request)
    }
}

/// The most bytes of a request head, a chunk-size line or a trailer line
/// followed; hyper refuses far less (`--max-header-bytes`).
const MAX_HEAD: usize = 1 << 20;

/// The most header fields of a head parsed (hyper's own limit is 100).
const MAX_HEADERS: usize = 128;

/// Where in the HTTP/1 framing of a connection's bytes the reader is.
#[derive(Debug)]
enum Framing {
    /// In a request head: its bytes so far.
    Head(Vec<u8>),
    /// In a `Content-Length` body: the bytes left.
    Body(u64),
    /// In a chunk-size line (or the line end after a chunk's data): the
    /// line so far.
    ChunkSize(Vec<u8>),
    /// In a chunk's data: the bytes left.
    ChunkData(u64),
    /// In the trailer section: the current line so far.
    Trailers(Vec<u8>),
    /// Not followed any more.
    Lost,
}

impl Default for Framing {
    fn default() -> Self {
        Self::Head(Vec::new())
    }
}

impl Framing {
    /// Follows `bytes`, calling `note` once for each complete request head
    /// with whether its target had a `#`.
    fn feed(&mut self, mut bytes: &[u8], note: &mut dyn FnMut(bool)) {
        while !bytes.is_empty() {
            match self {
                Self::Lost => return,
                Self::Head(head) => {
                    if head.is_empty() {
                        // Empty lines before a request line are ignored
                        // (RFC 9112 §2.2), by hyper too.
                        let start = bytes
                            .iter()
                            .position(|b| *b != b'\r' && *b != b'\n')
                            .unwrap_or(bytes.len());
                        bytes = &bytes[start..];
                        if bytes.is_empty() {
                            return;
                        }
                    }
                    let old = head.len();
                    // Most heads come in one read: parse them in place.
                    let parsed = if old == 0 {
                        parse_head(bytes)
                    } else {
                        Parsed::Partial
                    };
                    let parsed = match parsed {
                        Parsed::Partial => {
                            head.extend_from_slice(bytes);
                            if old == 0 {
                                Parsed::Partial
                            } else {
                                parse_head(head)
                            }
                        }
                        done => done,
                    };
                    match parsed {
                        Parsed::Partial if head.len() > MAX_HEAD => *self = Self::Lost,
                        Parsed::Partial => return,
                        Parsed::Bad => *self = Self::Lost,
                        Parsed::Complete {
                            len,
                            fragment,
                            body,
                        } => {
                            note(fragment);
                            bytes = &bytes[len.saturating_sub(old)..];
                            *self = body;
                        }
                    }
                }
                Self::Body(left) | Self::ChunkData(left) => {
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    bytes = &bytes[n..];
                    *left -= n as u64;
                    if *left == 0 {
                        *self = match self {
                            Self::Body(_) => Self::default(),
                            _ => Self::ChunkSize(Vec::new()),
                        };
                    }
                }
                Self::ChunkSize(line) | Self::Trailers(line) => {
                    let Some(end) = bytes.iter().position(|b| *b == b'\n') else {
                        line.extend_from_slice(bytes);
                        if line.len() > MAX_HEAD {
                            *self = Self::Lost;
                        }
                        return;
                    };
                    line.extend_from_slice(&bytes[..end]);
                    bytes = &bytes[end + 1..];
                    let blank = line.iter().all(|b| *b == b'\r');
                    *self = match self {
                        // A blank line ends the trailer section, and the
                        // message.
                        Self::Trailers(_) if blank => Self::default(),
                        Self::Trailers(_) => Self::Trailers(Vec::new()),
                        // The line end after a chunk's data.
                        _ if blank => Self::ChunkSize(Vec::new()),
                        Self::ChunkSize(line) => match chunk_size(line) {
                            None => Self::Lost,
                            Some(0) => Self::Trailers(Vec::new()),
                            Some(size) => Self::ChunkData(size),
                        },
                        _ => Self::Lost,
                    };
                }
            }
        }
    }
}

/// What a request head's bytes so far are.
enum Parsed {
    /// Not complete yet.
    Partial,
    /// Not a head that hyper would serve.
    Bad,
    /// A complete head of `len` bytes, whether its target had a fragment,
    /// and what comes after it ([`Framing::Lost`] when that is not
    /// followed).
    Complete {
        len: usize,
        fragment: bool,
        body: Framing,
    },
}

fn parse_head(bytes: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Bad,
    };
    let fragment = request.path.is_some_and(|p| p.contains('#'));
    // After a CONNECT or an upgrade, the bytes may be anything.
    let mut lost = request.method == Some("CONNECT");
    let mut chunked = None;
    let mut length: Option<u64> = None;
    for header in request.headers.iter() {
        let value = header.value;
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides: chunked or not (RFC 9112 §6.3).
            let last = value
                .rsplit(|b| *b == b',')
                .next()
                .map(<[u8]>::trim_ascii)
                .unwrap_or_default();
            chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let Some(n) = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
            else {
                return Parsed::Bad;
            };
            if length.is_some_and(|m| m != n) {
                return Parsed::Bad;
            }
            length = Some(n);
        } else if header.name.eq_ignore_ascii_case("upgrade") {
            lost = true;
        }
    }
    let body = match (chunked, length) {
        _ if lost => Framing::Lost,
        (Some(true), _) => Framing::ChunkSize(Vec::new()),
        // hyper refuses a request whose last coding is not chunked.
        (Some(false), _) => Framing::Lost,
        (None, Some(0) | None) => Framing::default(),
        (None, Some(n)) => Framing::Body(n),
    };
    Parsed::Complete {
        len,
        fragment,
        body,
    }
}

/// The size in a chunk-size line (hex digits, then optional extensions),
/// or `None` when the line has no size.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if digits == 0 || digits > 16 {
        return None;
    }
    let text = std::str::from_utf8(&line[..digits]).ok()?;
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The notes of `input` fed in pieces of `step` bytes.
    fn notes(input: &str, step: usize) -> Vec<bool> {
        let mut framing = Framing::default();
        let mut out = Vec::new();
        for piece in input.as_bytes().chunks(step) {
            framing.feed(piece, &mut |f| out.push(f));
        }
        out
    }

    #[test]
    fn follows_heads_and_bodies_in_any_pieces() {
        let input = "POST /locks/a HTTP/1.1\r\nContent-Length: 26\r\n\r\n\
                     {\"owner\":\"GET /x#y HTTP\"}\n\
                     \r\nPATCH /locks/a#frag HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
                     5;ext=1\r\nGET /\r\nA\r\n#012345678\r\n0\r\nX-T: 1\r\n\r\n\
                     DELETE /locks/b HTTP/1.1\r\n\r\n\
                     GET /healthz?x=1#y HTTP/1.1\r\n\r\n";
        for step in [1, 2, 3, 7, 64, input.len()] {
            assert_eq!(
                notes(input, step),
                [false, true, false, true],
                "in pieces of {step}"
            );
        }
    }

    #[test]
    fn stops_watching_what_it_does_not_follow() {
        let input = "GET /a HTTP/1.1\r\nUpgrade: h2c\r\n\r\nGET /b#c HTTP/1.1\r\n\r\n";
        assert_eq!(notes(input, 5), [false]);
        let input = "POST /a HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nGET /b#c HTTP/1.1\r\n\r\n";
        assert_eq!(notes(input, 5), [false]);
        let input = "GET /a HTTP/1.1\r\nContent-Length: x\r\n\r\nGET /b#c HTTP/1.1\r\n\r\n";
        assert_eq!(notes(input, 5), [] as [bool; 0]);
    }
}
