//! Property tests of the input parsers (proptest): lock names, TTLs, tokens
//! and owner labels, first alone (no panic, and accepted exactly when the
//! documented rule says so), then through HTTP as a client sends them: the
//! answer is a grant whose values are the ones sent, or a 400 problem
//! document that wrote nothing; never a 5xx.
//!
//! Each rule is restated here from docs/api.md, independently of the parser,
//! so that a parser and its rule cannot drift apart unnoticed.

use std::time::Instant;

use crate::support::{TestApp, assert_lease_ms, lease_slack_ms};
use lockd::lock::{LockName, Owner, Token, Ttl};
use proptest::prelude::*;
use reqwest::Method;

/// docs/api.md: 1 to 200 characters of `A-Za-z0-9._-:@`, other than `.` and `..`.
fn name_rule(s: &str) -> bool {
    (1..=200).contains(&s.len())
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:@".contains(c))
}

/// docs/api.md: 16 to 128 characters of `A-Za-z0-9_-`.
fn token_rule(s: &str) -> bool {
    (16..=128).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
}

/// docs/api.md: decimal digits for an integer from 1 to the maximum.
fn ttl_rule(s: &str, max: u64) -> Option<u64> {
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>()
        .ok()
        .filter(|ms| (1..=max.min(Ttl::CEILING_MS)).contains(ms))
}

/// docs/api.md: up to 256 characters, no control characters.
fn owner_rule(s: &str) -> bool {
    s.chars().count() <= 256 && !s.chars().any(char::is_control)
}

/// Names: often from the alphabet (so valid ones are common), sometimes
/// anything at all.
fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9._:@-]{0,205}",
        1 => any::<String>(),
        1 => prop_oneof![Just(".".to_owned()), Just("..".to_owned()), Just(String::new())],
    ]
}

fn tokens() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9_-]{10,135}",
        1 => any::<String>(),
    ]
}

fn ttl_texts() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0_u64..5_000_000).prop_map(|n| n.to_string()),
        1 => "[0-9]{15,25}",
        1 => "-?[0-9]{0,4}(\\.[0-9]{1,3})?",
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn lock_names_follow_the_rule(raw in names()) {
        let parsed = LockName::parse(&raw);
        prop_assert_eq!(parsed.is_ok(), name_rule(&raw), "{:?}", raw);
        if let Ok(name) = parsed {
            prop_assert_eq!(name.as_str(), raw.as_str());
        }
    }

    #[test]
    fn tokens_follow_the_rule(raw in tokens()) {
        let parsed = Token::parse(&raw);
        prop_assert_eq!(parsed.is_ok(), token_rule(&raw), "{:?}", raw);
        if let Ok(token) = parsed {
            prop_assert_eq!(token.expose(), raw.as_str());
            // Never shown by Debug.
            let shown = format!("{token:?}");
            prop_assert!(!shown.contains(&raw));
        }
    }

    #[test]
    fn ttl_texts_follow_the_rule(raw in ttl_texts(), max in 1_u64..=Ttl::CEILING_MS * 2) {
        let parsed = Ttl::parse_text(&raw, max, "ttl_ms");
        prop_assert_eq!(parsed.ok().map(Ttl::as_millis), ttl_rule(&raw, max), "{:?} max {}", raw, max);
    }

    #[test]
    fn ttl_numbers_follow_the_rule(ms in any::<u64>(), max in any::<u64>()) {
        let parsed = Ttl::from_millis(ms, max, "ttl_ms");
        prop_assert_eq!(parsed.is_ok(), ms >= 1 && ms <= max.min(Ttl::CEILING_MS));
    }

    #[test]
    fn owners_follow_the_rule(raw in any::<String>()) {
        prop_assert_eq!(Owner::parse(&raw).is_ok(), owner_rule(&raw), "{:?}", raw);
    }

    #[test]
    fn generated_tokens_pass_the_client_rule(_ in 0..1) {
        let token = Token::generate();
        prop_assert!(token_rule(token.expose()));
    }
}

/// Percent-encodes every byte outside the unreserved set, so that any name
/// reaches the server as one path segment.
fn segment(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Percent-encodes a query value.
fn query_value(raw: &str) -> String {
    url::form_urlencoded::byte_serialize(raw.as_bytes()).collect()
}

/// One acquire as a client sends it: the answer is a grant of exactly these
/// values, or a 400 that wrote nothing. `None` for the TTL or token leaves
/// it out.
async fn acquire_once(app: &TestApp, name: &str, ttl: Option<&str>, token: Option<&str>) {
    let max = app.settings.limits.max_ttl.as_millis();
    let mut path = format!("/locks/{}", segment(name));
    if let Some(ttl) = ttl {
        path += &format!("?ttl_ms={}", query_value(ttl));
    }
    let headers: Vec<(&str, &str)> = token
        .filter(|t| reqwest::header::HeaderValue::from_str(t).is_ok())
        .map(|t| ("Lock-Token", t))
        .into_iter()
        .collect();
    let sent_token = headers.first().map(|(_, t)| *t);
    let sent = Instant::now();
    let reply = app.send(Method::POST, &path, &headers, None).await;
    let valid = name_rule(name)
        && ttl.is_none_or(|t| ttl_rule(t, max).is_some())
        && sent_token.is_none_or(token_rule);
    match reply.status.as_u16() {
        201 => {
            assert!(
                valid,
                "granted invalid input: {name:?} {ttl:?} {sent_token:?}"
            );
            let body = reply.json();
            assert_eq!(body["name"], name);
            if let Some(ttl) = ttl {
                // What is left of the lease: the TTL less the time on the
                // wire.
                assert_lease_ms(body["ttl_ms"].as_u64(), ttl_rule(ttl, max).unwrap(), sent);
            }
            if let Some(token) = sent_token {
                assert_eq!(body["token"], token);
            }
            let token = body["token"].as_str().unwrap().to_owned();
            let released = app
                .send(
                    Method::DELETE,
                    &path_only(&path),
                    &[("Lock-Token", &token)],
                    None,
                )
                .await;
            // A lease of a few ms may have run out already.
            let short = ttl
                .and_then(|t| ttl_rule(t, max))
                .is_some_and(|ms| ms < 5_000);
            if !(short && released.status == 404) {
                released.expect_status(204);
            }
        }
        400 => {
            assert!(
                !valid,
                "refused valid input: {name:?} {ttl:?} {sent_token:?}: {}",
                reply.text
            );
            reply.expect_problem(400, "invalid-request");
            assert_eq!(app.lock_key_count().await, 0, "a 400 wrote a lock");
        }
        // A lease of a few ms may be over before Redis's answer arrives: it
        // is then not answered as a lease.
        503 if valid
            && ttl
                .and_then(|t| ttl_rule(t, max))
                .is_some_and(|ms| ms <= lease_slack_ms(sent)) =>
        {
            reply.expect_problem(503, "backend-unavailable");
        }
        // An empty name leaves no segment, and HTTP clients resolve `.` and
        // `..` segments before sending: no lock route is reached.
        404 if ["", ".", ".."].contains(&name) => {
            reply.expect_problem(404, "route-not-found");
        }
        other => panic!(
            "{other} for {name:?} {ttl:?} {sent_token:?}: {}",
            reply.text
        ),
    }
}

fn path_only(path: &str) -> String {
    path.split('?').next().unwrap().to_owned()
}

#[test]
fn acquire_answers_a_grant_of_the_values_sent_or_a_400_never_a_5xx() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = runtime.block_on(TestApp::memory_with(|s| {
        s.limits.max_ttl = Ttl::new(600_000).expect("a TTL")
    }));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(300));
    let inputs = (
        names(),
        proptest::option::of(ttl_texts()),
        proptest::option::of(tokens()),
    );
    runner
        .run(&inputs, |(name, ttl, token)| {
            runtime.block_on(acquire_once(&app, &name, ttl.as_deref(), token.as_deref()));
            Ok(())
        })
        .unwrap();
}
