//! `rill state inspect` (issue 46, item 6): the library function behind it reads a state
//! directory written by a TestDriver, read-only, with its stores, ranges and offsets. (The CLI
//! itself is tested in runtime/tests/cli.rs.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rill::prelude::*;
use rill::state::inspect::{inspect, InspectOptions};
use rill::topology::keyrange::KeyRange;

mod common;

/// Every file under `dir` with its length and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let entry = entry.expect("entry");
        let meta = entry.metadata().expect("metadata");
        if meta.is_dir() {
            out.extend(snapshot(&entry.path()));
        } else {
            out.push((entry.path(), meta.len(), meta.modified().expect("mtime")));
        }
    }
    out.sort();
    out
}

#[test]
fn a_test_driver_state_dir_is_inspected_without_changing_it() {
    let dir = tempfile::tempdir().expect("dir");
    let driver = TestDriver::builder(common::wordcount("lines", "counts"))
        .application_id("wc")
        .parallelising_factor(2)
        .partitions("lines", 2)
        .state_dir(dir.path())
        .build()
        .expect("driver");
    let lines = driver.input_topic("lines", StringSerde, StringSerde);
    for line in ["alpha beta alpha", "gamma delta", "alpha epsilon"] {
        lines.pipe_value(line.to_string());
    }
    driver.close().expect("close");

    let before = snapshot(dir.path());
    let found = inspect(
        dir.path(),
        InspectOptions {
            count_entries: true,
        },
    )
    .expect("inspect");
    assert_eq!(
        snapshot(dir.path()),
        before,
        "inspect changed the state dir"
    );

    // The TestDriver records no APPLICATION (nor CLUSTER) file: a service does.
    assert_eq!(found.application, None);
    assert!(found.format.starts_with("rill-state "), "{}", found.format);
    assert!(found.other_column_families.is_empty());
    // The aggregate reads the repartition topic: 2 partitions (as its input) x 2 ranges.
    let ids: BTreeSet<(String, u32, KeyRange)> = found
        .column_families
        .iter()
        .map(|cf| (cf.id.store.clone(), cf.id.partition, cf.id.range))
        .collect();
    let expected: BTreeSet<(String, u32, KeyRange)> = (0..2)
        .flat_map(|p| (0..2).map(move |r| ("counts-store".to_string(), p, KeyRange::nth(r, 2))))
        .collect();
    assert_eq!(ids, expected);
    // Every word is counted in exactly one range, and every range says how far it read the
    // repartition topic.
    let entries: u64 = found.column_families.iter().map(|cf| cf.entries).sum();
    assert_eq!(entries, 5, "alpha beta gamma delta epsilon");
    let mut read = [0u64; 2];
    for cf in &found.column_families {
        assert!(cf.entries_exact);
        let progress = cf.progress.valid().expect("a progress record");
        assert_eq!(progress.range(), cf.id.range);
        let next = progress
            .next_offset("wc-counts-store-repartition")
            .unwrap_or_else(|| panic!("offsets of the repartition topic: {progress:?}"));
        assert!(next > 0, "{progress:?}");
        let p = cf.id.partition as usize;
        read[p] = read[p].max(next);
    }
    // A partition's last record is in one of its ranges, which has read the whole partition:
    // the 7 words the repartition topic holds.
    assert_eq!(read[0] + read[1], 7, "{found:#?}");
}
