//! `lockd manpages DIR` (hidden): the manual pages, lockd(1) and one per
//! subcommand (lockd-serve(1), lockd-run-start(1), ...), rendered with
//! clap_mangen from the very [`crate::cli::Cli`] that parses the command
//! line, so that a page says what `--help` says. `lockd-serve(1)` has a
//! section for each group of flags and the sections of
//! [`crate::cli::SERVE_SECTIONS`] (settings, environment, signals, exit
//! status, files). The Debian package installs them (scripts/package.sh).

use std::path::{Path, PathBuf};

use clap::CommandFactory as _;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};

use crate::cli::{Cli, SERVE_SECTIONS};

/// Writes every page, `NAME.1`, into `dir`, which must exist; returns
/// their paths, lockd.1 first.
///
/// # Errors
/// When a page cannot be written.
pub fn write_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let mut written = Vec::new();
    write_tree(&cli, dir, &mut written)?;
    Ok(written)
}

/// The page of `cmd`, then those of its visible subcommands.
fn write_tree(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let path = dir.join(format!("{}.1", name(cmd)));
    std::fs::write(&path, page(cmd)?)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, written)?;
    }
    Ok(())
}

/// The page's name: `lockd`, `lockd-serve`, `lockd-run-start`.
fn name(cmd: &clap::Command) -> &str {
    cmd.get_display_name().unwrap_or_else(|| cmd.get_name())
}

/// The roff text of `cmd`'s page.
///
/// # Errors
/// Never in practice: the page is written into memory.
pub fn page(cmd: &clap::Command) -> std::io::Result<Vec<u8>> {
    let version = env!("CARGO_PKG_VERSION");
    let is_serve = name(cmd) == "lockd-serve";
    // clap_mangen would print serve's closing sections under one EXTRA
    // heading: they get headings of their own below.
    let shown = if is_serve {
        cmd.clone().after_long_help(None::<&str>)
    } else {
        cmd.clone()
    };
    let mut out = Vec::new();
    Man::new(shown)
        .date(date())
        .source(format!("lockd {version}"))
        .manual("User Commands")
        .render(&mut out)?;
    let mut more = Roff::new();
    if is_serve {
        for (heading, text) in SERVE_SECTIONS {
            more.control("SH", [heading.to_uppercase().as_str()]);
            more.text([roman(text)]);
        }
    }
    if name(cmd) != "lockd" {
        more.control("SH", ["SEE ALSO"]);
        more.text([bold("lockd"), roman("(1)")]);
    }
    more.to_writer(&mut out)?;
    Ok(out)
}

/// The page's date, `YYYY-MM-DD`: that of `SOURCE_DATE_EPOCH` (seconds,
/// which scripts/package.sh sets to the commit's time, so that a package
/// built twice from one commit is the same), else today's. clap_mangen
/// leaves out an empty date, which shifts the fields after it.
fn date() -> String {
    let when = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or_else(std::time::SystemTime::now, |secs| {
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)
        });
    humantime::format_rfc3339_seconds(when)
        .to_string()
        .chars()
        .take(10)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(page: &[u8]) -> String {
        String::from_utf8(page.to_vec()).expect("roff is UTF-8")
    }

    #[test]
    fn the_serve_page_has_a_section_per_flag_group_and_the_closing_sections() {
        let mut cli = Cli::command().disable_help_subcommand(true);
        cli.build();
        let serve = cli
            .find_subcommand("serve")
            .expect("lockd has a serve subcommand");
        let text = text_of(&page(serve).expect("renders"));
        for heading in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "LISTENING",
            "ACCESS",
            "REDIS",
            "LEASES AND LIMITS",
            "METRICS AND LOGS",
            "SETTINGS",
            "ENVIRONMENT",
            "SIGNALS",
            "EXIT STATUS",
            "FILES",
            "SEE ALSO",
        ] {
            let line = if heading.contains(' ') {
                format!("\n.SH \"{heading}\"\n")
            } else {
                format!("\n.SH {heading}\n")
            };
            assert!(text.contains(&line), "no {heading} section:\n{text}");
        }
        assert!(!text.contains(".SH EXTRA"), "{text}");
        for flag in [
            "listen",
            "redis\\-url",
            "max\\-ttl\\-ms",
            "auth\\-keys\\-file",
        ] {
            assert!(text.contains(&format!("\\-\\-{flag}")), "no --{flag}");
        }
        assert!(text.contains("LOCKD_REDIS_URL"), "no environment variables");
        let title = text
            .lines()
            .find(|l| l.starts_with(".TH "))
            .expect("a .TH line");
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            title.ends_with(&format!(" \"lockd {version}\" \"User Commands\"")),
            "{title}"
        );
        let date = title.split(' ').nth(3).expect("a date after the section");
        assert_eq!(date.len(), 10, "{title}");
        assert!(date.starts_with("20"), "{title}");
    }
}
