//! The Grafana dashboard (`deploy/grafana/lockd-dashboard.json`) against the
//! metrics lockd really exports: a panel that queries a metric lockd does
//! not export (a typo, a renamed or removed metric) would stay empty
//! without any error, so this test scrapes a real lockd and checks every
//! metric name the dashboard's queries use.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::support::{TestApp, metric};
use serde_json::{Value, json};

/// The dashboard, relative to the crate root.
const DASHBOARD: &str = "deploy/grafana/lockd-dashboard.json";

/// The prefixes of the metric names the dashboard may use: lockd's own and
/// the process collector's.
const PREFIXES: &[&str] = &["lockd_", "process_"];

/// The series suffixes of a histogram (and summary) family.
const HISTOGRAM_SUFFIXES: &[&str] = &["_bucket", "_sum", "_count"];

/// Proves that every metric name used by a query of the dashboard (every
/// `expr` anywhere in the JSON, panels and annotations alike, and the
/// queries of its template variables) is a family that lockd exports, after
/// a workload that exercises every kind of outcome the dashboard charts.
///
/// The workload uses two namespaces (`jobs:...` and `plain`), a contended
/// acquire (409), a server-side wait (`wait_ms`) granted when the holder
/// releases, an extend, releases, a release with a stale token (404), a
/// lease that runs out while held and is then released (404), and a `GET`.
/// Families whose series only exist once something happened (labelled by
/// namespace, say) are thus present. The families are read from the
/// `# TYPE` lines of two scrapes: one while the waiter waits (so that
/// gauges such as `lockd_waiters` have a series even if they only report
/// current waiters) and one at the end.
///
/// `X_bucket`, `X_sum` and `X_count` stand for family `X` when `X` is a
/// histogram or summary in the scrape. The test also fails when the
/// dashboard has no title, no panels or no metric name in its queries, so a
/// broken or emptied dashboard cannot pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_uses_a_metric_the_service_exports() {
    let dashboard = read_dashboard();
    assert!(
        dashboard["title"].as_str().is_some_and(|t| !t.is_empty()),
        "{DASHBOARD} has no title"
    );
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{DASHBOARD} has no panels"
    );
    let queries = queries(&dashboard);
    let used: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    assert!(
        !used.is_empty(),
        "no lockd_ or process_ metric in the {} queries of {DASHBOARD}: {queries:#?}",
        queries.len()
    );

    let app = TestApp::redis().await;
    let scrapes = run_workload(&app).await;
    let exported: BTreeMap<String, String> = scrapes.iter().flat_map(|s| families(s)).collect();

    let missing: BTreeSet<String> = used
        .iter()
        .map(|name| family_of(name, &exported))
        .filter(|family| !exported.contains_key(family))
        .collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD} queries metrics that lockd does not export: {missing:?}\n\
         metric names found in the dashboard's queries: {used:?}\n\
         families lockd exports: {exported:?}"
    );
}

/// The dashboard, parsed.
fn read_dashboard() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every query of the dashboard: each `expr` anywhere in it, and the query
/// (and its `definition`, the text Grafana shows) of each template variable.
fn queries(dashboard: &Value) -> Vec<String> {
    let mut found = Vec::new();
    collect_exprs(dashboard, &mut found);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for variable in variables {
        for key in ["query", "definition"] {
            collect_strings(&variable[key], &mut found);
        }
    }
    found
}

/// Pushes the value of every `expr` member in `value`, at any depth.
fn collect_exprs(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(members) => {
            for (key, member) in members {
                match (key.as_str(), member) {
                    ("expr", Value::String(expr)) => found.push(expr.clone()),
                    _ => collect_exprs(member, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, found)),
        _ => {}
    }
}

/// Pushes every string in `value`, at any depth (a variable's `query` is a
/// string or an object holding one).
fn collect_strings(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::String(text) => found.push(text.clone()),
        Value::Object(members) => members.values().for_each(|m| collect_strings(m, found)),
        Value::Array(items) => items.iter().for_each(|item| collect_strings(item, found)),
        _ => {}
    }
}

/// The metric names in a PromQL query: each maximal run of
/// `[A-Za-z0-9_:]` that starts with one of [`PREFIXES`].
fn metric_names(query: &str) -> Vec<String> {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| PREFIXES.iter().any(|prefix| word.starts_with(prefix)))
        .map(str::to_owned)
        .collect()
}

/// The families of a scrape, by name, with their type, from its `# TYPE`
/// lines.
fn families(scrape: &str) -> BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// The family a series name belongs to: `X` for `X_bucket`, `X_sum` and
/// `X_count` when `X` is an exported histogram or summary, else the name.
fn family_of(name: &str, exported: &BTreeMap<String, String>) -> String {
    HISTOGRAM_SUFFIXES
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .find(|base| {
            exported
                .get(*base)
                .is_some_and(|kind| kind == "histogram" || kind == "summary")
        })
        .unwrap_or(name)
        .to_owned()
}

/// Runs a small mixed workload and returns two scrapes: one taken while an
/// acquire waits server-side, one at the end.
async fn run_workload(app: &TestApp) -> [String; 2] {
    let (jobs, plain, short) = ("jobs:a", "plain", "jobs:short");

    // Grants in two namespaces.
    let held = app.acquire_ttl(jobs, 30_000).await;
    held.expect_status(201);
    let plain_grant = app.acquire_ttl(plain, 30_000).await;
    plain_grant.expect_status(201);

    // A contended acquire, an extend and an inspect.
    app.acquire_ttl(jobs, 30_000).await.expect_status(409);
    app.extend_ttl(jobs, &held.token(), 30_000)
        .await
        .expect_status(200);
    app.inspect(jobs).await.expect_status(200);

    // A waiter, granted when the holder releases. The first scrape is taken
    // while it waits.
    let waiter = app.acquire(jobs, Some(json!({ "ttl_ms": 30_000, "wait_ms": 10_000 })));
    let release_when_waited = async {
        let scrape = scrape_once_waiting(app).await;
        app.release(jobs, &held.token()).await.expect_status(204);
        scrape
    };
    let (granted, while_waiting) = tokio::join!(waiter, release_when_waited);
    granted.expect_status(201);

    // Releases, then a release with a stale token.
    app.release(jobs, &granted.token()).await.expect_status(204);
    app.release(plain, &plain_grant.token())
        .await
        .expect_status(204);
    app.release(plain, &plain_grant.token())
        .await
        .expect_status(404);

    // A lease that runs out while held: its release finds it gone.
    // 200 ms: long enough for its answer to come on a busy machine.
    let expiring = app.acquire_ttl(short, 200).await;
    expiring.expect_status(201);
    tokio::time::sleep(Duration::from_millis(400)).await;
    app.release(short, &expiring.token())
        .await
        .expect_status(404);

    [while_waiting, app.metrics().await]
}

/// Scrapes until `lockd_waiters` (summed over its series) is at least 1,
/// and returns that scrape; panics after 5 s.
async fn scrape_once_waiting(app: &TestApp) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let scrape = app.metrics().await;
        if metric(&scrape, "lockd_waiters", &[]).is_some_and(|n| n >= 1.0) {
            return scrape;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never showed in lockd_waiters:\n{scrape}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The scanner takes whole identifier runs, so a name that merely contains
/// a prefix is not a metric name.
#[test]
fn metric_names_are_the_prefixed_identifier_runs() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(lockd_x_bucket{a=~\"$b\"}[$__rate_interval])))\n/ process_open_fds + my_lockd_y"
        ),
        ["lockd_x_bucket", "process_open_fds"]
    );
}

/// `_bucket`, `_sum` and `_count` are stripped only where the base name is
/// an exported histogram: a counter may end in `_count` itself.
#[test]
fn histogram_series_map_to_their_family_only_for_histograms() {
    let exported = BTreeMap::from([
        ("lockd_h".to_owned(), "histogram".to_owned()),
        ("lockd_c_count".to_owned(), "counter".to_owned()),
    ]);
    assert_eq!(family_of("lockd_h_bucket", &exported), "lockd_h");
    assert_eq!(family_of("lockd_h_count", &exported), "lockd_h");
    assert_eq!(family_of("lockd_c_count", &exported), "lockd_c_count");
    assert_eq!(family_of("lockd_nope_sum", &exported), "lockd_nope_sum");
}
