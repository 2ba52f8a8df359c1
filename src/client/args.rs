//! Flags of the client subcommands: `exec`, `acquire`, `extend`, `release`
//! and `status`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::api::{BadServer, Target};
use super::exit;
use super::servers::Servers;

/// Where the lockd servers are, how to trust their certificates, and the
/// API key to show them. `Debug` hides the key.
#[derive(Clone, Args)]
pub struct ServerArg {
    /// A lockd server's base URL (http:// or https://). Give it more than
    /// once (or comma-separated, as in LOCKD_SERVER) for several servers in
    /// front of the same store, in the order of preference: a call moves on
    /// to the next one when a server does not answer, or answers 502, 503
    /// or 504.
    #[arg(
        long,
        env = "LOCKD_SERVER",
        value_name = "URL",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: Vec<String>,
    /// A PEM file of CA certificates to trust for an https:// server, on
    /// top of the system's (for a private CA or a self-signed server
    /// certificate).
    #[arg(long, env = "LOCKD_CA_CERT", value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,
    /// The API key's secret, for a server with API keys (sent as
    /// `Authorization: Bearer`). Prefer the environment variable: a flag
    /// shows in `ps`.
    #[arg(long, env = "LOCKD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl ServerArg {
    /// The servers, to call.
    ///
    /// # Errors
    /// [`BadServer`] when no URL is given, one is unusable, or so are the
    /// key or the CA certificates.
    pub fn servers(&self) -> Result<Servers, BadServer> {
        Servers::new(
            &self.server,
            self.api_key.as_deref(),
            self.ca_cert.as_deref(),
        )
    }
}

impl std::fmt::Debug for ServerArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerArg")
            .field("server", &self.server)
            .field("ca_cert", &self.ca_cert)
            .field("api_key", &self.api_key.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// A flag's milliseconds: a whole number, 0 or more, no sign or unit.
/// (Flags that take them also take a leading `-`, so that `--ttl-ms -1` is
/// told what a value must be rather than read as a flag.)
///
/// # Errors
/// The rule, for any other text.
pub fn millis(text: &str) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(
            "a whole number of milliseconds is needed: digits only, no sign or unit".into(),
        );
    }
    text.parse()
        .map_err(|_| format!("at most {} milliseconds", u64::MAX))
}

/// A `--meta` flag's holder metadata: a JSON object, as text.
///
/// # Errors
/// The rule, for text that is not a JSON object (the server checks its
/// size, `--max-meta-bytes`).
pub fn meta_object(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(r#"a JSON object is needed, as {"host":"web-1"}"#.into()),
        Err(e) => Err(format!(
            r#"not JSON ({e}): a JSON object is needed, as {{"host":"web-1"}}"#
        )),
    }
}

/// `lockd exec [OPTIONS] NAME -- CMD [ARGS...]`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// Lease length in ms, renewed at a third of it while the command runs
    /// [default: the server's default TTL].
    #[arg(long, allow_negative_numbers = true, value_parser = millis)]
    pub ttl_ms: Option<u64>,
    /// How long to wait for the lock when another holder has it, in ms; 0
    /// fails at once.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = millis)]
    pub wait_ms: u64,
    /// A label for the holder, shown by `lockd status` [default: hostname:pid].
    #[arg(long)]
    pub owner: Option<String>,
    /// Holder metadata, a JSON object shown by `lockd status`, listings and
    /// watches [default: {"host": HOSTNAME, "pid": PID}].
    #[arg(long, value_name = "JSON", value_parser = meta_object)]
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
    /// After the lease is lost, how long the command gets between SIGTERM
    /// and SIGKILL, in ms.
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true, value_parser = millis)]
    pub kill_grace_ms: u64,
    /// Run the command in lockd's own process group, so that it can read
    /// from the terminal; signals then reach the command only, not the
    /// processes it started.
    #[arg(long)]
    pub foreground: bool,
    /// Say nothing when the lock is not granted (for cron, which mails any
    /// output); only the exit code tells.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Exit code when the lock is not granted within --wait-ms (as flock -E).
    #[arg(long, default_value_t = exit::CONFLICT)]
    pub conflict_exit_code: u8,
    #[command(flatten)]
    pub semaphore: SemaphoreArg,
    /// NAME is a run's key: run the command once per key, across every
    /// host. Not done yet: run it under the run's attempt (renewed as a
    /// lock's lease); exit 0 stores {"exit_code": 0} as the result, another
    /// exit abandons the attempt, so a later run tries again. Done already:
    /// say when on stderr, do not run it, exit 0. In progress elsewhere:
    /// exit --conflict-exit-code (75), or with --wait-ms wait for it.
    #[arg(long, conflicts_with = "semaphore")]
    pub once: bool,
    /// Hold a shared lease of the lock, as `flock -s`: any number of
    /// `--shared` holders run at once, while no exclusive holder does; a
    /// waiting exclusive `lockd exec` keeps new shared ones out until it
    /// has run.
    #[arg(long, conflicts_with_all = ["semaphore", "once"])]
    pub shared: bool,
    /// The lock to hold (with --semaphore: the semaphore to hold a permit
    /// of; with --once: the run's key, such as report:2026-12-02).
    pub name: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `--semaphore` and `--limit`: hold a permit of a semaphore rather than
/// a lock.
#[derive(Debug, Clone, Copy, Args)]
pub struct SemaphoreArg {
    /// NAME is a semaphore: take one of its permits (at most --limit
    /// holders at once, each permit a lease) rather than a lock.
    #[arg(long, requires = "limit")]
    pub semaphore: bool,
    /// With --semaphore: the most holders at once, from 1 to the server's
    /// --max-semaphore-limit (default 10000). The first permit sets it;
    /// while permits are held, another limit is refused.
    #[arg(long, requires = "semaphore", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
}

/// `--semaphore` alone, for the calls that name a semaphore without a
/// limit (extend, release, status).
#[derive(Debug, Clone, Copy, Args)]
pub struct SemaphoreFlag {
    /// NAME is a semaphore: act on its permit (or, for status, list its
    /// permits) rather than on a lock. `lockd exec --semaphore` sets
    /// LOCKD_SEMAPHORE=1 for its command.
    /// LOCKD_SEMAPHORE takes 1/0, true/false, yes/no, on/off; empty is
    /// off.
    #[arg(
        long,
        env = "LOCKD_SEMAPHORE",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub semaphore: bool,
}

/// `lockd acquire NAME`.
#[derive(Debug, Args)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock to take (with --semaphore: the semaphore to take a permit
    /// of).
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub semaphore: SemaphoreArg,
    /// Take a shared lease of the lock (many holders at once, no exclusive
    /// one) rather than an exclusive one. Extend and release it as any
    /// lease, by its token.
    #[arg(long, conflicts_with = "semaphore")]
    pub shared: bool,
    /// Lease length in ms [default: the server's default TTL].
    #[arg(long, allow_negative_numbers = true, value_parser = millis)]
    pub ttl_ms: Option<u64>,
    /// How long the server may wait for a held lock, in ms; 0 fails at once.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = millis)]
    pub wait_ms: u64,
    /// A label for the holder.
    #[arg(long)]
    pub owner: Option<String>,
    /// Holder metadata: a JSON object, shown by `lockd status`.
    #[arg(long, value_name = "JSON", value_parser = meta_object)]
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
    /// A token of your choosing (16 to 128 of A-Za-z0-9_-), so that a retry
    /// after a lost answer renews instead of failing [default: 192 random
    /// bits, chosen here so that a retry on the next server renews too]. It
    /// may start with `-`.
    #[arg(long, allow_hyphen_values = true)]
    pub token: Option<String>,
}

/// `lockd run ACTION KEY`: one call on a run, as the lock subcommands are.
#[derive(Debug, clap::Subcommand)]
pub enum RunCommand {
    /// Start the run's attempt, or get its result when it is done (exit
    /// 0 both ways: the answer's `state` says `running` or `done`); 75
    /// while another attempt runs it.
    Start(RunStartArgs),
    /// Complete the run whose attempt --token holds, storing --result.
    Complete(RunCompleteArgs),
    /// Abandon the attempt --token holds (the job failed): a later start
    /// runs it again.
    Abandon(RunTokenArgs),
    /// Extend the attempt --token holds.
    Extend(RunExtendArgs),
    /// Show where the run stands (exit 1 when it is unknown).
    Status(RunKeyArgs),
}

impl RunCommand {
    /// The run's key the command names.
    pub fn key(&self) -> &str {
        match self {
            Self::Start(args) => &args.key,
            Self::Complete(args) => &args.key,
            Self::Abandon(args) => &args.key,
            Self::Extend(args) => &args.key,
            Self::Status(args) => &args.key,
        }
    }
}

/// `lockd run start KEY`.
#[derive(Debug, Args)]
pub struct RunStartArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The run's key (a delivery id, an event id, a cron slot).
    pub key: String,
    /// The attempt's lease in ms [default: the server's default TTL].
    #[arg(long, allow_negative_numbers = true, value_parser = millis)]
    pub ttl_ms: Option<u64>,
    /// How long the server may wait while another attempt runs, in ms.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = millis)]
    pub wait_ms: u64,
    /// A label for the attempt's holder.
    #[arg(long)]
    pub owner: Option<String>,
    /// The attempt's holder metadata: a JSON object.
    #[arg(long, value_name = "JSON", value_parser = meta_object)]
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
    /// A fingerprint of the job's input (a hash of the payload): another
    /// one for the same key is refused.
    #[arg(long)]
    pub fingerprint: Option<String>,
    /// A token of your choosing [default: chosen here, so that a retry on
    /// the next server renews the attempt].
    #[arg(long, allow_hyphen_values = true)]
    pub token: Option<String>,
}

/// `lockd run complete KEY`.
#[derive(Debug, Args)]
pub struct RunCompleteArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The run's key.
    pub key: String,
    #[command(flatten)]
    pub token: TokenArg,
    /// The result to store, as JSON.
    #[arg(long, default_value = "{}")]
    pub result: String,
}

/// `lockd run abandon KEY`.
#[derive(Debug, Args)]
pub struct RunTokenArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The run's key.
    pub key: String,
    #[command(flatten)]
    pub token: TokenArg,
}

/// `lockd run extend KEY`.
#[derive(Debug, Args)]
pub struct RunExtendArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The run's key.
    pub key: String,
    #[command(flatten)]
    pub token: TokenArg,
    /// New lease length from now, in ms [default: the attempt's own TTL].
    #[arg(long, allow_negative_numbers = true, value_parser = millis)]
    pub ttl_ms: Option<u64>,
}

/// `lockd run status KEY`.
#[derive(Debug, Args)]
pub struct RunKeyArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The run's key.
    pub key: String,
}

/// The holder's token: `--token`, or `LOCKD_TOKEN` (preferred: a command
/// line is visible to other users in `ps`).
#[derive(Debug, Args)]
pub struct TokenArg {
    /// The holder's token (it may start with `-`).
    #[arg(
        long,
        env = "LOCKD_TOKEN",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    pub token: String,
}

/// `lockd extend NAME`.
#[derive(Debug, Args)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock (or, with --semaphore, the semaphore).
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub semaphore: SemaphoreFlag,
    #[command(flatten)]
    pub token: TokenArg,
    /// New lease length from now, in ms [default: the lease's own TTL: the
    /// one it was granted with, or last extended to].
    #[arg(long, allow_negative_numbers = true, value_parser = millis)]
    pub ttl_ms: Option<u64>,
}

/// `lockd release NAME`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock (or, with --semaphore, the semaphore).
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub semaphore: SemaphoreFlag,
    #[command(flatten)]
    pub token: TokenArg,
}

/// `lockd status NAME`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock (or, with --semaphore, the semaphore).
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub semaphore: SemaphoreFlag,
}

/// Which kind of lease NAME is, for `lockd break` and `lockd history`.
#[derive(Debug, Clone, Copy, Args)]
pub struct KindFlags {
    #[command(flatten)]
    pub semaphore: SemaphoreFlag,
    /// NAME is a run's key (its attempts) rather than a lock.
    #[arg(long, conflicts_with = "semaphore")]
    pub run: bool,
}

impl KindFlags {
    /// `name` as the kind these flags say.
    pub fn target(self, name: &str) -> Target<'_> {
        if self.run {
            Target::Run(name)
        } else {
            Target::new(name, self.semaphore.semaphore)
        }
    }
}

/// `lockd break NAME`.
#[derive(Debug, Args)]
pub struct BreakArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock (with --semaphore, the semaphore; with --run, the run) to
    /// break.
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub kind: KindFlags,
    /// Break only the lease with this fence (one shared lease, one
    /// permit) [default: every live one].
    #[arg(long)]
    pub fence: Option<u64>,
}

/// `lockd history NAME`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock (with --semaphore, the semaphore; with --run, the run).
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub kind: KindFlags,
}

/// Checks a NAME argument as the server would, so that a name no lock can
/// have is refused here (exit 64) rather than sent: `.` and `..` would
/// even reach another route once the URL is normalised.
///
/// # Errors
/// The rule the name breaks, to show.
pub fn check_name(name: &str) -> Result<(), String> {
    crate::lock::LockName::parse(name)
        .map(drop)
        .map_err(|e| format!("{name:?} is not a usable name: {e}"))
}

/// `lockd watch NAME`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub server: ServerArg,
    /// The lock (or, with --semaphore, the semaphore) to watch.
    #[arg(env = "LOCKD_NAME")]
    pub name: String,
    #[command(flatten)]
    pub semaphore: SemaphoreFlag,
    /// Exit (0) as soon as the lock is free (an event says nobody holds
    /// it: a `state` with `held: false`, `released` or `expired`; for a
    /// semaphore, once no permit is held), rather than watch for ever.
    #[arg(long)]
    pub until_free: bool,
    /// A stream silent this long, in ms (no event, not even the server's
    /// keep-alive comment, sent after 15 s of silence by default), counts
    /// as lost: connect again, to the next server when several are given.
    #[arg(long, default_value_t = 45_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    #[test]
    fn server_may_be_given_more_than_once_or_comma_separated() {
        let servers = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Command::Status(a),
            }) => a.server.server,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            servers(&[
                "lockd",
                "status",
                "x",
                "--server",
                "http://a:1",
                "--server",
                "http://b:2"
            ]),
            ["http://a:1", "http://b:2"]
        );
        assert_eq!(
            servers(&["lockd", "status", "x", "--server", "http://a:1,http://b:2"]),
            ["http://a:1", "http://b:2"]
        );
    }

    /// A generated token is base64url and may start with `-`: it must not
    /// be taken for a flag (a test caught `--token -J...` failing).
    #[test]
    fn a_token_may_start_with_a_hyphen() {
        let cli = Cli::try_parse_from(["lockd", "release", "x", "--token", "-Jabc"]);
        assert!(
            matches!(cli, Ok(Cli { command: Command::Release(ref a) }) if a.token.token == "-Jabc"),
            "{cli:?}"
        );
        let cli = Cli::try_parse_from(["lockd", "acquire", "x", "--token", "-Jabcdefghijklmnop"]);
        assert!(
            matches!(cli, Ok(Cli { command: Command::Acquire(ref a) }) if a.token.as_deref() == Some("-Jabcdefghijklmnop")),
            "{cli:?}"
        );
    }
}
