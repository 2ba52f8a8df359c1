//! `lockd keygen`: mints an API key. The secret is printed once, on
//! stdout, and stored nowhere; the keys file gets its SHA-256.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::auth::{KeyEntry, KeyRing, Permission, new_secret, secret_sha256};

/// Flags of `lockd keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// A name for the key, unique in the keys file (logged with requests).
    #[arg(long)]
    pub id: String,
    /// A lock-name prefix the key may use, such as `billing:`; give it more
    /// than once for several; `*` for every name.
    #[arg(long = "prefix", required = true)]
    pub prefixes: Vec<String>,
    /// What the key may do (comma-separated).
    #[arg(
        long = "permission",
        value_enum,
        value_delimiter = ',',
        default_values_t = [Permission::Acquire, Permission::Extend, Permission::Release, Permission::Read]
    )]
    pub permissions: Vec<Permission>,
    /// Most requests per second for this key (bursts of as many); beyond,
    /// 429 [default: no limit].
    #[arg(long)]
    pub requests_per_second: Option<u32>,
    /// Append the key to this keys file (created, mode 0600, when missing).
    /// Without it, the entry is printed on stderr for you to add.
    #[arg(long)]
    pub keys_file: Option<PathBuf>,
}

/// Runs `lockd keygen`; returns the exit code (0, or 2 for a refused key
/// or an unusable keys file).
pub fn run(args: &KeygenArgs) -> u8 {
    match mint(args) {
        Ok(secret) => {
            println!("{secret}");
            0
        }
        Err(e) => {
            eprintln!("lockd keygen: {e}");
            2
        }
    }
}

fn mint(args: &KeygenArgs) -> Result<String, String> {
    let secret = new_secret();
    let entry = KeyEntry {
        id: args.id.trim().to_owned(),
        secret_sha256: secret_sha256(&secret),
        prefixes: args.prefixes.clone(),
        permissions: args.permissions.clone(),
        requests_per_second: args.requests_per_second,
    };
    let text = entry.to_toml();
    // The entry alone first, so that a refused flag is told as such, not
    // as a fault of the keys file.
    KeyRing::parse(&text, Path::new("(new key)")).map_err(|e| {
        format!(
            "{}; nothing was written: check --id, --prefix and --requests-per-second",
            e.message()
        )
    })?;
    match &args.keys_file {
        Some(path) => {
            append(path, &entry.id, &text)?;
            eprintln!(
                "lockd keygen: added key {:?} to {}; send SIGHUP to a running lockd to load it. \
                 The secret (on stdout) is shown once: give it to the client.",
                entry.id,
                path.display()
            );
        }
        None => {
            eprintln!("# Add this to your keys file; the secret (stdout) is shown once:\n{text}");
        }
    }
    Ok(secret)
}

/// Appends the entry `text` of the key `id` to the keys file at `path`
/// after checking that the file loads, has no key `id` yet, and still
/// loads with the entry (so nothing is written when one fails).
fn append(path: &Path, id: &str, text: &str) -> Result<(), String> {
    let existing = match std::fs::read_to_string(path) {
        Ok(existing) => existing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let ring = KeyRing::parse(&existing, path)
        .map_err(|e| format!("{e}; fix the file first, nothing was written"))?;
    if ring.has_id(id) {
        return Err(format!(
            "a key with id {id:?} is already in {}; nothing was written. Pick another \
             --id, or, to replace that key, first delete its [[keys]] entry \
             (id = {id:?}) from the file",
            path.display()
        ));
    }
    KeyRing::parse(&format!("{existing}{text}"), path).map_err(|e| e.to_string())?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
