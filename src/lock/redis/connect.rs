//! How lockd reaches Redis: the one place that turns a Redis URL and the
//! TLS settings into a client ([`client`] for one server, [`cluster_client`]
//! for a Redis Cluster's seeds), and that reports a node lockd cannot reach
//! over TLS ([`ConnectReport`]). Every connection lockd opens to Redis (the
//! pool's, the release-event subscriber's, the start-up topology probe's)
//! comes from a client built here.
//!
//! # TLS
//! - A `rediss://` URL is TLS, a `redis://` one plain TCP: each URL is its
//!   own (a Redlock set may mix them); a cluster's seeds share one scheme,
//!   which the nodes discovered from them use too. A `rediss://` URL never
//!   falls back to plain TCP.
//! - The server's certificate is verified, always (the redis crate's
//!   `#insecure` URL fragment is refused when the settings are loaded):
//!   against the system's root certificates (rustls-native-certs), or
//!   against the CA certificates of `--redis-ca-cert` only, when given; the
//!   name checked is the host of the URL (a DNS name or an IP address).
//! - **Pinning.** A server certificate that is exactly one of the
//!   certificates of `--redis-ca-cert` is accepted although it says it is
//!   a CA (`CA:TRUE`, which a plain `openssl req -x509` makes, and which
//!   webpki refuses as a server's own: `CaUsedAsEndEntity`), as OpenSSL
//!   and so `redis-cli --tls --cacert` accept it; its dates and its name
//!   are still checked, and the handshake still proves that the server
//!   holds its key (`Verifier`). The redis crate builds its TLS verifier
//!   itself and takes none of lockd's, so [`Client`] opens the TLS
//!   connection to one server itself (TCP, then tokio-rustls with lockd's
//!   verifier) and hands the stream to the redis crate
//!   (`MultiplexedConnection::new_with_config`, `PubSub::new`). The
//!   connections of a Redis Cluster are the redis crate's own, made by its
//!   cluster client with its verifier: there a `CA:TRUE` server
//!   certificate is refused, pinned or not.
//! - `--redis-client-cert` and `--redis-client-key` give a client
//!   certificate to servers that ask for one (`tls-auth-clients`).
//! - The files are read and checked once, at start-up ([`RedisTls::load`]):
//!   one that cannot be read or parsed, or a key that is not the
//!   certificate's, is a settings error naming the setting.
//! - rustls with the ring provider, as the HTTPS listener: lockd's own TLS
//!   configuration names it, and [`cluster_client`] installs it as the
//!   process's default provider, which the redis crate builds its TLS
//!   configuration with.
//!
//! # Reporting
//! A TLS failure (a server certificate that cannot be verified, a server
//! that refuses lockd's client certificate or wants one, a port that does
//! not speak TLS) is the operator's to fix, and every request that needs
//! the node fails with it (503, as with a node that is down). So it is
//! logged at `error`, naming the node (`host:port`, never a password) and
//! saying what to fix, once per node: again only when the reason changes,
//! or after the node was reached again (which is logged at `info`). The
//! per-request warnings carry the bare error as they do for any
//! unreachable node.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, ConnectionAddr, ConnectionInfo, RedisError,
    RedisResult, TlsCertificates,
};
use rustls::CertificateError;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;

use crate::lock::LockError;

/// The TLS material for `rediss://` URLs, read and checked at start-up:
/// the CA certificates to verify servers against (`None`: the system's
/// roots) and the client certificate with its key. The default has
/// neither.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// The CA certificates of `--redis-ca-cert`.
    ca: Option<CaCerts>,
    /// The client certificate chain and its private key.
    client: Option<ClientIdentity>,
    /// The TLS configuration of lockd's own connections ([`Client`]),
    /// built at the first `rediss://` client and shared by its clones (the
    /// system's roots are read once).
    config: Arc<OnceLock<Result<Arc<rustls::ClientConfig>, String>>>,
}

/// The CA certificates of `--redis-ca-cert`: as PEM, for the redis crate's
/// cluster client, and parsed, the trust anchors and pins of lockd's own
/// connections.
#[derive(Clone)]
struct CaCerts {
    pem: Arc<[u8]>,
    certs: Arc<[CertificateDer<'static>]>,
}

/// A client certificate chain and its private key: as PEM, for the redis
/// crate's cluster client, and parsed, for lockd's own connections.
#[derive(Clone)]
struct ClientIdentity {
    cert_pem: Arc<[u8]>,
    key_pem: Arc<[u8]>,
    chain: Arc<[CertificateDer<'static>]>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("root_cert", &self.ca.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

/// Why a Redis TLS file cannot be used. Each names its setting.
#[derive(Debug, thiserror::Error)]
pub enum RedisTlsError {
    /// A file could not be read.
    #[error("cannot read {setting} {path}: {source}")]
    Read {
        /// `redis_ca_cert (--redis-ca-cert)`, and so on.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind wanted.
    #[error("{setting} {path}: {why}")]
    Pem {
        /// The setting.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the client certificate with its key (for example,
    /// the key is not the certificate's).
    #[error(
        "redis_client_cert (--redis-client-cert) {cert} with redis_client_key \
         (--redis-client-key) {key}: {source}"
    )]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        source: rustls::Error,
    },
}

const CA_CERT: &str = "redis_ca_cert (--redis-ca-cert)";
const CLIENT_CERT: &str = "redis_client_cert (--redis-client-cert)";
const CLIENT_KEY: &str = "redis_client_key (--redis-client-key)";

impl RedisTls {
    /// Reads and checks the files: `ca_cert`, the CA certificates to
    /// verify servers against; `client`, a client certificate chain and its
    /// private key.
    ///
    /// # Errors
    /// [`RedisTlsError`], naming the setting, when a file cannot be read,
    /// holds no certificate (or no key), or the key is not the
    /// certificate's.
    pub fn load(
        ca_cert: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<Self, RedisTlsError> {
        let ca = ca_cert
            .map(|path| {
                let pem = read(CA_CERT, path)?;
                let certs = certificates(CA_CERT, path, &pem)?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in &certs {
                    roots.add(cert.clone()).map_err(|e| RedisTlsError::Pem {
                        setting: CA_CERT,
                        path: path.to_owned(),
                        why: format!("not a usable CA certificate: {e}"),
                    })?;
                }
                Ok::<_, RedisTlsError>(CaCerts {
                    pem: Arc::from(pem),
                    certs: Arc::from(certs),
                })
            })
            .transpose()?;
        let client = client
            .map(|(cert, key)| {
                let cert_pem = read(CLIENT_CERT, cert)?;
                let chain = certificates(CLIENT_CERT, cert, &cert_pem)?;
                let key_pem = read(CLIENT_KEY, key)?;
                let private_key = private_key(key, &key_pem)?;
                // The pair as the TLS connection will use it: rustls checks
                // that the key is the certificate's.
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .and_then(|config| {
                    config
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_client_auth_cert(chain.clone(), private_key.clone_key())
                })
                .map_err(|source| RedisTlsError::Pair {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    source,
                })?;
                Ok::<_, RedisTlsError>(ClientIdentity {
                    cert_pem: Arc::from(cert_pem),
                    key_pem: Arc::from(key_pem),
                    chain: Arc::from(chain),
                    key: Arc::new(private_key),
                })
            })
            .transpose()?;
        Ok(Self {
            ca,
            client,
            config: Arc::default(),
        })
    }

    /// Whether a CA certificate or a client certificate is set.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// Why a server certificate signed by an unknown CA is refused, for
    /// messages: what lockd trusts.
    pub fn unknown_issuer(&self) -> &'static str {
        if self.ca.is_some() {
            "it is not signed by any of the CA certificates of --redis-ca-cert"
        } else {
            "it is not signed by a CA of the system's root certificates (for a private CA, \
             give --redis-ca-cert)"
        }
    }

    /// The redis crate's form of the settings, for its cluster client.
    pub fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|client| ClientTlsConfig {
                client_cert: client.cert_pem.to_vec(),
                client_key: client.key_pem.to_vec(),
            }),
            root_cert: self.ca.as_ref().map(|ca| ca.pem.to_vec()),
        }
    }

    /// The TLS configuration of lockd's own connections: rustls with the
    /// ring provider, TLS 1.2 and 1.3, the client certificate if any, and
    /// [`Verifier`] over the CA certificates or else the system's roots.
    /// Built once, at the first call.
    fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.config
            .get_or_init(|| self.build_client_config().map(Arc::new))
            .clone()
    }

    fn build_client_config(&self) -> Result<rustls::ClientConfig, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = match &self.ca {
            Some(ca) => Verifier::new(&ca.certs, true, &provider)?,
            None => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    let errors: Vec<String> =
                        found.errors.iter().map(ToString::to_string).collect();
                    return Err(format!(
                        "no system root certificate could be read ({}); install the \
                         system's CA certificates (Debian: ca-certificates), or give \
                         --redis-ca-cert",
                        if errors.is_empty() {
                            "none found".to_owned()
                        } else {
                            errors.join("; ")
                        }
                    ));
                }
                Verifier::new(&found.certs, false, &provider)?
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot build the TLS configuration: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        match &self.client {
            Some(client) => builder
                .with_client_auth_cert(client.chain.to_vec(), client.key.clone_key())
                .map_err(|e| format!("{CLIENT_CERT} with {CLIENT_KEY}: {e}")),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The server certificate verifier of lockd's own connections: webpki's
/// (the chain to a trusted CA, the dates, the purpose, the name), except
/// that a certificate webpki refuses only because it says it is a CA
/// (`CaUsedAsEndEntity`) is accepted when it is byte for byte one of the
/// pinned certificates (those of `--redis-ca-cert`) and is issued for the
/// name. webpki checks a certificate's dates before its basic constraints,
/// so an expired pinned certificate is still refused as expired. The
/// handshake's signatures are webpki's to check, with the certificate's
/// key, pinned or not.
#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Arc<[CertificateDer<'static>]>,
}

impl Verifier {
    /// A verifier trusting `roots` (those that parse; at least one must)
    /// and, with `pin`, accepting each of them as a server's own.
    fn new(
        roots: &[CertificateDer<'static>],
        pin: bool,
        provider: &Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, String> {
        let mut store = rustls::RootCertStore::empty();
        let (added, _) = store.add_parsable_certificates(roots.iter().cloned());
        if added == 0 {
            return Err("no usable CA certificate to verify servers against".into());
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
            .build()
            .map_err(|e| format!("cannot build the TLS verifier: {e}"))?;
        Ok(Self {
            webpki,
            pinned: if pin { Arc::from(roots) } else { Arc::from([]) },
        })
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(refused))
                if certificate_kind(&refused) == "CaUsedAsEndEntity"
                    && self
                        .pinned
                        .iter()
                        .any(|pin| pin.as_ref() == end_entity.as_ref()) =>
            {
                let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_name(&parsed, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, RedisTlsError> {
    std::fs::read(path).map_err(|source| RedisTlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file: at least one.
fn certificates(
    setting: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, RedisTlsError> {
    let error = |why: String| RedisTlsError::Pem {
        setting,
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(error(
            "no certificate in it (a PEM \"CERTIFICATE\" block)".into(),
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file.
fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, RedisTlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| RedisTlsError::Pem {
        setting: CLIENT_KEY,
        path: path.to_owned(),
        why: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no private key in it (a PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \
                 \"EC PRIVATE KEY\" block; an encrypted key is not supported)"
                    .to_owned()
            }
            e => format!("not valid PEM: {e}"),
        },
    })
}

/// Installs rustls's ring provider as the process's default, once: the
/// redis crate builds its TLS configuration (a cluster client's) with the
/// default provider. Only ring is compiled in, so this is what rustls
/// would pick by itself; installing it says so, and holds should another
/// provider ever come in with a dependency (rustls then has no default of
/// its own).
fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Err: a provider is installed already (by whoever came first).
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Whether `url` asks for TLS (`rediss://`).
pub fn is_tls(url: &str) -> bool {
    url.get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

/// A client for one Redis server: the redis crate's for a `redis://` URL;
/// for a `rediss://` one, lockd's own TLS connection (see the module
/// documentation) under the redis crate's connection. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    /// The URL's address, credentials, database and protocol; it connects
    /// by itself only over plain TCP.
    redis: redis::Client,
    /// For `rediss://`: how lockd opens the TLS connection.
    tls: Option<Arc<TlsTarget>>,
}

/// Where and how a [`Client`] opens its TLS connections.
struct TlsTarget {
    connector: tokio_rustls::TlsConnector,
    /// The name the server's certificate must be issued for: the URL's
    /// host, a DNS name or an IP address.
    name: ServerName<'static>,
    host: String,
    port: u16,
}

impl TlsTarget {
    /// A TLS connection to the server: the first of its addresses that
    /// accepts TCP (tried side by side, as the redis crate does), then the
    /// handshake. A refused certificate is an `io::Error` holding the
    /// [`rustls::Error`], as the redis crate's own TLS connections give it.
    async fn open(&self) -> RedisResult<tokio_rustls::client::TlsStream<TcpStream>> {
        let addrs: Vec<_> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect();
        if addrs.is_empty() {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "No address found for host",
            )));
        }
        let (tcp, _) = futures_util::future::select_ok(
            addrs.into_iter().map(|a| Box::pin(TcpStream::connect(a))),
        )
        .await?;
        Ok(self.connector.connect(self.name.clone(), tcp).await?)
    }
}

impl Client {
    /// The URL's address (`host:port`) and settings.
    pub fn connection_info(&self) -> &ConnectionInfo {
        self.redis.get_connection_info()
    }

    /// A multiplexed connection whose opening (TCP, TLS and Redis's
    /// handshake) and answers time out after `timeout`.
    ///
    /// # Errors
    /// The redis crate's, or the TLS connection's (as an I/O error).
    pub async fn connect(&self, timeout: Duration) -> RedisResult<Connection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let Some(tls) = &self.tls else {
            let conn = self
                .redis
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            return Ok(Connection {
                conn,
                _driver: None,
            });
        };
        let open = async {
            let stream = tls.open().await?;
            let (conn, driver) = MultiplexedConnection::new_with_config(
                self.connection_info().redis_settings(),
                stream,
                config,
            )
            .await?;
            let driver = Arc::new(Driver(tokio::spawn(driver).abort_handle()));
            Ok(Connection {
                conn,
                _driver: Some(driver),
            })
        };
        tokio::time::timeout(timeout, open)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
    }

    /// A pub/sub connection (no time limit: the caller sets one).
    ///
    /// # Errors
    /// The redis crate's, or the TLS connection's (as an I/O error).
    pub async fn pubsub(&self) -> RedisResult<PubSub> {
        match &self.tls {
            None => self.redis.get_async_pubsub().await,
            Some(tls) => {
                let stream = tls.open().await?;
                PubSub::new(self.connection_info().redis_settings(), stream).await
            }
        }
    }
}

/// A multiplexed connection from a [`Client`] (a `MultiplexedConnection`
/// underneath, which it derefs to). Over lockd's own TLS connection it
/// holds the task that drives it, aborted when the last clone is dropped,
/// as the redis crate does for the connections it opens itself (left to
/// end by itself, the task would wait for the answers in flight: for ever,
/// from a frozen server).
#[derive(Clone)]
pub struct Connection {
    conn: MultiplexedConnection,
    /// Held, not read: the last clone's drop aborts the task.
    _driver: Option<Arc<Driver>>,
}

/// The task driving a connection, aborted on drop.
struct Driver(tokio::task::AbortHandle);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::ops::Deref for Connection {
    type Target = MultiplexedConnection;

    fn deref(&self) -> &MultiplexedConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut MultiplexedConnection {
        &mut self.conn
    }
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// The client for one Redis server at `url`: over TLS with `tls` for a
/// `rediss://` URL, plain TCP for a `redis://` one (which ignores `tls`).
/// No connection is opened.
///
/// # Errors
/// [`LockError::Backend`] when the URL cannot be used (the message shows
/// it without its password), or the TLS configuration cannot be built
/// (no system root certificate to trust, say).
pub fn client(url: &str, tls: &RedisTls) -> Result<Client, LockError> {
    let unusable = |why: &dyn std::fmt::Display| {
        LockError::Backend(format!("cannot use Redis URL {}: {why}", redact_url(url)))
    };
    let redis = redis::Client::open(url).map_err(|e| unusable(&e))?;
    let target = match redis.get_connection_info().addr() {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } => {
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let name = ServerName::try_from(host.clone())
                .map_err(|e| unusable(&format!("{host} is not a DNS name or IP address: {e}")))?;
            Some(Arc::new(TlsTarget {
                connector: tokio_rustls::TlsConnector::from(
                    tls.client_config().map_err(|e| unusable(&e))?,
                ),
                name,
                host,
                port: *port,
            }))
        }
        // Refused with the settings already: never connect without
        // verifying.
        ConnectionAddr::TcpTls { insecure: true, .. } => {
            return Err(unusable(&"#insecure is not supported"));
        }
        _ => None,
    };
    Ok(Client { redis, tls: target })
}

/// Handles what a cluster connection's nodes push (RESP3): sharded pub/sub
/// messages and confirmations, and disconnections. Called on the
/// connection's own task: it must not block.
pub type PushHandler = Arc<dyn Fn(redis::PushInfo) + Send + Sync>;

/// A cluster client over `seeds`, over TLS with `tls` when they are
/// `rediss://` (then so are the connections to the nodes found from them),
/// whose connections and answers time out after `timeout`. It follows
/// `MOVED` and `ASK` and retries `TRYAGAIN` and `CLUSTERDOWN` a few times
/// with short pauses; the operation's own timeout bounds it all. With
/// `push`, its connections speak RESP3 and hand every push to it (for
/// sharded pub/sub); without, RESP2.
///
/// # Errors
/// [`LockError::Backend`] when the seeds cannot be used (such as seeds of
/// both schemes).
pub fn cluster_client(
    seeds: &[String],
    tls: &RedisTls,
    timeout: Duration,
    push: Option<&PushHandler>,
) -> Result<redis::cluster::ClusterClient, LockError> {
    let mut builder = redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(8)
        .min_retry_wait(10)
        .max_retry_wait(200);
    // `certs` turns TLS on: only for TLS seeds.
    if seeds.first().is_some_and(|seed| is_tls(seed)) {
        install_crypto_provider();
        builder = builder.certs(tls.certificates());
    }
    if let Some(push) = push {
        let push = push.clone();
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(move |info| {
                push(info);
                Ok::<(), std::convert::Infallible>(())
            });
    }
    builder.build().map_err(|e| {
        LockError::Backend(format!(
            "cannot use the Redis Cluster seeds {}: {e}",
            seeds
                .iter()
                .map(|s| redact_url(s))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// `url` with its host and port replaced by `addr` (`host:port`): the URL
/// of a node a cluster lists, with the seeds' scheme and credentials.
pub fn with_address(url: &str, addr: &str) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let mut url = url::Url::parse(url).ok()?;
    url.set_host(Some(host)).ok()?;
    url.set_port(Some(port.parse().ok()?)).ok()?;
    Some(url.to_string())
}

/// What went wrong with TLS on a connection: a stable kind (what
/// [`ConnectReport`] compares to tell a new reason) and the sentence to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    /// Stable across attempts (no times, no addresses).
    pub kind: String,
    /// What happened and what to do, for the log.
    pub message: String,
}

/// The TLS failure in `error` (or its sources), if it is one;
/// `unknown_issuer` says why a certificate signed by an unknown CA is
/// refused ([`RedisTls::unknown_issuer`]).
///
/// The failure is read from the [`rustls::Error`] when the error still
/// holds one, or else from its text (the cluster client keeps only the
/// text of its nodes' errors), so that the same failure has the same kind
/// on every path.
pub fn tls_failure(error: &(dyn StdError + 'static), unknown_issuer: &str) -> Option<TlsFailure> {
    if let Some(rustls_error) = find_rustls_error(error) {
        return Some(match rustls_error {
            rustls::Error::InvalidCertificate(cert) => {
                certificate_failure(certificate_kind(cert), &cert.to_string(), unknown_issuer)
            }
            rustls::Error::AlertReceived(alert) => alert_failure(&format!("{alert:?}")),
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                not_tls(&rustls_error.to_string())
            }
            other => TlsFailure {
                kind: "handshake".into(),
                message: format!("the TLS handshake failed: {other}"),
            },
        });
    }
    let text = error.to_string();
    if let Some((_, detail)) = text.split_once("invalid peer certificate: ") {
        return Some(certificate_failure(
            certificate_kind_in(detail),
            detail,
            unknown_issuer,
        ));
    }
    if let Some((_, alert)) = text.split_once("received fatal alert: ") {
        let name: String = alert
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        return Some(alert_failure(&name));
    }
    if let Some(at) = text.find("received corrupt message") {
        return Some(not_tls(&text[at..]));
    }
    None
}

/// The first [`rustls::Error`] in `error` and its sources, looking inside
/// `std::io::Error`s too (tokio-rustls wraps rustls's errors in one, whose
/// `source()` skips the error it holds).
fn find_rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(found) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| find_rustls_error(inner))
        {
            return Some(found);
        }
        if let Some(found) = e
            .downcast_ref::<Arc<dyn StdError + Send + Sync>>()
            .and_then(|inner| find_rustls_error(inner.as_ref()))
        {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// Why a certificate was refused, in a word.
fn certificate_kind(cert: &CertificateError) -> &'static str {
    match cert {
        CertificateError::UnknownIssuer => "UnknownIssuer",
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => "Expired",
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "NotValidYet"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "NotValidForName"
        }
        CertificateError::Revoked => "Revoked",
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "InvalidPurpose"
        }
        // webpki's refusal of a certificate with CA:TRUE as the server's.
        other if format!("{other:?}").contains("CaUsedAsEndEntity") => "CaUsedAsEndEntity",
        _ => "other",
    }
}

/// [`certificate_kind`] from the text rustls shows for the error.
fn certificate_kind_in(detail: &str) -> &'static str {
    [
        ("UnknownIssuer", "UnknownIssuer"),
        ("Expired", "Expired"),
        ("certificate expired", "Expired"),
        ("NotValidYet", "NotValidYet"),
        ("certificate not valid yet", "NotValidYet"),
        ("NotValidForName", "NotValidForName"),
        ("certificate not valid for name", "NotValidForName"),
        ("Revoked", "Revoked"),
        ("InvalidPurpose", "InvalidPurpose"),
        (
            "certificate does not allow extended key usage",
            "InvalidPurpose",
        ),
    ]
    .iter()
    .find(|(shown, _)| detail.starts_with(shown))
    .map_or_else(
        || {
            if detail.contains("CaUsedAsEndEntity") {
                "CaUsedAsEndEntity"
            } else {
                "other"
            }
        },
        |(_, kind)| kind,
    )
}

/// A server certificate refused for `kind`; `detail` is rustls's account.
fn certificate_failure(kind: &str, detail: &str, unknown_issuer: &str) -> TlsFailure {
    let hint = match kind {
        "UnknownIssuer" => unknown_issuer,
        "Expired" => "it has expired",
        "NotValidYet" => "it is not valid yet (check the clocks)",
        "NotValidForName" => "it is not issued for the host name (or IP address) in the URL",
        "Revoked" => "it is revoked",
        "InvalidPurpose" => "it is not a server certificate",
        "CaUsedAsEndEntity" => {
            "it says it is a CA (basicConstraints CA:TRUE, which `openssl req -x509` \
             makes by default) and serves as the server's own certificate, which lockd \
             accepts only when it is exactly one of the certificates of --redis-ca-cert \
             (pinned), and not in cluster mode; give that very certificate as \
             --redis-ca-cert, or make the server's certificate with \
             `-addext basicConstraints=critical,CA:FALSE`, or sign a server certificate \
             with a CA and give the CA (docs/redis.md, TLS)"
        }
        _ => "it is not valid",
    };
    TlsFailure {
        kind: format!("certificate:{kind}"),
        message: format!("the server's certificate could not be verified ({detail}): {hint}"),
    }
}

/// The server ended the handshake with the alert called `name`.
fn alert_failure(name: &str) -> TlsFailure {
    let message = match name {
        "CertificateRequired" => "the server requires a client certificate: give \
                                  --redis-client-cert and --redis-client-key"
            .to_owned(),
        "BadCertificate"
        | "UnknownCA"
        | "CertificateUnknown"
        | "CertificateExpired"
        | "CertificateRevoked"
        | "UnsupportedCertificate"
        | "AccessDenied"
        | "HandshakeFailure" => format!(
            "the server refused the TLS handshake ({name}): if it requires client \
             certificates, give --redis-client-cert and --redis-client-key, with a \
             certificate signed by a CA the server trusts"
        ),
        _ => format!("the server ended the TLS handshake with the alert {name}"),
    };
    TlsFailure {
        kind: format!("alert:{name}"),
        message,
    }
}

/// The server's answer was not TLS (`detail`).
fn not_tls(detail: &str) -> TlsFailure {
    TlsFailure {
        kind: "not-tls".into(),
        message: format!(
            "the server does not speak TLS on this port ({detail}); is it a plain redis:// port?"
        ),
    }
}

/// Reports the TLS failures of one node (a server, or a cluster by its
/// seeds): the first at `error`, again only when the reason changes or
/// after the node was reached again; see the module documentation.
pub struct ConnectReport {
    /// `host:port`, or the cluster's seeds.
    node: String,
    /// Why a certificate signed by an unknown CA is refused.
    unknown_issuer: &'static str,
    /// The kind of the last failure logged; `None` since the last success.
    last: Mutex<Option<String>>,
    /// Whether `last` is set, read first on every success.
    failing: AtomicBool,
}

impl ConnectReport {
    /// The report of `node` (`host:port`, no password), reached with `tls`.
    pub fn new(node: String, tls: &RedisTls) -> Self {
        Self {
            node,
            unknown_issuer: tls.unknown_issuer(),
            last: Mutex::new(None),
            failing: AtomicBool::new(false),
        }
    }

    /// The node, as logged.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Reports `error`, if it is a TLS failure. Returns whether it was one.
    pub fn failed(&self, error: &(dyn StdError + 'static)) -> bool {
        let Some(failure) = tls_failure(error, self.unknown_issuer) else {
            return false;
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(failure.kind.as_str()) {
            tracing::error!(
                node = %self.node,
                "cannot connect to Redis at {} over TLS: {}; lockd never falls back to \
                 plain TCP, so requests that need this node get 503 until this is fixed \
                 (logged again only if the reason changes)",
                self.node,
                failure.message,
            );
            *last = Some(failure.kind);
            self.failing.store(true, Ordering::Relaxed);
        }
        true
    }

    /// Reports a connection that worked: after a failure was logged, says
    /// that the node is reached again.
    pub fn connected(&self) {
        if !self.failing.load(Ordering::Relaxed) {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.take().is_some() {
            self.failing.store(false, Ordering::Relaxed);
            tracing::info!(node = %self.node, "connected to Redis at {} over TLS again", self.node);
        }
    }
}

/// The [`ConnectReport`]s of one application, by node, so that the
/// start-up probe and the backend share each node's (and it logs once).
#[derive(Clone, Default)]
pub struct ConnectReports {
    nodes: Arc<Mutex<HashMap<String, Arc<ConnectReport>>>>,
}

impl ConnectReports {
    /// The report of `node`, made with `tls` the first time.
    pub fn node(&self, node: &str, tls: &RedisTls) -> Arc<ConnectReport> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .entry(node.to_owned())
            .or_insert_with(|| Arc::new(ConnectReport::new(node.to_owned(), tls)))
            .clone()
    }
}

/// A Redis URL with any password replaced by `***`, for logs and errors.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                // Cannot fail: a URL with a password has a host.
                let _ = url.set_password(Some("***"));
            }
            // `?password=...` (or `pass`, `pwd`, `secret`, `token`).
            if url.query().is_some() {
                let pairs: Vec<(String, String)> = url
                    .query_pairs()
                    .map(|(k, v)| {
                        let key = k.to_ascii_lowercase();
                        let secret = ["pass", "pwd", "secret", "token", "auth"]
                            .iter()
                            .any(|word| key.contains(word));
                        let value = if secret { "***".into() } else { v.into_owned() };
                        (k.into_owned(), value)
                    })
                    .collect();
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
            url.to_string()
        }
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

/// `text` with every `redis://` or `rediss://` URL in it passed through
/// [`redact_url`]: for messages that may quote a setting, such as a TOML
/// syntax error showing the line at fault.
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = ["redis://", "rediss://"]
        .iter()
        .filter_map(|scheme| rest.find(scheme))
        .min()
    {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ']' | '`'))
            .unwrap_or(tail.len());
        out.push_str(&redact_url(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::AlertDescription;

    fn io_wrapped(error: rustls::Error) -> redis::RedisError {
        // As tokio-rustls hands a failed handshake over.
        redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::InvalidData, error))
    }

    #[test]
    fn a_certificate_error_inside_a_redis_error_is_found() {
        let error = io_wrapped(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        let failure =
            tls_failure(&error, RedisTls::default().unknown_issuer()).expect("a TLS failure");
        assert_eq!(failure.kind, "certificate:UnknownIssuer");
        assert!(
            failure
                .message
                .contains("certificate could not be verified"),
            "{}",
            failure.message
        );
        assert!(
            failure.message.contains("--redis-ca-cert"),
            "{}",
            failure.message
        );
        let required = io_wrapped(rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired,
        ));
        let failure = tls_failure(&required, "").expect("a TLS failure");
        assert!(
            failure.message.contains("--redis-client-cert"),
            "{}",
            failure.message
        );
    }

    /// The cluster client keeps only the text of an error: read from it,
    /// a failure has the same kind (so it is not logged as a new reason).
    #[test]
    fn a_failure_read_from_text_has_the_kind_of_the_error() {
        let hint = RedisTls::default().unknown_issuer();
        for error in [
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
                time: rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(20)),
                not_after: rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(10)),
            }),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
            rustls::Error::AlertReceived(AlertDescription::UnknownCA),
        ] {
            let structured = tls_failure(&io_wrapped(error.clone()), hint).expect("TLS");
            let text = redis::RedisError::from(std::io::Error::other(format!(
                "Failed to create initial connections - Io: {error}"
            )));
            let from_text = tls_failure(&text, hint).expect("TLS, from the text");
            assert_eq!(structured.kind, from_text.kind, "{error}");
        }
    }

    #[test]
    fn other_errors_are_not_tls_failures() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(tls_failure(&refused, ""), None);
        let report = ConnectReport::new("127.0.0.1:1".into(), &RedisTls::default());
        assert!(!report.failed(&refused));
    }

    #[test]
    fn a_report_logs_a_reason_once_until_it_changes_or_the_node_is_back() {
        let report = ConnectReport::new("127.0.0.1:6380".into(), &RedisTls::default());
        let unknown = io_wrapped(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        assert!(report.failed(&unknown));
        assert_eq!(
            report.last.lock().expect("not poisoned").as_deref(),
            Some("certificate:UnknownIssuer")
        );
        assert!(report.failed(&unknown));
        let expired = io_wrapped(rustls::Error::InvalidCertificate(CertificateError::Expired));
        assert!(report.failed(&expired));
        assert_eq!(
            report.last.lock().expect("not poisoned").as_deref(),
            Some("certificate:Expired")
        );
        report.connected();
        assert_eq!(*report.last.lock().expect("not poisoned"), None);
    }

    /// A self-signed certificate for `names` that says it is a CA
    /// (`CA:TRUE`, as `openssl req -x509` makes), expired with `expired`.
    fn self_signed_ca(names: &[&str], expired: bool) -> CertificateDer<'static> {
        let names = names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let mut params = rcgen::CertificateParams::new(names).expect("parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = rcgen::KeyPair::generate().expect("a key");
        params.self_signed(&key).expect("self-signed").der().clone()
    }

    /// What `verifier` says of `cert` as the server's for `name`: `Ok`,
    /// or the kind of the certificate error.
    fn verdict(verifier: &Verifier, cert: &CertificateDer<'_>, name: &str) -> Result<(), String> {
        let name = ServerName::try_from(name.to_owned()).expect("a server name");
        match verifier.verify_server_cert(cert, &[], &name, &[], UnixTime::now()) {
            Ok(_) => Ok(()),
            Err(rustls::Error::InvalidCertificate(e)) => Err(certificate_kind(&e).to_owned()),
            Err(e) => Err(format!("not a certificate error: {e}")),
        }
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A self-signed `CA:TRUE` certificate of the CA file is accepted as
    /// the server's own, for its names only, and while it is valid; one
    /// not in the file is refused as webpki refuses it.
    #[test]
    fn a_pinned_ca_certificate_is_accepted_as_itself_with_its_name_and_dates_checked() {
        let pinned = self_signed_ca(&["localhost", "127.0.0.1"], false);
        let expired = self_signed_ca(&["localhost"], true);
        let other = self_signed_ca(&["localhost"], false);
        let verifier =
            Verifier::new(&[pinned.clone(), expired.clone()], true, &provider()).expect("verifier");
        assert_eq!(verdict(&verifier, &pinned, "localhost"), Ok(()));
        assert_eq!(verdict(&verifier, &pinned, "127.0.0.1"), Ok(()));
        assert_eq!(
            verdict(&verifier, &pinned, "redis.invalid"),
            Err("NotValidForName".into())
        );
        assert_eq!(
            verdict(&verifier, &expired, "localhost"),
            Err("Expired".into())
        );
        assert_eq!(
            verdict(&verifier, &other, "localhost"),
            Err("CaUsedAsEndEntity".into())
        );
        // The system's roots pin nothing.
        let roots =
            Verifier::new(std::slice::from_ref(&pinned), false, &provider()).expect("verifier");
        assert_eq!(
            verdict(&roots, &pinned, "localhost"),
            Err("CaUsedAsEndEntity".into())
        );
    }

    /// A server certificate that a CA of the file signed is verified as
    /// webpki verifies it: accepted for its name, refused for another.
    #[test]
    fn a_certificate_signed_by_the_ca_is_verified_by_webpki() {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let ca = ca_params.self_signed(&ca_key).expect("CA").der().clone();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("a key");
        let server = rcgen::CertificateParams::new(vec!["redis.internal".to_owned()])
            .expect("parameters")
            .signed_by(&key, &issuer)
            .expect("signed")
            .der()
            .clone();
        let verifier = Verifier::new(&[ca], true, &provider()).expect("verifier");
        assert_eq!(verdict(&verifier, &server, "redis.internal"), Ok(()));
        assert_eq!(
            verdict(&verifier, &server, "redis.invalid"),
            Err("NotValidForName".into())
        );
    }

    #[test]
    fn only_rediss_urls_are_tls() {
        assert!(is_tls("rediss://h:6379"));
        assert!(is_tls("REDISS://h:6379"));
        assert!(!is_tls("redis://h:6379"));
        assert!(!is_tls("unix:///tmp/redis.sock"));
    }

    #[test]
    fn redacted_urls_hide_the_password() {
        let shown = redact_url("redis://user:s3cret@127.0.0.1:6379/0");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("127.0.0.1:6379"));
        assert_eq!(redact_url("not a url"), "<unparsable URL>");
        let query = redact_url("redis://127.0.0.1:6379/0?password=s3cret&protocol=resp3");
        assert!(!query.contains("s3cret"), "{query}");
        assert!(query.contains("protocol=resp3"), "{query}");
    }

    #[test]
    fn urls_quoted_in_a_message_are_redacted() {
        let message =
            "TOML parse error at line 1\n  |\n1 | redis_url = \"redis://:hunter2@h:6379\n  |";
        let shown = redact_urls_in(message);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("TOML parse error"), "{shown}");
        assert_eq!(redact_urls_in("no url here"), "no url here");
    }
}
