//! How connections are served: HTTP/1.1 over TCP, or over TLS (rustls with
//! the ring provider), through `axum-server` and hyper, with hyper's limits
//! on request heads.
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

use std::fmt;
use std::future::{Ready, ready};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum_server::Handle;
use axum_server::accept::Accept;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use futures_util::TryFutureExt as _;
use futures_util::future::MapOk;
use hyper_util::rt::TokioTimer;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

use crate::config::{ListenSettings, MIN_HEADER_BYTES};
use crate::framing::{self, Flagged, Watched};

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
    tls: Option<RustlsConfig>,
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
            Some(files) => Some(RustlsConfig::from_config(Arc::new(server_config(
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

    /// Serves `router` on `listener` until `handle` shuts the server down:
    /// after [`Handle::graceful_shutdown`] it stops accepting at once, lets
    /// the requests in flight finish and returns when every connection is
    /// closed.
    ///
    /// # Errors
    /// When the listener cannot be handed over to the server.
    pub async fn serve(
        &self,
        listener: TcpListener,
        router: Router,
        handle: Handle<SocketAddr>,
    ) -> io::Result<()> {
        let server = axum_server::from_tcp(listener.into_std()?)?;
        let service = router.into_make_service();
        match &self.tls {
            None => {
                self.configure(server.acceptor(Watch(NoDelay)), handle)
                    .serve(service)
                    .await
            }
            Some(tls) => {
                let acceptor = RustlsAcceptor::new(tls.clone())
                    .handshake_timeout(self.header_read_timeout)
                    .acceptor(NoDelay);
                self.configure(server.acceptor(Watch(acceptor)), handle)
                    .serve(service)
                    .await
            }
        }
    }

    /// HTTP/1.1 only, with the head limits, `handle`, and accept errors
    /// logged.
    fn configure<A>(
        &self,
        server: axum_server::Server<SocketAddr, A>,
        handle: Handle<SocketAddr>,
    ) -> axum_server::Server<SocketAddr, A> {
        let mut server = server.http1_only().handle(handle);
        server
            .http_builder()
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            // hyper panics below its minimum; loading the settings refuses
            // it, and settings edited in code get the minimum.
            .max_buf_size(self.max_header_bytes.max(MIN_HEADER_BYTES));
        server.accept_error_handler(|peer, error| match peer {
            // A TLS handshake that failed or timed out (such as plain HTTP
            // sent to the HTTPS port): the client's business.
            Some(peer) => {
                tracing::debug!(%peer, %error, "connection dropped before its first request")
            }
            None => tracing::warn!(%error, "cannot accept a connection"),
        })
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

/// An acceptor that sets `TCP_NODELAY` on each accepted connection; a
/// socket that refuses is served anyway (the option only saves latency).
#[derive(Debug, Clone, Copy)]
struct NoDelay;

impl<S> Accept<TcpStream, S> for NoDelay {
    type Stream = TcpStream;
    type Service = S;
    type Future = Ready<io::Result<(TcpStream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        ready(Ok((stream, service)))
    }
}

/// An acceptor that reads each connection `A` accepted through
/// [`framing::watch`].
#[derive(Debug, Clone, Copy)]
struct Watch<A>(A);

/// What [`Watch`] makes of an accepted connection.
type Watching<I, S> = (Watched<I>, Flagged<S>);

/// How [`Watch`] makes it.
type WatchFn<I, S> = fn((I, S)) -> Watching<I, S>;

impl<A, S> Accept<TcpStream, S> for Watch<A>
where
    A: Accept<TcpStream, S>,
{
    type Stream = Watched<A::Stream>;
    type Service = Flagged<A::Service>;
    type Future = MapOk<A::Future, fn((A::Stream, A::Service)) -> Watching<A::Stream, A::Service>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let watch: WatchFn<A::Stream, A::Service> =
            |(stream, service)| framing::watch(stream, service);
        self.0.accept(stream, service).map_ok(watch)
    }
}
