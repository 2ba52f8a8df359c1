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
//! - `--redis-client-cert` and `--redis-client-key` give a client
//!   certificate to servers that ask for one (`tls-auth-clients`).
//! - The files are read and checked once, at start-up ([`RedisTls::load`]):
//!   one that cannot be read or parsed, or a key that is not the
//!   certificate's, is a settings error naming the setting.
//! - rustls with the ring provider, as the HTTPS listener: [`client`]
//!   installs it as the process's default provider, which the redis crate
//!   builds its TLS configuration with.
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
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::CertificateError;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::lock::LockError;

/// The TLS material for `rediss://` URLs, read and checked at start-up:
/// the CA certificates to verify servers against (`None`: the system's
/// roots) and the client certificate with its key, all PEM. The default
/// has neither.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// PEM: the CA certificates of `--redis-ca-cert`.
    root_cert: Option<Arc<[u8]>>,
    /// PEM: the client certificate chain and its private key.
    client: Option<ClientPem>,
}

/// A client certificate chain and its private key, PEM.
#[derive(Clone)]
struct ClientPem {
    cert: Arc<[u8]>,
    key: Arc<[u8]>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("root_cert", &self.root_cert.is_some())
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
        let root_cert = ca_cert
            .map(|path| {
                let pem = read(CA_CERT, path)?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(CA_CERT, path, &pem)? {
                    roots.add(cert).map_err(|e| RedisTlsError::Pem {
                        setting: CA_CERT,
                        path: path.to_owned(),
                        why: format!("not a usable CA certificate: {e}"),
                    })?;
                }
                Ok::<_, RedisTlsError>(Arc::from(pem))
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
                        .with_client_auth_cert(chain, private_key)
                })
                .map_err(|source| RedisTlsError::Pair {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    source,
                })?;
                Ok::<_, RedisTlsError>(ClientPem {
                    cert: Arc::from(cert_pem),
                    key: Arc::from(key_pem),
                })
            })
            .transpose()?;
        Ok(Self { root_cert, client })
    }

    /// Whether a CA certificate or a client certificate is set.
    pub fn is_set(&self) -> bool {
        self.root_cert.is_some() || self.client.is_some()
    }

    /// Why a server certificate signed by an unknown CA is refused, for
    /// messages: what lockd trusts.
    pub fn unknown_issuer(&self) -> &'static str {
        if self.root_cert.is_some() {
            "it is not signed by any of the CA certificates of --redis-ca-cert"
        } else {
            "it is not signed by a CA of the system's root certificates (for a private CA, \
             give --redis-ca-cert)"
        }
    }

    /// The redis crate's form of the settings.
    pub fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|pem| ClientTlsConfig {
                client_cert: pem.cert.to_vec(),
                client_key: pem.key.to_vec(),
            }),
            root_cert: self.root_cert.as_ref().map(|pem| pem.to_vec()),
        }
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
/// redis crate builds its TLS configuration with the default provider.
/// Only ring is compiled in, so this is what rustls would pick by itself;
/// installing it says so, and holds should another provider ever come in
/// with a dependency (rustls then has no default of its own).
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

/// The client for one Redis server at `url`: over TLS with `tls` for a
/// `rediss://` URL, plain TCP for a `redis://` one (which ignores `tls`).
/// No connection is opened.
///
/// # Errors
/// [`LockError::Backend`] when the URL cannot be used (the message shows
/// it without its password).
pub fn client(url: &str, tls: &RedisTls) -> Result<redis::Client, LockError> {
    let built = if is_tls(url) {
        install_crypto_provider();
        redis::Client::build_with_tls(url, tls.certificates())
    } else {
        redis::Client::open(url)
    };
    built.map_err(|e| LockError::Backend(format!("cannot use Redis URL {}: {e}", redact_url(url))))
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
             makes by default) and serves as the server's own certificate, which rustls \
             refuses even when it is the very certificate of --redis-ca-cert; make the \
             server's certificate with `-addext basicConstraints=critical,CA:FALSE`, or \
             sign a server certificate with the CA (docs/redis.md, TLS)"
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
