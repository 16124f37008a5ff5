//! The reference tables of the user guide (`docs/operating.md`) agree with the code: the config
//! keys with their defaults, and the metric names. The guide's and the README's Rust snippets
//! run as doc tests of the `rill` crate (`src/lib.rs`).

use std::collections::BTreeSet;

/// The chapter that holds the reference tables.
const TABLES: &str = "docs/operating.md";

fn reference() -> String {
    // Cargo sets the variable when it runs the test too; the run-time value is right even when a
    // shared target dir holds a binary built from another clone of the repository.
    let root = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let path = format!("{root}/{TABLES}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The lines of the Markdown table whose header row starts with `header`.
fn table(text: &str, header: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(header))
        .unwrap_or_else(|| panic!("no table starting with {header:?} in {TABLES}"));
    lines[start..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.to_string())
        .collect()
}

#[test]
fn the_config_table_is_the_one_the_code_declares() {
    let expected = rill::runtime::config::key_table();
    let found = table(&reference(), "| key | default | meaning |").join("\n") + "\n";
    assert_eq!(
        found, expected,
        "the config table of {TABLES} differs from rill_runtime::config::KEYS; paste this \
         table there:\n{expected}"
    );
}

#[test]
fn the_metric_table_lists_every_metric_and_no_other() {
    let rows = table(&reference(), "| metric | type | labels |");
    let in_guide: BTreeSet<String> = rows
        .iter()
        .skip(2)
        .flat_map(|row| {
            let name_cell = row.split('|').nth(1).unwrap_or_default();
            name_cell
                .split(',')
                .map(|n| n.trim().trim_matches('`').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let in_code: BTreeSet<String> = rill::runtime::metrics::ALL
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        in_guide, in_code,
        "the metric table of {TABLES} and rill_runtime::metrics::ALL differ"
    );
}
