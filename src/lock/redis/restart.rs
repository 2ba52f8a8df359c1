//! Redlock's delayed restart: a node that restarted may have lost the
//! grants it held (no persistence, or `appendfsync everysec` losing the last
//! second), and would then grant a lock that another client still holds on
//! the rest of its quorum. So a node counts toward no quorum until every
//! lease it may have held before the restart has run out: for the restart
//! delay (`--redlock-restart-delay-ms`, by default `max_ttl_ms`) after it
//! started. lockd still writes to it meanwhile, so it catches up. This is
//! the answer the Redis page on Redlock ("Distributed Locks with Redis",
//! section "Performance, crash recovery and fsync") gives to Kleppmann's
//! critique.
//!
//! A restart is seen on every new connection, which lockd opens after the
//! old ones broke: the server's `run_id` (`INFO server`) changed. The node's
//! `uptime_in_seconds` tells when it started (less one second, since Redis
//! may round it up by that much), so the delay ends at start + delay, not
//! at the moment lockd noticed.
//!
//! Every restart is delayed, even one that loaded an AOF: `INFO` cannot
//! show that the last acknowledged writes reached the disk (`appendfsync
//! everysec`, the default, may lose a second of them), and a lost grant is
//! what the delay guards against.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// What lockd knows of one node's restarts.
#[derive(Debug)]
pub struct RestartWatch {
    /// The node, as `host:port`, for logs.
    node: String,
    delay: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    run_id: Option<String>,
    delayed_until: Option<Instant>,
}

impl RestartWatch {
    /// A watch of `node` that keeps a restarted node out of quorums for
    /// `delay` after it started.
    pub fn new(node: String, delay: Duration) -> Self {
        Self {
            node,
            delay,
            state: Mutex::default(),
        }
    }

    /// Takes in the text of `INFO server` read on a new connection. The
    /// first `run_id` seen is trusted (lockd cannot know what happened
    /// before it started); a different one later means the node restarted.
    pub fn observe(&self, info: &str) {
        let Some(run_id) = info_field(info, "run_id") else {
            return;
        };
        // Redis counts whole seconds between two clock readings each cut to
        // the second, so it may report up to a second more than the node
        // has run: count a second less, so the delay never ends early.
        let uptime = info_field(info, "uptime_in_seconds")
            .and_then(|u| u.parse::<u64>().ok())
            .map_or(Duration::ZERO, |s| Duration::from_secs(s.saturating_sub(1)));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let restarted = state.run_id.as_deref().is_some_and(|old| old != run_id);
        state.run_id = Some(run_id.to_owned());
        if restarted {
            let left = self.delay.saturating_sub(uptime);
            if left.is_zero() {
                tracing::info!(node = %self.node, "Redis node restarted longer ago than the restart delay; counting it at once");
                return;
            }
            state.delayed_until = Some(Instant::now() + left);
            tracing::warn!(
                node = %self.node,
                delay_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                "Redis node restarted and may have lost locks: its grants count toward no quorum until the restart delay has passed"
            );
        }
    }

    /// Whether the node is in its restart delay now.
    pub fn delayed(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.delayed_until {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                state.delayed_until = None;
                tracing::info!(node = %self.node, "Redis node's restart delay has passed; its grants count again");
                false
            }
            None => false,
        }
    }
}

/// The value of `field` in the `field:value` lines of an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':').map(str::trim))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run_id: &str, uptime: u64) -> String {
        format!(
            "# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n"
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_run_id_delays_the_node_from_its_start() {
        let watch = RestartWatch::new("n:1".into(), Duration::from_secs(60));
        watch.observe(&info("a", 5));
        assert!(!watch.delayed(), "the first run_id seen is trusted");
        watch.observe(&info("a", 500));
        assert!(!watch.delayed(), "same run_id: no restart");
        watch.observe(&info("b", 10));
        assert!(watch.delayed());
        // Up 10 s by Redis's count, which may be a second too many: 9 s.
        tokio::time::advance(Duration::from_secs(50)).await;
        assert!(watch.delayed());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!watch.delayed(), "60 s after the node started");
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_longer_ago_than_the_delay_counts_at_once() {
        let watch = RestartWatch::new("n:1".into(), Duration::from_secs(60));
        watch.observe(&info("a", 5));
        watch.observe(&info("b", 62));
        assert!(!watch.delayed());
    }

    #[test]
    fn info_fields_are_read_by_name() {
        let text = info("abc", 7);
        assert_eq!(info_field(&text, "run_id"), Some("abc"));
        assert_eq!(info_field(&text, "uptime_in_seconds"), Some("7"));
        assert_eq!(info_field(&text, "missing"), None);
    }
}
