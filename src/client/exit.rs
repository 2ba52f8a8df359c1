//! Exit codes of the client subcommands, from BSD `sysexits.h` where one
//! fits, so scripts can tell "someone else holds it" from "the server is
//! down".

/// The lock was not granted: another holder has it (`EX_TEMPFAIL`).
/// `lockd exec --conflict-exit-code` changes it, as `flock -E` does.
pub const CONFLICT: u8 = 75;
/// The server could not be reached, or answered 5xx (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// `lockd exec`: the lease was lost while the command ran, and the command
/// was stopped (`EX_SOFTWARE`).
pub const LEASE_LOST: u8 = 70;
/// The server refused the request as invalid (400), or the server URL is
/// unusable (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// The shell subcommands: the server answered 404 (the lock is free, or
/// the lease is gone).
pub const NOT_FOUND: u8 = 1;
/// `lockd exec`: the command could not be run (not executable).
pub const CANNOT_EXECUTE: u8 = 126;
/// `lockd exec`: the command was not found.
pub const NOT_FOUND_COMMAND: u8 = 127;
/// The base of "killed by signal N": 128 + N, as shells report it.
pub const SIGNAL_BASE: u8 = 128;
