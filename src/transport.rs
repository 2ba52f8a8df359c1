//! How connections are served: HTTP/1.1 over TCP, or over TLS (rustls with
//! the ring provider, through tokio-rustls), each by hyper's HTTP/1
//! connection with hyper's limits on request heads, and shut down
//! gracefully by hyper-util's [`GracefulShutdown`].
//!
//! - TLS: a PEM certificate chain and key (`--tls-cert`, `--tls-key`),
//!   loaded once at start-up. ALPN offers `http/1.1` only.
//! - HTTP/1.1 only (no HTTP/2, not even with ALPN or prior knowledge): the
//!   limits below are hyper's HTTP/1 ones, and HTTP/2 would get around them.
//! - `--header-read-timeout-ms`: hyper closes a connection whose request
//!   head (request line and headers) is not complete that long after it
//!   began waiting for one: from the connection's start (after the TLS
//!   handshake), or from the previous answer on a keep-alive connection, so
//!   an idle keep-alive connection is closed after that long too. No answer
//!   is sent. Over TLS the handshake gets the same time of its own.
//! - `--max-header-bytes`: hyper's HTTP/1 read buffer (`max_buf_size`). A
//!   request head that does not fit is answered 431 and the connection is
//!   closed. The buffer also holds body bytes as they arrive, which the
//!   handlers drain; it does not limit the body.
//! - `TCP_NODELAY` on every accepted connection: answers are small and
//!   each is written whole, so they go out at once, as Redis does, rather
//!   than wait for Nagle's algorithm.
//! - Every connection (over TLS: its decrypted bytes) is read through
//!   [`framing::watch`], which marks the requests whose target had a
//!   `#fragment`, which hyper would otherwise drop without a trace.
//! - hyper's HTTP/1-only connection, not hyper-util's "auto" one (which
//!   axum-server and `axum::serve` use): its future is the HTTP/1 state
//!   alone, where the auto one carries room for HTTP/2's too, on every
//!   connection, a parked waiter's included (docs/performance.md).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::{ListenSettings, MIN_HEADER_BYTES};
use crate::framing;

/// Why the TLS certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {setting} {path}: {source}")]
    Read {
        /// `tls_cert` or `tls_key`.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM item of the kind wanted.
    #[error("{setting} {path}: {why}")]
    Pem {
        /// `tls_cert` or `tls_key`.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the pair (for example, the key is not the
    /// certificate's).
    #[error("tls_cert {cert} with tls_key {key}: {source}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        source: rustls::Error,
    },
}

/// How the listeners serve their connections; see the module documentation.
#[derive(Clone)]
pub struct Transport {
    /// `None`: plain HTTP.
    tls: Option<TlsAcceptor>,
    /// hyper's HTTP/1 header read timeout, also the TLS handshake timeout.
    header_read_timeout: Duration,
    /// hyper's HTTP/1 read buffer, in bytes.
    max_header_bytes: usize,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("tls", &self.tls.is_some())
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_header_bytes", &self.max_header_bytes)
            .finish()
    }
}

impl Transport {
    /// The transport `settings` ask for, with the certificate and key read
    /// and checked now when TLS is on.
    ///
    /// # Errors
    /// [`TlsError`] when a file cannot be read, holds no certificate or no
    /// key, or the key does not fit the certificate.
    pub fn from_settings(settings: &ListenSettings) -> Result<Self, TlsError> {
        let tls = match &settings.tls {
            Some(files) => Some(TlsAcceptor::from(Arc::new(server_config(
                &files.cert,
                &files.key,
            )?))),
            None => None,
        };
        Ok(Self {
            tls,
            header_read_timeout: settings.header_read_timeout,
            max_header_bytes: settings.max_header_bytes,
        })
    }

    /// Whether connections are served over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The same limits over plain HTTP (for `--metrics-listen`).
    pub fn plain(&self) -> Self {
        Self {
            tls: None,
            ..self.clone()
        }
    }

    /// Serves `router` on `listener` until `stop` is cancelled. Then it
    /// stops accepting at once, closes the idle connections, lets the
    /// requests in flight finish (their connections close after the
    /// answer) and returns when every connection is closed. A connection
    /// still in its TLS handshake is dropped.
    ///
    /// Accept errors are logged and accepting goes on; one that is not the
    /// client's (such as no file descriptor left) pauses it for
    /// [`ACCEPT_PAUSE`] first.
    pub async fn serve(&self, listener: TcpListener, router: Router, stop: CancellationToken) {
        let connections = GracefulShutdown::new();
        let server = Arc::new(Server {
            http: self.http1(),
            tls: self.tls.clone(),
            handshake_timeout: self.header_read_timeout,
            router,
            stop: stop.clone(),
        });
        loop {
            let accepted = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                    let server = server.clone();
                    let watcher = connections.watcher();
                    // Two kinds of task, so that a plain connection's is
                    // not the size of a TLS one's (8.5 kB: rustls's state).
                    match server.tls.clone() {
                        Some(tls) => tokio::spawn(async move {
                            server.tls_connection(&tls, stream, watcher).await;
                        }),
                        None => tokio::spawn(async move { server.requests(stream, watcher).await }),
                    };
                }
                Err(e) if is_the_clients(&e) => {
                    tracing::debug!(error = %e, "connection dropped before it was accepted");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
            }
        }
        drop(listener);
        connections.shutdown().await;
    }

    /// hyper's HTTP/1 connection settings: the head limits.
    fn http1(&self) -> http1::Builder {
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            // hyper panics below its minimum; loading the settings refuses
            // it, and settings edited in code get the minimum.
            .max_buf_size(self.max_header_bytes.max(MIN_HEADER_BYTES));
        http
    }
}

/// How long accepting pauses after an error that is not the client's
/// (such as `EMFILE`), rather than fail again at once in a busy loop.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Whether an accept error concerns only the connection being accepted.
fn is_the_clients(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// What every connection of one listener shares.
struct Server {
    http: http1::Builder,
    tls: Option<TlsAcceptor>,
    handshake_timeout: Duration,
    router: Router,
    stop: CancellationToken,
}

impl Server {
    /// Serves one accepted connection over TLS: the handshake, then its
    /// requests until it closes.
    async fn tls_connection(&self, tls: &TlsAcceptor, stream: TcpStream, watcher: Watcher) {
        let peer = stream.peer_addr().ok();
        let handshake = tokio::time::timeout(self.handshake_timeout, tls.accept(stream));
        let outcome = tokio::select! {
            // A handshake does not hold a shutdown up.
            () = self.stop.cancelled() => return,
            outcome = handshake => outcome,
        };
        match outcome {
            Ok(Ok(stream)) => self.requests(stream, watcher).await,
            // Plain HTTP sent to the HTTPS port, say: the client's business.
            Ok(Err(error)) => {
                tracing::debug!(?peer, %error, "TLS handshake failed; connection dropped");
            }
            Err(_) => tracing::debug!(?peer, "TLS handshake timed out; connection dropped"),
        }
    }

    /// Serves the requests of a connection (its TLS already done).
    async fn requests<I>(&self, io: I, watcher: Watcher)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (io, service) = framing::watch(io, self.router.clone());
        let connection = self
            .http
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        if let Err(error) = watcher.watch(connection).await {
            // A client that went away, a head that timed out or was
            // refused: nothing lockd can act on.
            tracing::debug!(%error, "connection closed with an error");
        }
    }
}

/// Reads the PEM chain at `cert` and the PEM key at `key` into a rustls
/// server configuration (ring; TLS 1.2 and 1.3; ALPN `http/1.1`).
fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let read = |setting: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            setting,
            path: path.to_owned(),
            source,
        })
    };
    let pem_error = |setting: &'static str, path: &Path, why: String| TlsError::Pem {
        setting,
        path: path.to_owned(),
        why,
    };
    let chain = CertificateDer::pem_slice_iter(&read("tls_cert", cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error("tls_cert", cert, format!("not valid PEM: {e}")))?;
    if chain.is_empty() {
        return Err(pem_error(
            "tls_cert",
            cert,
            "no certificate in it (a PEM \"CERTIFICATE\" block)".into(),
        ));
    }
    let private_key = PrivateKeyDer::from_pem_slice(&read("tls_key", key)?).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no private key in it (a PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \
                 \"EC PRIVATE KEY\" block; an encrypted key is not supported)"
                    .to_owned()
            }
            e => format!("not valid PEM: {e}"),
        };
        pem_error("tls_key", key, why)
    })?;
    let config_error = |source| TlsError::Config {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(config_error)?
    .with_no_client_auth()
    .with_single_cert(chain, private_key)
    .map_err(config_error)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
