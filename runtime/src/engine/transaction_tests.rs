//! Range commits under `exactly_once_v2`, against an in-memory changelog that plays the
//! broker's part: a transaction's records stay unless it aborts, when they are removed (a
//! `read_committed` reader never sees them).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_state::{StateConfig, StateDb};
use rill_topology::prelude::*;
use rill_topology::RawRecord;

use crate::engine::changelog::{changelog_topic, MemoryChangelog};
use crate::engine::{Dispatch, Engine, EngineConfig, PartitionProgress, PriorClaim, Resume};

use crate::engine::test_topologies::counting;

/// A transactional engine at P = 3 over `dir`, writing to and restoring from `log`, assigned
/// partition 0 of `in` as the last committed transaction left it (`after`).
fn engine(dir: &Path, log: &Arc<MemoryChangelog>, after: Option<&PartitionProgress>) -> Engine {
    engine_of(counting(), dir, log, after)
}

/// [`engine`] running `topology`.
fn engine_of(
    topology: Arc<Topology>,
    dir: &Path,
    log: &Arc<MemoryChangelog>,
    after: Option<&PartitionProgress>,
) -> Engine {
    let db = StateDb::open(&StateConfig {
        dir: dir.to_path_buf(),
        memory_bytes: 16 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    })
    .unwrap();
    let config = EngineConfig {
        application_id: "app".into(),
        parallelising_factor: 3,
        worker_threads: 2,
        changelogs: true,
        transactional: true,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(topology, config, Some(db), log.clone(), HashMap::new()).unwrap();
    e.restore_from(log.clone());
    let resume = match after {
        Some(p) => Resume {
            committed: Some(p.low_watermark),
            generation: 1,
            claim: p.lineage.map_or(PriorClaim::None, PriorClaim::Lineage),
            ranges: p.ranges.clone(),
            applied: Vec::new(),
            hash_id: p.hash_id,
            end: None,
        },
        None => Resume {
            claim: PriorClaim::None,
            ..Resume::default()
        },
    };
    e.assign("in", 0, resume).unwrap();
    assert!(e.wait_restored(Duration::from_secs(20)).unwrap());
    e
}

fn dispatch(e: &mut Engine, from: u64, keys: &[&str]) {
    let records: Vec<(&str, &str)> = keys.iter().map(|k| (*k, "v")).collect();
    dispatch_values(e, from, &records);
}

/// Dispatches (key, value) records at offsets from `from`.
fn dispatch_values(e: &mut Engine, from: u64, records: &[(&str, &str)]) {
    for (i, (k, v)) in records.iter().enumerate() {
        let raw = RawRecord {
            key: Some(k.as_bytes().to_vec()),
            value: Some(v.as_bytes().to_vec()),
            timestamp: 0,
            headers: Headers::new(),
        };
        let mut raw = raw;
        // A full mailbox hands the record back: offer it again once the range made room.
        while let Dispatch::Full(back) = e.dispatch("in", 0, from + i as u64, raw).unwrap() {
            raw = back;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Seals every range and waits until all are ready; returns the transaction's offsets (those
/// of what the ranges processed when the seal reached them).
fn seal(e: &mut Engine) -> PartitionProgress {
    e.seal_for_transaction();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !e.transaction_ready().unwrap() {
        assert!(Instant::now() < deadline, "the ranges did not get ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut progress = e.prepare_transaction();
    assert!(progress.len() <= 1);
    progress.pop().unwrap_or(PartitionProgress {
        topic: "in".into(),
        partition: 0,
        low_watermark: 0,
        ranges: Vec::new(),
        lineage: None,
        applied: Vec::new(),
        hash_id: rill_topology::HASH_ID,
    })
}

/// Waits until everything dispatched is processed.
fn idle(e: &Engine) {
    assert!(e.wait_idle(Duration::from_secs(20)));
}

/// A whole transaction commit of everything dispatched before it.
fn commit(e: &mut Engine) -> PartitionProgress {
    idle(e);
    let p = seal(e);
    e.finish_transaction().unwrap();
    e.resume_after_transaction();
    p
}

fn count(e: &Engine, key: &str) -> Option<i64> {
    e.store_get("counts", key.as_bytes())
        .unwrap()
        .map(|v| I64Serde.deserialize(&v).unwrap())
}

/// The length of each changelog partition, to undo an aborted transaction's records.
fn mark(log: &MemoryChangelog) -> usize {
    log.records(&changelog_topic("app", "counts"), 0).len()
}

/// Drops the records written after `at`: the transaction that wrote them aborted.
fn abort_after(log: &MemoryChangelog, at: usize) {
    let topic = changelog_topic("app", "counts");
    let keep: Vec<u64> = log
        .records(&topic, 0)
        .iter()
        .take(at)
        .map(|(o, _)| *o)
        .collect();
    log.remove(&topic, 0, |o, _| !keep.contains(&o));
}

fn keys(n: usize) -> Vec<&'static str> {
    ["a", "b", "c", "d", "e"]
        .into_iter()
        .cycle()
        .take(n)
        .collect()
}

#[test]
fn state_is_written_only_once_its_transaction_commits_and_an_abort_rolls_it_back() {
    let (dir, log) = (
        tempfile::tempdir().unwrap(),
        Arc::new(MemoryChangelog::default()),
    );
    let mut e = engine(dir.path(), &log, None);
    dispatch(&mut e, 0, &keys(50));
    let first = commit(&mut e);
    assert_eq!(first.low_watermark, 50);
    assert_eq!(count(&e, "a"), Some(10));

    // A second transaction gets every range ready, then aborts instead of committing.
    let at = mark(&log);
    dispatch(&mut e, 50, &keys(50));
    idle(&e);
    let second = seal(&mut e);
    assert_eq!(second.low_watermark, 100);
    assert!(e.halt(Duration::from_secs(20)));
    abort_after(&log, at);
    drop(e);

    // What the aborted transaction did is nowhere: not in RocksDB, not in the changelog.
    let mut e = engine(dir.path(), &log, Some(&first));
    assert_eq!(count(&e, "a"), Some(10), "the aborted work is rolled back");
    // Processed again from the committed offsets: counted once.
    dispatch(&mut e, 50, &keys(50));
    commit(&mut e);
    for k in ["a", "b", "c", "d", "e"] {
        assert_eq!(count(&e, k), Some(20), "{k}");
    }
}

#[test]
fn a_crash_after_the_commit_and_before_the_state_write_restores_from_the_changelog() {
    let (dir, log) = (
        tempfile::tempdir().unwrap(),
        Arc::new(MemoryChangelog::default()),
    );
    let mut e = engine(dir.path(), &log, None);
    dispatch(&mut e, 0, &keys(50));
    commit(&mut e);
    dispatch(&mut e, 50, &keys(25));
    idle(&e);
    // The transaction commits (its records stay in the log); the process dies before writing.
    let second = seal(&mut e);
    assert!(e.halt(Duration::from_secs(20)));
    drop(e);
    let mut e = engine(dir.path(), &log, Some(&second));
    assert_eq!(
        count(&e, "a"),
        Some(15),
        "RocksDB caught up from the changelog"
    );
    // The committed offsets skip what the transaction covered.
    dispatch(&mut e, 75, &keys(5));
    commit(&mut e);
    assert_eq!(count(&e, "a"), Some(16));
}

#[test]
fn a_sealed_range_takes_no_records_until_its_transaction_commits() {
    let (dir, log) = (
        tempfile::tempdir().unwrap(),
        Arc::new(MemoryChangelog::default()),
    );
    let mut e = engine(dir.path(), &log, None);
    dispatch(&mut e, 0, &keys(30));
    idle(&e);
    let sealed = seal(&mut e);
    let processed = e.stats().processed();
    assert_eq!(
        processed, sealed.low_watermark,
        "the seal covers what was processed"
    );
    dispatch(&mut e, 30, &keys(30));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(e.stats().processed(), processed, "parked ranges wait");
    let outputs_before = log.records("out", 0).len();
    e.finish_transaction().unwrap();
    e.resume_after_transaction();
    assert!(e.wait_idle(Duration::from_secs(20)));
    assert_eq!(e.stats().processed(), 60);
    assert!(log.records("out", 0).len() >= outputs_before);
    let next = commit(&mut e);
    assert_eq!(next.low_watermark, 60);
    assert_eq!(count(&e, "a"), Some(12));
}

#[test]
fn a_seal_jumps_the_queue_so_a_transaction_does_not_wait_for_a_backlog() {
    let (dir, log) = (
        tempfile::tempdir().unwrap(),
        Arc::new(MemoryChangelog::default()),
    );
    let mut e = engine(dir.path(), &log, None);
    // A backlog far longer than one batch (the mailboxes hold 1000 each): the seal lands at
    // its front.
    dispatch(&mut e, 0, &keys(5000));
    let sealed = seal(&mut e);
    assert!(
        sealed.low_watermark < 5000,
        "sealed at {} of 5000: the transaction waited for the whole backlog",
        sealed.low_watermark
    );
    e.finish_transaction().unwrap();
    e.resume_after_transaction();
    idle(&e);
    let all = commit(&mut e);
    assert_eq!(all.low_watermark, 5000);
    assert_eq!(count(&e, "a"), Some(1000));
}

/// in -> `map_values_async` (a value `hold` waits until `release` is set) -> count("counts") ->
/// out.
fn counting_after_a_call(release: Arc<AtomicBool>) -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(move |v: String| {
            let release = release.clone();
            async move {
                while v == "hold" && !release.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Ok(v)
            }
        })
        .group_by_key()
        .count("counts")
        .to_stream()
        .to_with("out", Produced::with(StringSerde, I64Serde));
    Arc::new(b.build().unwrap())
}

/// The (key, count) outputs written to `out`, sorted.
fn outputs(log: &MemoryChangelog) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = log
        .records("out", 0)
        .into_iter()
        .map(|(_, r)| {
            let key = String::from_utf8(r.key.unwrap_or_default()).unwrap();
            (
                key,
                I64Serde.deserialize(&r.value.unwrap_or_default()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Issue 42 item 4: async stages under `exactly_once_v2`. A transaction sealed while a call is
/// open holds the outputs and offsets of the completed records only; after a crash the open
/// record (and the one queued behind it) run again, once.
#[test]
fn a_transaction_with_a_call_open_holds_completed_records_only() {
    let release = Arc::new(AtomicBool::new(false));
    let topology = counting_after_a_call(release.clone());
    let (dir, log) = (
        tempfile::tempdir().unwrap(),
        Arc::new(MemoryChangelog::default()),
    );
    let mut e = engine_of(topology.clone(), dir.path(), &log, None);
    let records = [
        ("a", "v"),
        ("h", "hold"),
        ("b", "v"),
        ("a", "v"),
        ("h", "hold"), // behind offset 1: same key
        ("c", "v"),
    ];
    dispatch_values(&mut e, 0, &records);
    let deadline = Instant::now() + Duration::from_secs(20);
    while e.stats().processed() < 4 {
        assert!(Instant::now() < deadline, "the free calls did not complete");
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = seal(&mut e);
    assert_eq!(
        first.low_watermark, 1,
        "the held record's offset stays open"
    );
    let done: Vec<(String, i64)> = [("a", 1), ("a", 2), ("b", 1), ("c", 1)]
        .map(|(k, n)| (k.to_string(), n))
        .to_vec();
    assert_eq!(outputs(&log), done, "nothing of the held key");
    e.finish_transaction().unwrap();
    e.resume_after_transaction();
    // The process dies with the call still open.
    assert!(e.halt(Duration::from_secs(20)));
    drop(e);
    release.store(true, Ordering::SeqCst);

    let mut e = engine_of(topology, dir.path(), &log, Some(&first));
    // Redelivered from the committed offset; the ranges skip what completed above it.
    dispatch_values(&mut e, 1, &records[1..]);
    let all = commit(&mut e);
    assert_eq!(all.low_watermark, 6);
    for (k, n) in [("a", 2), ("b", 1), ("c", 1), ("h", 2)] {
        assert_eq!(count(&e, k), Some(n), "{k}");
    }
    let mut want = done;
    want.extend([("h".to_string(), 1), ("h".to_string(), 2)]);
    want.sort();
    assert_eq!(outputs(&log), want, "every output once");
}

#[test]
fn a_write_before_an_async_stage_is_refused_under_exactly_once() {
    let b = StreamsBuilder::new();
    let s = b.stream("in", StringSerde, StringSerde);
    s.to_with("copy", Produced::with(StringSerde, StringSerde));
    s.map_values_async(|v: String| async move { Ok(v) })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let config = EngineConfig {
        application_id: "app".into(),
        transactional: true,
        ..EngineConfig::default()
    };
    let log = Arc::new(MemoryChangelog::default());
    let topology = Arc::new(b.build().unwrap());
    let e = Engine::new(topology, config, None, log, HashMap::new()).err();
    let text = e.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        text.contains("topic `copy` is written before async stage `map-values-async-0003` answers"),
        "{text}"
    );
}
