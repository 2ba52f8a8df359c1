//! TLS to Redis: a private CA made here with rcgen ([`TestCa`]), the
//! certificates it signs ([`IssuedCert`]), a real `redis-server` that
//! speaks TLS only ([`TlsRedisServer`], `--port 0`: no plain port at all),
//! and a Redis Cluster of three of them ([`TlsCluster`], the cluster bus
//! over TLS too), all killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::sentinel::SentinelProcess;
use super::{PREFIX, free_port};

/// A certificate authority of the test's own, with its certificate
/// written as a PEM file.
pub struct TestCa {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    cert: PathBuf,
}

/// A certificate and its private key, as PEM files.
pub struct IssuedCert {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl IssuedCert {
    /// The certificate's path, as a string for a command line.
    pub fn cert(&self) -> &str {
        self.cert.to_str().expect("a UTF-8 path")
    }

    /// The key's path, as a string for a command line.
    pub fn key(&self) -> &str {
        self.key.to_str().expect("a UTF-8 path")
    }

    /// `redis-cli`'s options to reach a TLS server with this certificate
    /// as the client's, trusting any server certificate (`--insecure`).
    pub fn cli_args(&self) -> [&str; 6] {
        [
            "--tls",
            "--insecure",
            "--cert",
            self.cert(),
            "--key",
            self.key(),
        ]
    }
}

/// What a server certificate is like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// Valid, for `127.0.0.1`.
    Good,
    /// For `127.0.0.1`, but expired in 2001.
    Expired,
    /// Valid, but for `redis.invalid` only.
    OtherName,
}

impl TestCa {
    /// A new CA called `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let cert = params.self_signed(&key).expect("a self-signed CA");
        let dir = tempfile::tempdir().expect("temp dir for the CA");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, cert.pem()).expect("write the CA certificate");
        Self {
            dir,
            issuer: Issuer::new(params, key),
            cert: path,
        }
    }

    /// The CA certificate's PEM file.
    pub fn cert(&self) -> &Path {
        &self.cert
    }

    /// The CA certificate's path, as a string for a command line.
    pub fn cert_arg(&self) -> &str {
        self.cert.to_str().expect("a UTF-8 path")
    }

    /// A server certificate signed by this CA.
    pub fn server_cert(&self, kind: ServerCert) -> IssuedCert {
        let names = match kind {
            ServerCert::Good | ServerCert::Expired => vec!["127.0.0.1".to_owned()],
            ServerCert::OtherName => vec!["redis.invalid".to_owned()],
        };
        let mut params = CertificateParams::new(names).expect("server parameters");
        params.distinguished_name.push(DnType::CommonName, "redis");
        // A cluster node shows it to the other nodes as a client too, on
        // the cluster bus.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if kind == ServerCert::Expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        self.issue(&format!("server-{kind:?}"), params)
    }

    /// A client certificate for `name`, signed by this CA.
    pub fn client_cert(&self, name: &str) -> IssuedCert {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(&format!("client-{name}"), params)
    }

    fn issue(&self, file: &str, mut params: CertificateParams) -> IssuedCert {
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let issued = IssuedCert {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("write the certificate");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write the key");
        issued
    }

    /// A self-signed certificate that says it is a CA (`CA:TRUE`, as plain
    /// `openssl req -x509` makes), with no key usage or extended key usage
    /// (neither does openssl), in this CA's directory as `file`.pem and
    /// `file`.key: a server's own and its clients' CA at once. `kind` says
    /// what it is like: for `localhost` and `127.0.0.1`, also expired, or
    /// for `redis.invalid` only.
    pub fn self_signed_ca_as_server(&self, file: &str, kind: ServerCert) -> IssuedCert {
        let names = match kind {
            ServerCert::Good | ServerCert::Expired => {
                vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
            }
            ServerCert::OtherName => vec!["redis.invalid".to_owned()],
        };
        let mut params = CertificateParams::new(names).expect("parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        if kind == ServerCert::Expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("a key");
        let cert = params.self_signed(&key).expect("self-signed");
        let issued = IssuedCert {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("write the certificate");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write the key");
        issued
    }

    /// A file in the CA's directory, for a test's own (broken) files.
    pub fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write a file");
        path
    }
}

/// How long a fresh TLS `redis-server` may take to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A real `redis-server` on a loopback port that speaks TLS only
/// (`--port 0 --tls-port PORT`), without persistence, killed on drop.
/// It trusts `clients_ca` for client certificates, and requires one with
/// `auth_clients`.
pub struct TlsRedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Child,
    /// A client certificate the server trusts, for [`Self::cli`].
    probe: IssuedCert,
}

impl TlsRedisServer {
    /// Starts a server with `cert` on a free port, retrying on a port
    /// collision, and waits until it is ready.
    pub async fn spawn(cert: &IssuedCert, clients_ca: &TestCa, auth_clients: bool) -> Self {
        Self::start(cert, clients_ca, auth_clients, false).await
    }

    /// [`Self::spawn`], as a node of a Redis Cluster yet to be formed
    /// (`--cluster-enabled yes`, the cluster bus over TLS as well).
    async fn spawn_cluster_node(cert: &IssuedCert, clients_ca: &TestCa) -> Self {
        Self::start(cert, clients_ca, false, true).await
    }

    async fn start(
        cert: &IssuedCert,
        clients_ca: &TestCa,
        auth_clients: bool,
        cluster: bool,
    ) -> Self {
        for _ in 0..20 {
            // A cluster node's bus listens 10000 above its port, which must
            // be free too: those tries come from a range of their own, apart
            // from the shared plain cluster's (20000-29999).
            let port = if cluster {
                rand::random_range(30_000..32_700)
            } else {
                free_port()
            };
            let dir = tempfile::tempdir().expect("temp dir for redis-server");
            let log = dir.path().join("redis.log");
            let mut command = Command::new("redis-server");
            if cluster {
                command
                    .args(["--cluster-enabled", "yes", "--tls-cluster", "yes"])
                    .args(["--cluster-config-file", "nodes.conf"])
                    .args(["--cluster-node-timeout", "2000"]);
            }
            let child = command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--tls-cert-file")
                .arg(&cert.cert)
                .arg("--tls-key-file")
                .arg(&cert.key)
                .arg("--tls-ca-cert-file")
                .arg(clients_ca.cert())
                .args([
                    "--tls-auth-clients",
                    if auth_clients { "yes" } else { "no" },
                ])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut server = Self {
                port,
                dir,
                child,
                probe: clients_ca.client_cert("probe"),
            };
            match server.ready().await {
                Ok(()) => return server,
                Err(why) => {
                    eprintln!("TLS redis-server on port {port} failed ({why}); trying another port")
                }
            }
        }
        panic!("could not start a TLS redis-server on any port");
    }

    /// Waits for the log line of a server ready to serve; our own process's
    /// log, so no other server on the port can pass for it.
    async fn ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll redis-server") {
                return Err(format!("exited {status}: {}", self.log_tail(5)));
            }
            if self.log().contains("Ready to accept connections") {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err("not ready in time".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, as lockd names the node.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` over TLS with `args` and returns its output. It
    /// trusts any certificate (`--insecure`), so it reaches servers whose
    /// certificate lockd must refuse, and shows the server's own
    /// certificate a client certificate it trusts.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(self.probe.cli_args())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        assert!(
            out.status.success(),
            "redis-cli {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The token under which lock `name` is held on this server ("" when
    /// nobody holds it).
    pub fn lock_token(&self, name: &str) -> String {
        self.cli(&["GET", &format!("{PREFIX}{{{name}}}")])
    }

    /// The commands this server ran, by name (`INFO commandstats`), before
    /// this `INFO` (which Redis counts once it has run).
    pub fn commands_run(&self) -> Vec<String> {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| l.split(':').next())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a TLS cluster may take to form.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// A Redis Cluster of three TLS-only masters (no replicas), its bus over
/// TLS too, each node with `cert`; made with `redis-cli --cluster create
/// --tls`. Killed on drop.
pub struct TlsCluster {
    nodes: Vec<TlsRedisServer>,
}

impl TlsCluster {
    /// Starts the nodes, joins them, and waits until every node reports
    /// `cluster_state:ok`.
    pub async fn start(cert: &IssuedCert, clients_ca: &TestCa) -> Self {
        let nodes = futures::future::join_all(
            (0..3).map(|_| TlsRedisServer::spawn_cluster_node(cert, clients_ca)),
        )
        .await;
        let addrs: Vec<String> = nodes.iter().map(TlsRedisServer::addr).collect();
        let probe = &nodes[0].probe;
        // `timeout`: redis-cli waits for ever for a cluster that never
        // joins (a certificate the nodes refuse on the bus).
        let created = Command::new("timeout")
            .args(["60", "redis-cli"])
            .args(probe.cli_args())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = Self { nodes };
        let deadline = Instant::now() + FORM_TIMEOUT;
        while !cluster
            .nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the TLS cluster did not form");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster
    }

    /// The nodes' `rediss://` URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TlsRedisServer::url).collect()
    }

    /// The nodes' `127.0.0.1:<port>`.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(TlsRedisServer::addr).collect()
    }

    /// A lock name whose keys live on node `i`: `prefix` and a number.
    pub fn name_on(&self, i: usize, prefix: &str) -> String {
        // The slot ranges node `i` serves, from its own line of CLUSTER NODES.
        let nodes = self.nodes[i].cli(&["CLUSTER", "NODES"]);
        let mine = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .expect("the node's own line");
        let ranges: Vec<(usize, usize)> = mine
            .split_whitespace()
            .skip(8)
            .filter_map(|range| {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        (0..)
            .map(|n| format!("{prefix}{n}"))
            .find(|name| {
                let slot: usize = self.nodes[0]
                    .cli(&["CLUSTER", "KEYSLOT", &format!("{PREFIX}{{{name}}}")])
                    .parse()
                    .expect("CLUSTER KEYSLOT answers a number");
                ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .expect("a name")
    }

    /// The token under which lock `name` is held in the cluster ("" when
    /// nobody holds it), read from the master of its slot.
    pub fn lock_token(&self, name: &str) -> String {
        self.nodes[0].cli(&["-c", "GET", &format!("{PREFIX}{{{name}}}")])
    }
}

/// A `redis-sentinel` that speaks TLS only (`--port 0`), monitoring a TLS
/// master as [`super::MASTER_NAME`] over TLS (`tls-replication yes`), with
/// quorum 1. Killed on drop.
pub struct TlsSentinel {
    sentinel: SentinelProcess,
    /// The client certificate `redis-cli` probes it with (its files must
    /// outlive the Sentinel).
    _probe: IssuedCert,
}

impl TlsSentinel {
    /// Starts a Sentinel with `cert` (its server and client certificate)
    /// watching `master`, and waits until it names the master.
    pub fn start(master: &TlsRedisServer, cert: &IssuedCert, ca: &TestCa) -> Self {
        let probe = ca.client_cert("probe");
        let cli = probe.cli_args().map(str::to_owned).to_vec();
        let sentinel = SentinelProcess::spawn(
            |port, dir| {
                format!(
                    "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                     tls-auth-clients no\ntls-replication yes\n\
                     sentinel monitor {name} 127.0.0.1 {master} 1\n",
                    dir = dir.display(),
                    cert = cert.cert(),
                    key = cert.key(),
                    ca = ca.cert().display(),
                    name = super::MASTER_NAME,
                    master = master.port(),
                )
            },
            cli,
        );
        let deadline = Instant::now() + START_TIMEOUT;
        let wanted = master.port().to_string();
        loop {
            let named = sentinel.cli(&["SENTINEL", "get-master-addr-by-name", super::MASTER_NAME]);
            if named.lines().nth(1).map(str::trim) == Some(wanted.as_str()) {
                return Self {
                    sentinel,
                    _probe: probe,
                };
            }
            assert!(
                Instant::now() < deadline,
                "the TLS Sentinel on {} did not name the master: {named}",
                sentinel.port()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.sentinel.port())
    }

    /// `127.0.0.1:<port>`, as lockd names the node.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.sentinel.port())
    }
}
