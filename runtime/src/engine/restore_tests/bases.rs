//! What a base confirms: the commits it lists, by the ranges they were written under.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rill_state::{Progress, StateConfig, StateDb, StoreWrite, SubTaskState};
use rill_topology::{ranges, KeyRange};

use crate::engine::changelog::{
    base_record, changelog_topic, claim_record, data_record, Base, Claim, CommitId, Confirmed,
    MemoryChangelog, BASE_VERSION,
};
use crate::engine::restore::restore;

const L1: u64 = 11;
const L2: u64 = 22;

/// A log where lineage L1 wrote key `k` under the upper half range (attempt 1) and compaction
/// removed its marker (a zombie's later marker of the same key), then L2 claimed and wrote `base`;
/// whether a restore from scratch at factor 1 holds `k`.
fn restores_the_key(base: Base) -> bool {
    let store = "s".to_string();
    let topic = changelog_topic("app", &store);
    let upper = ranges(2)[1];
    let log = Arc::new(MemoryChangelog::default());
    let claim = |lineage, generation| {
        claim_record(&Claim {
            lineage,
            generation,
            parent: 0,
        })
    };
    log.append(&topic, 0, claim(L1, 1));
    let id = CommitId {
        range: upper,
        lineage: L1,
        attempt: 1,
    };
    let write = StoreWrite {
        key: b"k".to_vec(),
        value: Some(b"v".to_vec()),
        hash: upper.start,
    };
    log.append(&topic, 0, data_record(&id, write));
    log.append(&topic, 0, claim(L2, 2));
    log.append(&topic, 0, base_record(&base));
    let dir = tempfile::tempdir().expect("tempdir");
    let db = StateDb::open(&StateConfig {
        dir: dir.path().to_path_buf(),
        memory_bytes: 8 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    })
    .expect("state");
    let stores = [store.clone()];
    let mut states = vec![SubTaskState::open(db, &stores, 0, ranges(1)[0]).expect("open")];
    restore(
        log.as_ref(),
        "app",
        &stores,
        0,
        &mut states,
        &AtomicBool::new(false),
    )
    .expect("restore");
    states[0].holds_committed(&store, b"k").expect("read")
}

/// L1's commit as the restorer's state records it after a change to factor 1: its progress
/// covers the whole range but names L1's attempt in the upper half.
fn composed() -> Progress {
    let mut p = Progress::new(KeyRange::FULL, "in", 1);
    p.lineage = L1;
    p.attempt = 1;
    p
}

#[test]
fn a_base_confirms_a_commit_made_under_another_range() {
    let upper = ranges(2)[1];
    let base = Base {
        lineage: L2,
        ranges: vec![composed()],
        confirms: vec![Confirmed {
            range_start: upper.start,
            range_end: upper.end,
            lineage: L1,
            attempt: 1,
        }],
        version: BASE_VERSION,
    };
    assert!(restores_the_key(base));
}

#[test]
fn a_base_drops_the_commits_it_does_not_list() {
    let base = Base {
        lineage: L2,
        ranges: vec![composed()],
        confirms: Vec::new(),
        version: BASE_VERSION,
    };
    assert!(
        !restores_the_key(base),
        "its marker never came: not confirmed"
    );
}

#[test]
fn a_base_of_the_first_format_confirms_the_commits_its_ranges_name() {
    let mut exact = Progress::new(ranges(2)[1], "in", 1);
    exact.lineage = L1;
    exact.attempt = 1;
    let base = Base {
        lineage: L2,
        ranges: vec![exact],
        confirms: Vec::new(),
        version: 0,
    };
    assert!(restores_the_key(base));
}
