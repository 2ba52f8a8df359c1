//! Every module is named in its parent's module doc: each module that
//! `src/lib.rs`, a `mod.rs`, or a file `a/b.rs` beside a folder `a/b/`
//! declares (`mod name;`, `pub mod name;`, `pub(crate) mod name;`, not
//! `#[cfg(test)]` ones or inline `mod name { }`) is mentioned as a word in
//! that file's leading `//!` comment. The harness's `support/mod.rs` too.

use std::fs;
use std::path::{Path, PathBuf};

#[test]
fn every_module_is_named_in_its_parents_module_doc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut parents = vec![
        root.join("src/lib.rs"),
        root.join("src/bin/lockd-bench/main.rs"),
        root.join("tests/integration/support/mod.rs"),
    ];
    parents_under(&root.join("src"), &mut parents);
    parents.sort();
    parents.dedup();
    let lib = read(&root.join("src/lib.rs"));
    assert!(
        !declared_modules(&lib).is_empty(),
        "no module declaration read in src/lib.rs"
    );
    let mut missing = Vec::new();
    for file in &parents {
        let text = read(file);
        let doc = leading_doc(&text);
        for name in declared_modules(&text) {
            if !mentions(&doc, &name) {
                let shown = file.strip_prefix(root).unwrap_or(file);
                missing.push(format!("{}: {name}", shown.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules their parent's module doc does not name:\n{}",
        missing.join("\n")
    );
}

fn read(file: &Path) -> String {
    fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Every `mod.rs` under `dir`, and every `b.rs` beside a folder `b/`.
fn parents_under(dir: &Path, parents: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            parents_under(&path, parents);
        } else if path.extension().is_some_and(|e| e == "rs")
            && (path.file_name().is_some_and(|n| n == "mod.rs") || path.with_extension("").is_dir())
        {
            parents.push(path);
        }
    }
}

/// The `//!` lines at the top of a file, joined.
fn leading_doc(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .take_while(|line| line.is_empty() || line.starts_with("//!"))
        .filter_map(|line| line.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names of the top-level `mod name;` declarations (any visibility),
/// leaving out those under `#[cfg(test)]`.
fn declared_modules(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut test_only = false;
    for line in text.lines() {
        if line.starts_with("#[") {
            test_only |= line.starts_with("#[cfg(test)]");
            continue;
        }
        let item = match line.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => rest.split_once(')').map_or("", |(_, r)| r),
            Some(rest) => rest,
            None => line,
        };
        let name = item
            .trim_start()
            .strip_prefix("mod ")
            .and_then(|rest| rest.trim().strip_suffix(';'));
        if let Some(name) = name
            && !test_only
        {
            names.push(name.trim().to_owned());
        }
        test_only = false;
    }
    names
}

/// Whether `name` occurs in `doc` as a word: not inside a longer name.
fn mentions(doc: &str, name: &str) -> bool {
    let part_of_name = |c: char| c.is_alphanumeric() || c == '_';
    doc.match_indices(name).any(|(at, _)| {
        let before = doc[..at].chars().next_back();
        let after = doc[at + name.len()..].chars().next();
        !before.is_some_and(part_of_name) && !after.is_some_and(part_of_name)
    })
}
