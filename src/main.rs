//! The `lockd` command: parses flags, sets up logging, runs the service.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use lockd::app::{Application, shutdown_signal};
use lockd::cli::{Command, LogFormat};
use lockd::client;
use lockd::config::Settings;
use tracing_subscriber::EnvFilter;

/// jemalloc, not the system allocator: it returns freed memory to the
/// system (its background thread, set in `.cargo/config.toml`), where
/// glibc's keeps the RSS of a burst of 10,000 waiters (360 MB) until
/// restart; see docs/performance.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = lockd::cli::parse();
    match cli.command {
        Command::Openapi => {
            println!("{}", lockd::http::routes::pretty_json());
            ExitCode::SUCCESS
        }
        Command::Exec(args) => ExitCode::from(client::exec::run(*args).await),
        Command::Acquire(args) => ExitCode::from(client::shell::acquire(args).await),
        Command::Extend(args) => ExitCode::from(client::shell::extend(args).await),
        Command::Release(args) => ExitCode::from(client::shell::release(args).await),
        Command::Status(args) => ExitCode::from(client::shell::status(args).await),
        Command::Break(args) => ExitCode::from(client::shell::break_leases(args).await),
        Command::History(args) => ExitCode::from(client::shell::history(args).await),
        Command::Run(command) => ExitCode::from(client::shell::run(command).await),
        Command::Watch(args) => ExitCode::from(client::watch::watch(args).await),
        Command::Keygen(args) => ExitCode::from(lockd::keygen::run(&args)),
        Command::Manpages(args) => match lockd::manpages::write_all(&args.dir) {
            Ok(pages) => {
                for page in pages {
                    println!("{}", page.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "lockd: cannot write the manual pages into {}: {e}",
                    args.dir.display()
                );
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            let settings = match Settings::load(&args) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("lockd: {e}");
                    return ExitCode::from(2);
                }
            };
            // Flushes the log lines still queued when dropped, at exit.
            let _logs = match init_logging(settings.service.log_format) {
                Ok(guard) => guard,
                Err(e) => {
                    eprintln!("lockd: cannot start the log writer thread: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // From here a SIGTERM or Ctrl-C stops lockd cleanly, start-up
            // included (which waits for Redis for up to seconds).
            let mut stop = Box::pin(shutdown_signal());
            let built = tokio::select! {
                built = Application::build(&settings) => built,
                () = &mut stop => {
                    tracing::info!("stopped before start-up ended");
                    return ExitCode::SUCCESS;
                }
            };
            let app = match built {
                Ok(app) => app,
                Err(e) => {
                    // Settings that cannot be used (such as an unreadable
                    // TLS key, or a replica given as the server) exit 2, and
                    // say so in one line, as a bad flag does.
                    return if e.is_settings() {
                        eprintln!("lockd: {e}");
                        ExitCode::from(2)
                    } else {
                        tracing::error!("{e}");
                        ExitCode::FAILURE
                    };
                }
            };
            match serve(app, stop).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn serve(
    app: Application,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error>> {
    let scheme = if app.is_tls() { "https" } else { "http" };
    tracing::info!(addr = %app.local_addr()?, scheme, "lockd listening");
    if let Some(addr) = app.metrics_addr()? {
        tracing::info!(addr = %addr, "metrics, /healthz and /readyz listening");
    }
    app.run_until(stop).await?;
    tracing::info!("stopped");
    Ok(())
}

/// The log filter when none is given: `info`, but only errors from the
/// redis crate's cluster connection, which warns at every slot refresh
/// (hundreds of lines a second while a master fails over; lockd logs
/// what the failover does to requests itself).
const DEFAULT_LOG_FILTER: &str = "info,redis::cluster_handling=error";

/// Logs to stderr in `format`; `RUST_LOG` (or `LOCKD_LOG`, which wins)
/// sets the filter, default [`DEFAULT_LOG_FILTER`]. Lines are written by a
/// thread of their own, a batch at a time ([`lockd::logs`]), so a slow
/// stderr (a full pipe, a slow disk) does not stall the request that
/// logged, and a busy server pays one write and one wake-up per batch, not
/// per line. When the buffer is full, logging waits rather than dropping
/// lines, unless stderr takes nothing at all (see [`lockd::logs`]). Keep the
/// guard until exit: dropping it writes what is left.
///
/// # Errors
/// When the writer thread cannot be started.
fn init_logging(format: LogFormat) -> std::io::Result<lockd::logs::FlushGuard> {
    // An empty variable counts as unset (an empty filter would log nothing).
    let set = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let wanted = set("LOCKD_LOG").or_else(|| set("RUST_LOG"));
    let filter = match wanted.as_deref().map(EnvFilter::try_new) {
        Some(Ok(filter)) => filter,
        Some(Err(e)) => {
            eprintln!(
                "lockd: ignoring the log filter in LOCKD_LOG/RUST_LOG ({e}); \
                 using the default, {DEFAULT_LOG_FILTER}"
            );
            EnvFilter::new(DEFAULT_LOG_FILTER)
        }
        None => EnvFilter::new(DEFAULT_LOG_FILTER),
    };
    let (writer, guard) = lockd::logs::batched(std::io::stderr(), "lockd-log")?;
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer.clone());
    // The access lines are written by lockd itself: the same lines, for
    // less CPU, and whole whatever the filter does to the request's span
    // (lockd::http::access).
    let ansi = std::io::stderr().is_terminal();
    let access = match format {
        LogFormat::Pretty if ansi => lockd::http::access::Format::Colour,
        LogFormat::Pretty => lockd::http::access::Format::Text,
        LogFormat::Json => lockd::http::access::Format::Json,
    };
    lockd::http::access::send_to(writer.clone(), access);
    match format {
        LogFormat::Pretty => logs.with_ansi(ansi).init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    Ok(guard)
}
