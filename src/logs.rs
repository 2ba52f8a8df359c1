//! The log writer: formatted lines are appended to one shared buffer, and
//! a thread of its own writes that buffer out, a batch at a time.
//!
//! Why not a writer per line: tracing-appender's non-blocking writer sends
//! each line over a channel and wakes its thread for it, so under load every
//! access line cost a thread wake-up, a spin of `sched_yield` calls and a
//! `write`: 7 µs of CPU per acquire+release cycle on the writer thread alone
//! (of 74 µs; see docs/performance.md). Here a request's worker only copies
//! its line into the buffer under a mutex; the writer thread is woken once
//! per batch, not per line.
//!
//! - **Latency of a line:** on a quiet server a line is written as soon as
//!   the thread wakes. When the previous batch went out less than
//!   [`BUSY_WITHIN`] ago the thread first waits [`GATHER`] for more lines, so
//!   a busy server writes about one batch per millisecond.
//! - **Lossless:** when [`MAX_BUFFERED_BYTES`] are waiting (the output is
//!   stuck: a full pipe, a slow disk), logging waits for the writer rather
//!   than drop lines, so the access log is complete.
//! - **At exit:** dropping the [`FlushGuard`] writes what is left and stops
//!   the thread.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer thread waits for more lines before writing, when
/// the previous batch went out less than [`BUSY_WITHIN`] ago.
pub const GATHER: Duration = Duration::from_millis(1);

/// A batch written less than this long ago means the server is busy.
pub const BUSY_WITHIN: Duration = Duration::from_millis(10);

/// Bytes waiting to be written above which logging waits for the writer.
pub const MAX_BUFFERED_BYTES: usize = 8 << 20;

/// Capacity the buffers are cut back to after a burst, in bytes.
const KEPT_CAPACITY: usize = 64 << 10;

/// A [`MakeWriter`] for tracing-subscriber's `fmt` layer: each line goes
/// to the shared buffer that [`batched`]'s thread writes out.
#[derive(Clone, Debug)]
pub struct Batched {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, after it has written every line
/// logged before.
#[derive(Debug)]
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when the buffer stops being empty, and at close.
    filled: Condvar,
    /// Signalled when the writer has taken the buffer.
    drained: Condvar,
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<u8>,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves whole lines behind: appending
        // and taking the buffer cannot stop half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts the thread (named `thread_name`) that writes the lines to `out`.
///
/// # Errors
/// When the thread cannot be spawned.
pub fn batched<W>(out: W, thread_name: &str) -> io::Result<(Batched, FlushGuard)>
where
    W: Write + Send + 'static,
{
    let shared = Arc::new(Shared::default());
    let thread = std::thread::Builder::new()
        .name(thread_name.to_owned())
        .spawn({
            let shared = shared.clone();
            move || write_batches(&shared, out)
        })?;
    Ok((
        Batched {
            shared: shared.clone(),
        },
        FlushGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

/// The writer thread: waits for lines, takes them all, writes them.
/// A failed write drops that batch (there is nowhere left to say so).
fn write_batches<W: Write>(shared: &Shared, mut out: W) {
    let mut batch = Vec::new();
    let mut last_write: Option<Instant> = None;
    loop {
        let mut state = shared.lock();
        while state.lines.is_empty() && !state.closed {
            state = shared
                .filled
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.lines.is_empty() {
            // Closed, and everything written.
            return;
        }
        if !state.closed && last_write.is_some_and(|at| at.elapsed() < BUSY_WITHIN) {
            drop(state);
            std::thread::sleep(GATHER);
            state = shared.lock();
        }
        std::mem::swap(&mut state.lines, &mut batch);
        drop(state);
        shared.drained.notify_all();
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        last_write = Some(Instant::now());
        batch.clear();
        batch.shrink_to(KEPT_CAPACITY);
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.filled.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One line's writer; see [`Batched`].
#[derive(Debug)]
pub struct Line<'a> {
    shared: &'a Shared,
}

impl Write for Line<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let mut state = self.shared.lock();
        while state.lines.len() >= MAX_BUFFERED_BYTES && !state.closed {
            state = self
                .shared
                .drained
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let was_empty = state.lines.is_empty();
        state.lines.extend_from_slice(line);
        drop(state);
        if was_empty {
            self.shared.filled.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` into a shared vector, counting the writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut sink = self.0.lock().expect("sink");
            sink.0.extend_from_slice(buf);
            sink.1 += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_guard_is_dropped() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone(), "test-log").expect("thread");
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        let line = format!("{t} {i}\n");
                        writer
                            .make_writer()
                            .write_all(line.as_bytes())
                            .expect("write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        drop(guard);
        let (written, writes) = {
            let sink = sink.0.lock().expect("sink");
            (String::from_utf8(sink.0.clone()).expect("utf-8"), sink.1)
        };
        let mut next = [0; 4];
        for line in written.lines() {
            let (t, i) = line.split_once(' ').expect("whole line");
            let (t, i): (usize, usize) = (t.parse().expect("t"), i.parse().expect("i"));
            assert_eq!(i, next[t], "lines of one thread stay in order");
            next[t] += 1;
        }
        assert_eq!(next, [2_000; 4], "no line lost");
        assert!(writes < 8_000, "lines went out in batches: {writes} writes");
    }

    #[test]
    fn a_line_on_a_quiet_writer_goes_out_at_once() {
        let sink = Sink::default();
        let (writer, _guard) = batched(sink.clone(), "test-log").expect("thread");
        writer.make_writer().write_all(b"one\n").expect("write");
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.0.lock().expect("sink").0.is_empty() {
            assert!(Instant::now() < deadline, "the line was never written");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
