//! [`Namespaces`]: the bounded `namespace` label of the lock metrics.
//!
//! A lock name would make one series per lock; the namespace (the part of
//! the name before the first `:`, or the whole name when it has none) makes
//! one per kind of lock. At most a fixed number of namespaces get their own
//! series; every later one is counted under [`OTHER`].

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

/// The label value of every namespace past the limit. It always exists, so
/// that every lock metric family is in the scrape from start-up.
pub const OTHER: &str = "other";

/// The namespaces seen so far, up to a limit.
pub struct Namespaces {
    kept: RwLock<HashSet<Arc<str>>>,
    max: usize,
}

/// What [`Namespaces::label`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// A namespace that already has its series.
    Known(Arc<str>),
    /// A namespace seen for the first time, now kept: its series must be
    /// created at zero.
    New(Arc<str>),
    /// Past the limit: counted as [`OTHER`].
    Other,
}

impl Label {
    /// The label value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Known(ns) | Self::New(ns) => ns,
            Self::Other => OTHER,
        }
    }
}

/// The namespace of a name that starts with `:` (an empty label value
/// would read as a missing label in Prometheus).
pub const EMPTY: &str = "_";

/// The namespace of a lock name: the part before the first `:`, or the
/// whole name when it has no `:`. `billing:invoice-7` is in `billing`;
/// `nightly-report` is its own namespace; `:x` is in [`EMPTY`].
pub fn namespace_of(name: &str) -> &str {
    match name.split_once(':') {
        Some(("", _)) => EMPTY,
        Some((ns, _)) => ns,
        None => name,
    }
}

impl Namespaces {
    /// Keeps at most `max` namespaces besides [`OTHER`].
    pub fn new(max: usize) -> Self {
        Self {
            kept: RwLock::new(HashSet::new()),
            max,
        }
    }

    /// The label of the lock `name`, keeping its namespace if there is room.
    pub fn label(&self, name: &str) -> Label {
        let ns = namespace_of(name);
        if ns == OTHER {
            return Label::Other;
        }
        {
            let kept = self.kept.read().unwrap_or_else(|p| p.into_inner());
            if let Some(known) = kept.get(ns) {
                return Label::Known(known.clone());
            }
            if kept.len() >= self.max {
                return Label::Other;
            }
        }
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = kept.get(ns) {
            return Label::Known(known.clone());
        }
        if kept.len() >= self.max {
            return Label::Other;
        }
        let ns: Arc<str> = Arc::from(ns);
        kept.insert(ns.clone());
        Label::New(ns)
    }

    /// Every kept namespace, [`OTHER`] included.
    pub fn all(&self) -> Vec<Arc<str>> {
        let kept = self.kept.read().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .cloned()
            .chain(std::iter::once(Arc::from(OTHER)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_is_the_part_before_the_first_colon() {
        assert_eq!(namespace_of("billing:invoice:7"), "billing");
        assert_eq!(namespace_of("nightly-report"), "nightly-report");
        assert_eq!(namespace_of(":x"), "_");
        assert_eq!(namespace_of("a:"), "a");
    }

    #[test]
    fn namespaces_past_the_limit_are_other() {
        let ns = Namespaces::new(2);
        assert_eq!(ns.label("a:1"), Label::New(Arc::from("a")));
        assert_eq!(ns.label("a:2"), Label::Known(Arc::from("a")));
        assert_eq!(ns.label("b"), Label::New(Arc::from("b")));
        assert_eq!(ns.label("c:1"), Label::Other);
        assert_eq!(ns.label("b:9"), Label::Known(Arc::from("b")));
        let mut all: Vec<String> = ns.all().iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(all, ["a", "b", "other"]);
    }

    #[test]
    fn a_namespace_called_other_does_not_use_up_a_place() {
        let ns = Namespaces::new(1);
        assert_eq!(ns.label("other:1"), Label::Other);
        assert_eq!(ns.label("x:1"), Label::New(Arc::from("x")));
    }

    #[test]
    fn zero_keeps_every_namespace_as_other() {
        let ns = Namespaces::new(0);
        assert_eq!(ns.label("a:1"), Label::Other);
        assert_eq!(ns.all().len(), 1);
    }
}
