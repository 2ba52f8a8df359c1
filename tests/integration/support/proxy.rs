//! A TCP link with faults in front of one server: [`LinkProxy`].

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A TCP proxy on a loopback port in front of one server, to put faults on
/// the link between lockd and that server. Each direction is a delay line:
/// every chunk read is written [`Self::set_delay`] later, in order, so the
/// delay adds latency without limiting throughput. A frozen link holds every
/// byte, in order, until [`Self::thaw`]: a network partition that heals
/// with the data delivered late, which a SIGSTOP of the server cannot make
/// once a command is in flight. Stops on drop.
pub struct LinkProxy {
    port: u16,
    state: Arc<LinkState>,
    accept: JoinHandle<()>,
}

struct LinkState {
    upstream: u16,
    delay_ms: AtomicU64,
    frozen: watch::Sender<bool>,
    /// Freeze the link as soon as the client sends a chunk containing this.
    freeze_on: Mutex<Option<Vec<u8>>>,
    /// Freeze the link as soon as the server sends a chunk containing this.
    freeze_on_answer: Mutex<Option<Vec<u8>>>,
    /// Bumped by [`LinkProxy::cut`]: every link open then ends.
    cuts: watch::Sender<u64>,
    /// While set, a new connection is closed at once ([`LinkProxy::set_down`]).
    down: std::sync::atomic::AtomicBool,
}

impl LinkProxy {
    /// A proxy to `127.0.0.1:<upstream>`, with no delay.
    pub async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(LinkState {
            upstream,
            delay_ms: AtomicU64::new(0),
            frozen: watch::Sender::new(false),
            freeze_on: Mutex::new(None),
            freeze_on_answer: Mutex::new(None),
            cuts: watch::Sender::new(0),
            down: std::sync::atomic::AtomicBool::new(false),
        });
        let accept_state = state.clone();
        let accept = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) ends every link.
            let mut links = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if accept_state.down.load(AtomicOrdering::SeqCst) {
                    drop(client);
                    continue;
                }
                links.spawn(Self::link(client, accept_state.clone()));
                while links.try_join_next().is_some() {}
            }
        });
        Self {
            port,
            state,
            accept,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:<proxy port>`, for a proxy in front of a lockd.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk, in each direction, by `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).expect("delay fits");
        self.state.delay_ms.store(ms, AtomicOrdering::SeqCst);
    }

    /// Freezes the link as soon as the client sends a chunk containing
    /// `needle` (such as `b"EVAL"`, a script call); that chunk is held too.
    pub fn freeze_on(&self, needle: &[u8]) {
        *self.state.freeze_on.lock().unwrap() = Some(needle.to_vec());
    }

    /// Freezes the link as soon as the server sends a chunk containing
    /// `needle` (such as `b"201 Created"`, a lockd's grant); that chunk is
    /// held too: the server did the work, and the client never hears of it.
    pub fn freeze_on_answer(&self, needle: &[u8]) {
        *self.state.freeze_on_answer.lock().unwrap() = Some(needle.to_vec());
    }

    /// Delivers everything held, in order, and lets bytes through again.
    pub fn thaw(&self) {
        *self.state.freeze_on.lock().unwrap() = None;
        *self.state.freeze_on_answer.lock().unwrap() = None;
        self.state.frozen.send_replace(false);
    }

    /// Ends every link open now, in both directions, dropping the bytes it
    /// holds (a connection killed mid-partition); the next connections pass
    /// freely.
    pub fn cut(&self) {
        self.state.cuts.send_modify(|n| *n += 1);
        self.thaw();
    }

    /// While `down`, closes every new connection at once (the server is
    /// unreachable); the links already open are left as they are.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, AtomicOrdering::SeqCst);
    }

    /// Whether the link is frozen (for example because [`Self::freeze_on`]
    /// fired).
    pub fn is_frozen(&self) -> bool {
        *self.state.frozen.borrow()
    }

    async fn link(client: tokio::net::TcpStream, state: Arc<LinkState>) {
        let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", state.upstream)).await else {
            return; // The server is down: the client sees the link close.
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let mut cuts = state.cuts.subscribe();
        cuts.mark_unchanged();
        // A cut drops both pumps, and with them both sockets.
        tokio::select! {
            _ = async {
                tokio::join!(
                    Self::pump(client_read, server_write, state.clone(), true),
                    Self::pump(server_read, client_write, state.clone(), false),
                )
            } => {}
            _ = cuts.changed() => {}
        }
    }

    /// Copies `from` to `to` through the delay line; `to_server` says the
    /// direction (the client's bytes can trigger [`Self::freeze_on`], the
    /// server's [`Self::freeze_on_answer`]).
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        state: Arc<LinkState>,
        to_server: bool,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (tx, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
        let mut frozen = state.frozen.subscribe();
        let writer = async move {
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = to.shutdown().await;
        };
        let reader = async move {
            let mut buf = vec![0_u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let bytes = buf[..n].to_vec();
                {
                    let mut trigger = if to_server {
                        state.freeze_on.lock().unwrap()
                    } else {
                        state.freeze_on_answer.lock().unwrap()
                    };
                    if trigger
                        .as_ref()
                        .is_some_and(|needle| bytes.windows(needle.len()).any(|w| w == needle))
                    {
                        *trigger = None;
                        state.frozen.send_replace(true);
                    }
                }
                let delay = Duration::from_millis(state.delay_ms.load(AtomicOrdering::SeqCst));
                if tx
                    .send((tokio::time::Instant::now() + delay, bytes))
                    .is_err()
                {
                    break;
                }
            }
        };
        tokio::join!(reader, writer);
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
