//! Prometheus text, parsed: [`metric`] and [`samples`].

use std::collections::BTreeMap;

/// The sum of the samples `name{labels, ...}` in Prometheus text: every
/// sample that has at least `labels` (for example all nodes of
/// `lockd_backend_duration_seconds_count{op="acquire"}`); `None` when there
/// is none.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let matching: Vec<f64> = samples(text)
        .into_iter()
        .filter(|s| s.name == name && wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// One sample of Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the samples of Prometheus text format (comments skipped).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(parse_sample)
        .collect()
}

fn bad_line<T>(line: &str) -> T {
    panic!("malformed metrics line {line:?}")
}

fn parse_sample(line: &str) -> Sample {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad_line(line));
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices();
        let mut key = String::new();
        let end;
        loop {
            let (i, c) = chars.next().unwrap_or_else(|| bad_line(line));
            match c {
                '}' => {
                    end = i + 1;
                    break;
                }
                ',' => {}
                '=' => {
                    assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next().unwrap_or_else(|| bad_line(line));
                        match c {
                            '"' => break,
                            '\\' => value.push(chars.next().unwrap_or_else(|| bad_line(line)).1),
                            c => value.push(c),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        }
        rest = &after[end..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| bad_line(line));
    Sample {
        name,
        labels,
        value,
    }
}
