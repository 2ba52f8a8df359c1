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
//!   [`BUSY_WITHIN`] ago the thread first waits [`GATHER`] for more lines,
//!   or [`GATHER_BUSY`] when that batch held [`BUSY_BATCH`] bytes or more:
//!   a busy server writes about one batch each 10 ms, a server that logs
//!   a few lines at a time (starting up, say) writes them within 1 ms.
//! - **No line lost to a slow output:** when [`MAX_BUFFERED_BYTES`] are
//!   waiting (a slow disk, a pipe read slowly), logging waits for the
//!   writer rather than drop lines, so the access log is complete.
//! - **A stuck output does not stall lockd:** when a line has waited
//!   [`STUCK_AFTER`] for room and the writer has written nothing meanwhile
//!   (a pipe nobody reads), lines are dropped and counted, at once, until
//!   the writer gets a batch out again; then a line says how many were
//!   dropped. Requests, and a shutdown, go on meanwhile.
//! - **At exit:** dropping the [`FlushGuard`] writes what is left and stops
//!   the thread, waiting at most [`EXIT_FLUSH`] for an output that takes
//!   nothing.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer thread waits for more lines before writing, when
/// the previous batch went out less than [`BUSY_WITHIN`] ago.
pub const GATHER: Duration = Duration::from_millis(1);

/// [`GATHER`] when the previous batch also held [`BUSY_BATCH`] bytes or
/// more (about 4 access lines a millisecond): fewer, larger writes and
/// wake-ups, measured in docs/performance.md.
pub const GATHER_BUSY: Duration = Duration::from_millis(10);

/// The size of a batch, in bytes, from which the server counts as busy.
pub const BUSY_BATCH: usize = 1 << 10;

/// A batch written less than this long ago means the server is busy.
pub const BUSY_WITHIN: Duration = Duration::from_millis(10);

/// Bytes waiting to be written above which logging waits for the writer.
pub const MAX_BUFFERED_BYTES: usize = 8 << 20;

/// How long a line waits for room, with the writer making no progress,
/// before the output is taken as stuck and lines are dropped.
pub const STUCK_AFTER: Duration = Duration::from_secs(1);

/// How long dropping the [`FlushGuard`] waits for the last lines to be
/// written.
pub const EXIT_FLUSH: Duration = Duration::from_secs(2);

/// Capacity the buffers are cut back to after a burst, in bytes.
const KEPT_CAPACITY: usize = 64 << 10;

/// A [`MakeWriter`] for tracing-subscriber's `fmt` layer: each line goes
/// to the shared buffer that [`batched`]'s thread writes out.
#[derive(Clone, Debug)]
pub struct Batched {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, after it has written every line
/// logged before (waiting at most [`EXIT_FLUSH`]).
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
    /// Signalled when the writer has taken the buffer, and when it is done.
    drained: Condvar,
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<u8>,
    closed: bool,
    /// The writer thread has written everything and returned.
    finished: bool,
    /// Counts the batches the writer has taken: progress.
    taken: u64,
    /// The output is stuck: lines are dropped until the writer takes a
    /// batch again.
    stuck: bool,
    /// Lines dropped while stuck, not yet reported.
    dropped: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves whole lines behind: appending
        // and taking the buffer cannot stop half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits on [`Self::drained`] for at most `left`.
    fn wait_drained<'a>(
        &self,
        state: MutexGuard<'a, State>,
        left: Duration,
    ) -> MutexGuard<'a, State> {
        self.drained
            .wait_timeout(state, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0
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
            move || {
                write_batches(&shared, out);
                shared.lock().finished = true;
                shared.drained.notify_all();
            }
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
    // When the last batch went out, and its size in bytes.
    let mut last_write: Option<(Instant, usize)> = None;
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
        let gather = match last_write {
            Some((at, bytes)) if !state.closed && at.elapsed() < BUSY_WITHIN => {
                Some(if bytes >= BUSY_BATCH {
                    GATHER_BUSY
                } else {
                    GATHER
                })
            }
            _ => None,
        };
        if let Some(gather) = gather {
            drop(state);
            std::thread::sleep(gather);
            state = shared.lock();
        }
        std::mem::swap(&mut state.lines, &mut batch);
        state.taken += 1;
        state.stuck = false;
        let dropped = std::mem::take(&mut state.dropped);
        drop(state);
        shared.drained.notify_all();
        let _ = out.write_all(&batch);
        if dropped > 0 {
            let note = format!(
                "lockd: {dropped} log lines dropped: stderr took nothing for {} s\n",
                STUCK_AFTER.as_secs()
            );
            let _ = out.write_all(note.as_bytes());
        }
        let _ = out.flush();
        last_write = Some((Instant::now(), batch.len()));
        batch.clear();
        batch.shrink_to(KEPT_CAPACITY);
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        self.shared.filled.notify_one();
        let deadline = Instant::now() + EXIT_FLUSH;
        while !state.finished {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // The output takes nothing: the thread is left behind.
                return;
            }
            state = self.shared.wait_drained(state, left);
        }
        drop(state);
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
        let mut waited_since: Option<(Instant, u64)> = None;
        while state.lines.len() >= MAX_BUFFERED_BYTES && !state.closed {
            if state.stuck {
                state.dropped += 1;
                return Ok(line.len());
            }
            let (since, taken) = *waited_since.get_or_insert((Instant::now(), state.taken));
            if taken != state.taken {
                // The writer made progress: wait afresh.
                waited_since = None;
                continue;
            }
            let left = STUCK_AFTER.saturating_sub(since.elapsed());
            if left.is_zero() {
                state.stuck = true;
                state.dropped += 1;
                return Ok(line.len());
            }
            state = self.shared.wait_drained(state, left);
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

    /// A `Write` into a shared vector, counting the writes; a shut one
    /// takes nothing until it is opened.
    #[derive(Clone)]
    struct Sink {
        out: Arc<Mutex<(Vec<u8>, usize)>>,
        open: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Sink {
        fn new(open: bool) -> Self {
            Self {
                out: Arc::default(),
                open: Arc::new((Mutex::new(open), Condvar::new())),
            }
        }

        fn open(&self) {
            *self.open.0.lock().expect("gate") = true;
            self.open.1.notify_all();
        }

        fn written(&self) -> String {
            String::from_utf8(self.out.lock().expect("sink").0.clone()).expect("utf-8")
        }
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (open, opened) = &*self.open;
            let mut open = open.lock().expect("gate");
            while !*open {
                open = opened.wait(open).expect("gate");
            }
            drop(open);
            let mut sink = self.out.lock().expect("sink");
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
        let sink = Sink::new(true);
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
            let out = sink.out.lock().expect("sink");
            (String::from_utf8(out.0.clone()).expect("utf-8"), out.1)
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
    fn a_stuck_output_drops_and_counts_lines_rather_than_stall_the_logger() {
        let sink = Sink::new(false);
        let (writer, guard) = batched(sink.clone(), "test-log").expect("thread");
        let line = [b'x'; 1023];
        let line = [&line[..], b"\n"].concat();
        // The first line is taken, and the writer is stuck on it.
        writer.make_writer().write_all(&line).expect("write");
        while writer.shared.lock().taken == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        // 8 MiB wait, then the output is stuck: the rest is dropped.
        let lines = MAX_BUFFERED_BYTES / line.len() + 200;
        for _ in 1..lines {
            writer.make_writer().write_all(&line).expect("write");
        }
        assert!(
            started.elapsed() < STUCK_AFTER * 3,
            "logging stalled for {:?}",
            started.elapsed()
        );
        sink.open();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sink.written().contains("dropped") {
            assert!(Instant::now() < deadline, "the writer never caught up");
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.make_writer().write_all(b"after\n").expect("write");
        drop(guard);
        let written = sink.written();
        let kept = written.lines().filter(|l| l.starts_with('x')).count();
        let note = written
            .lines()
            .find(|l| l.contains("log lines dropped"))
            .expect("a line says how many were dropped");
        let dropped: usize = note
            .trim_start_matches("lockd: ")
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a count");
        assert!(dropped > 0);
        assert_eq!(kept + dropped, lines, "every line kept or counted");
        assert!(written.ends_with("after\n"), "logging resumed");
    }

    #[test]
    fn dropping_the_guard_does_not_wait_for_ever_on_a_stuck_output() {
        let (writer, guard) = batched(Sink::new(false), "test-log").expect("thread");
        writer
            .make_writer()
            .write_all(b"never written\n")
            .expect("write");
        let started = Instant::now();
        drop(guard);
        assert!(
            started.elapsed() < EXIT_FLUSH * 2,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_line_on_a_quiet_writer_goes_out_at_once() {
        let sink = Sink::new(true);
        let (writer, _guard) = batched(sink.clone(), "test-log").expect("thread");
        writer.make_writer().write_all(b"one\n").expect("write");
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.written().is_empty() {
            assert!(Instant::now() < deadline, "the line was never written");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
