//! Restore against an in-memory changelog: crashes at each step of a commit, zombies, compaction.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rill_state::{StateConfig, StateDb};
use rill_topology::prelude::*;
use rill_topology::{key_hash, range_of, RawRecord, Topology};

use crate::engine::changelog::{changelog_topic, MemoryChangelog, COMMIT_HEADER, MARKER_HEADER};
use crate::engine::test_topologies::counting;
use crate::engine::{Engine, EngineConfig, PriorClaim, Resume, TopicPartition};
use crate::sink::{RecordSink, SinkError, Ticket};

/// The changelog of a process that may die: it appends and acknowledges changelog records while
/// its budget lasts; the record that exhausts it is appended unacknowledged when `ghost` (the
/// broker wrote it, the process never learned), and everything after is lost.
struct Dying {
    log: Arc<MemoryChangelog>,
    /// Changelog records still accepted; `u64::MAX`: no limit.
    budget: AtomicU64,
    ghost: AtomicBool,
}

impl Dying {
    fn new(log: &Arc<MemoryChangelog>) -> Arc<Self> {
        Arc::new(Dying {
            log: log.clone(),
            budget: AtomicU64::new(u64::MAX),
            ghost: AtomicBool::new(false),
        })
    }

    /// Dies after `n` more changelog records (the next one written but unacknowledged with
    /// `ghost`).
    fn die_after(&self, n: u64, ghost: bool) {
        self.ghost.store(ghost, Ordering::SeqCst);
        self.budget.store(n, Ordering::SeqCst);
    }
}

impl RecordSink for Dying {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: Ticket,
    ) -> Result<(), SinkError> {
        if !topic.ends_with("-changelog") {
            return self.log.send(topic, partition, record, ticket);
        }
        match self.budget.load(Ordering::SeqCst) {
            u64::MAX => self.log.send(topic, partition, record, ticket),
            0 => {
                if self.ghost.swap(false, Ordering::SeqCst) {
                    self.log.append(topic, partition.unwrap_or(0), record);
                }
                // Dropped unsettled: the sub-task sees a lost output and stops, as a crash would.
                drop(ticket);
                Ok(())
            }
            n => {
                self.budget.store(n - 1, Ordering::SeqCst);
                self.log.send(topic, partition, record, ticket)
            }
        }
    }
}

/// Puts `value` under the record's key in store `kv`, or deletes the key for `del`; also keeps
/// `by_value`: value -> key (a store keyed by something other than the routing key), and
/// forwards the previous key of the value.
struct KeyValue;

impl Processor<String, String, String, String> for KeyValue {
    fn process(
        &mut self,
        record: Record<String, String>,
        ctx: &mut ProcessorContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key.clone() else {
            return Ok(());
        };
        let kv = ctx.get_state_store::<String, String>("kv")?;
        if record.value == "del" {
            kv.delete(ctx, &key)?;
        } else {
            kv.put(ctx, &key, &record.value)?;
            let by_value = ctx.get_state_store::<String, String>("by_value")?;
            let previous = by_value.get(ctx, &record.value)?;
            by_value.put(ctx, &record.value, &key)?;
            ctx.forward(record.with_key_value(Some(key), previous.unwrap_or_default()));
        }
        Ok(())
    }
}

fn topology() -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("kv"),
        StringSerde,
        StringSerde,
    ))
    .add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("by_value"),
        StringSerde,
        StringSerde,
    ));
    b.stream("in", StringSerde, StringSerde)
        .process("key-value", || KeyValue, &["kv", "by_value"])
        .to_with("out", Produced::with(StringSerde, StringSerde));
    Arc::new(b.build().unwrap())
}

/// An engine over `dir` writing to `sink` and restoring from `log`, assigned partition 0 of
/// `in` with `prior` and `generation`, restored.
fn engine(
    topology: &Arc<Topology>,
    p: usize,
    dir: &Path,
    log: &Arc<MemoryChangelog>,
    sink: Arc<dyn RecordSink>,
    prior: PriorClaim,
    generation: i32,
) -> Engine {
    let mut e = restoring_engine(topology, p, dir, log, sink, prior, generation);
    assert!(e.wait_restored(Duration::from_secs(20)).unwrap());
    e
}

/// [`engine`] before its restore finished (the restore thread's result is taken only by
/// `finish_restores`).
fn restoring_engine(
    topology: &Arc<Topology>,
    p: usize,
    dir: &Path,
    log: &Arc<MemoryChangelog>,
    sink: Arc<dyn RecordSink>,
    prior: PriorClaim,
    generation: i32,
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
        parallelising_factor: p,
        worker_threads: 2,
        changelogs: true,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(topology.clone(), config, Some(db), sink, Default::default()).unwrap();
    e.restore_from(log.clone());
    let resume = Resume {
        claim: prior,
        generation,
        ..Resume::default()
    };
    e.assign("in", 0, resume).unwrap();
    e
}

/// The first owner of the task at factor `p` on a fresh state dir, writing to `log`.
fn first_owner(
    topology: &Arc<Topology>,
    p: usize,
    log: &Arc<MemoryChangelog>,
) -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(
        topology,
        p,
        dir.path(),
        log,
        log.clone(),
        PriorClaim::Unknown,
        0,
    );
    (dir, e)
}

/// The next owner at factor `p` after the state dir was lost: restored from `log` on a fresh
/// dir, writing to a sink of its own (returned).
fn owner_from_scratch(
    topology: &Arc<Topology>,
    p: usize,
    log: &Arc<MemoryChangelog>,
) -> (tempfile::TempDir, Engine, Arc<MemoryChangelog>) {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemoryChangelog::default());
    let e = engine(
        topology,
        p,
        dir.path(),
        log,
        sink.clone(),
        PriorClaim::None,
        1,
    );
    (dir, e, sink)
}

/// A healthy engine of `topology` at P = 4 whose changelog is `log`.
fn simple(topology: &Arc<Topology>, dir: &Path, log: &Arc<MemoryChangelog>) -> Engine {
    engine(topology, 4, dir, log, log.clone(), PriorClaim::Unknown, 0)
}

fn record(key: &str, value: &str) -> RawRecord {
    RawRecord {
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.as_bytes().to_vec()),
        timestamp: 0,
        headers: Headers::new(),
    }
}

/// Feeds `(key, value)` pairs from `offset` on and commits durably.
fn feed(e: &mut Engine, offset: u64, records: &[(&str, &str)]) {
    for (i, (k, v)) in records.iter().enumerate() {
        e.dispatch("in", 0, offset + i as u64, record(k, v))
            .unwrap();
    }
    e.request_durable_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
}

/// Feeds `(key, timestamp)` records from `offset` on and commits durably.
fn feed_at(e: &mut Engine, offset: u64, records: &[(&str, i64)]) {
    for (i, (k, ts)) in records.iter().enumerate() {
        let mut r = record(k, "x");
        r.timestamp = *ts;
        e.dispatch("in", 0, offset + i as u64, r).unwrap();
    }
    e.request_durable_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
}

/// A key whose routing hash lies in the lower (`upper == false`) or upper half of the hash space.
fn key_in_half(upper: bool) -> String {
    (0..)
        .map(|i| format!("key{i}"))
        .find(|k| (key_hash(k.as_bytes()) >= 1 << 63) == upper)
        .unwrap_or_default()
}

fn count(e: &Engine, key: &str) -> Option<i64> {
    e.store_get("counts", key.as_bytes())
        .unwrap()
        .map(|v| I64Serde.deserialize(&v).unwrap())
}

/// Every entry of `store`, as strings.
fn entries(e: &Engine, store: &str) -> BTreeMap<String, String> {
    e.store_entries(store)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

fn changelog_len(log: &MemoryChangelog, store: &str) -> usize {
    log.records(&changelog_topic("app", store), 0).len()
}

#[test]
fn a_lost_state_dir_is_rebuilt_exactly_from_the_changelog() {
    let log = Arc::new(MemoryChangelog::default());
    let first = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("k{}", i % 13)).collect();
    let records: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    {
        let mut e = simple(&counting(), first.path(), &log);
        feed(&mut e, 0, &records[..25]);
        feed(&mut e, 25, &records[25..]);
        assert_eq!(count(&e, "k0"), Some(4));
    }
    let fresh = tempfile::tempdir().unwrap();
    let mut e = simple(&counting(), fresh.path(), &log);
    assert!(e.stats().restored() > 0);
    for i in 0..13 {
        let k = format!("k{i}");
        let expected = keys.iter().filter(|x| **x == k).count() as i64;
        assert_eq!(count(&e, &k), Some(expected), "{k}");
    }
    // Replayed input is skipped by every range (restored progress), new input counts.
    feed(&mut e, 0, &records);
    assert_eq!(count(&e, "k0"), Some(4));
    feed(&mut e, 40, &[("k0", "v")]);
    assert_eq!(count(&e, "k0"), Some(5));
}

#[test]
fn an_intact_state_dir_reads_only_the_changelog_tail() {
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("k{}", i % 50)).collect();
    let records: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    {
        let mut e = simple(&counting(), dir.path(), &log);
        for round in 0..4 {
            feed(&mut e, round * 50, &records[round as usize * 50..][..50]);
        }
    }
    let written = changelog_len(&log, "counts") as u64;
    let e = simple(&counting(), dir.path(), &log);
    assert!(
        e.stats().restored() < written / 4,
        "re-read {} of {written}",
        e.stats().restored()
    );
    assert_eq!(count(&e, "k7"), Some(4));
}

/// A crash between the markers of a two-store commit: the first store's changelog has the
/// newer marker, the last store's does not. Restore applies the older commit to both.
#[test]
fn a_commit_without_its_last_stores_marker_is_applied_to_no_store() {
    let b = StreamsBuilder::new();
    let grouped = b.stream("in", StringSerde, StringSerde).group_by_key();
    grouped.count("first");
    grouped.count("second");
    let topology = Arc::new(b.build().unwrap());
    let stores = topology.sub_topologies()[0].stores.clone();
    assert_eq!(stores.len(), 2);
    let get = |e: &Engine, store: &str| {
        e.store_get(store, b"k")
            .unwrap()
            .map(|v| I64Serde.deserialize(&v).unwrap())
    };
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    {
        let mut e = engine(
            &topology,
            1,
            dir.path(),
            &log,
            log.clone(),
            PriorClaim::Unknown,
            0,
        );
        feed(&mut e, 0, &[("k", "v"), ("k", "v")]);
        feed(&mut e, 2, &[("k", "v")]);
        assert_eq!((get(&e, "first"), get(&e, "second")), (Some(3), Some(3)));
    }
    // Drop the last store's newest marker, as if the process died before sending it.
    let last = changelog_topic("app", &stores[1]);
    let newest = log
        .records(&last, 0)
        .iter()
        .rev()
        .find(|(_, r)| r.headers.last(MARKER_HEADER).is_some())
        .map(|(o, _)| *o)
        .unwrap();
    log.remove(&last, 0, |o, _| o == newest);
    let fresh = tempfile::tempdir().unwrap();
    let mut e = engine(
        &topology,
        1,
        fresh.path(),
        &log,
        log.clone(),
        PriorClaim::Unknown,
        0,
    );
    assert_eq!(
        (get(&e, "first"), get(&e, "second")),
        (Some(2), Some(2)),
        "both stores at the last commit every store confirmed"
    );
    // The input of the unconfirmed commit is processed again, once.
    feed(&mut e, 0, &[("k", "v"), ("k", "v"), ("k", "v")]);
    assert_eq!((get(&e, "first"), get(&e, "second")), (Some(3), Some(3)));
}

/// Issue 10, item 2: a commit dies after its data was written but before its marker; the next
/// owner commits fewer offsets; a restore from scratch must not adopt the dead commit's leftovers
/// (values, nor tombstones of committed keys), also after log compaction.
#[test]
fn leftovers_of_a_commit_that_died_before_its_marker_are_never_restored() {
    let topology = topology();
    let log = Arc::new(MemoryChangelog::default());
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let committed = [("a", "1"), ("b", "1"), ("c", "1")];
    let dying = Dying::new(&log);
    {
        let mut a = engine(
            &topology,
            1,
            a_dir.path(),
            &log,
            dying.clone(),
            PriorClaim::Unknown,
            1,
        );
        feed(&mut a, 0, &committed);
        // The next commit: new values for a, a delete of b, a new key d. Its data records
        // (kv: a, b, d; by_value: 2) reach the log; its markers never do.
        for (i, (k, v)) in [("a", "2"), ("b", "del"), ("d", "2")].iter().enumerate() {
            a.dispatch("in", 0, 3 + i as u64, record(k, v)).unwrap();
        }
        dying.die_after(4, false);
        a.request_durable_commit();
        assert!(a.wait_idle(Duration::from_secs(20)));
        assert!(a.failure().is_some(), "the process died mid-commit");
    }
    let marker_count = |log: &MemoryChangelog| {
        log.records(&changelog_topic("app", "by_value"), 0)
            .iter()
            .filter(|(_, r)| r.headers.last(MARKER_HEADER).is_some())
            .count()
    };
    assert_eq!(marker_count(&log), 1, "the dead commit left no marker");
    // The next owner (another member, fresh dir) replays offsets 3.. but commits only offset 3.
    {
        let mut b = engine(
            &topology,
            1,
            b_dir.path(),
            &log,
            log.clone(),
            PriorClaim::None,
            2,
        );
        assert_eq!(entries(&b, "kv").get("b").map(String::as_str), Some("1"));
        feed(&mut b, 3, &[("a", "3")]);
    }
    let expected: BTreeMap<String, String> = [("a", "3"), ("b", "1"), ("c", "1")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for compacted in [false, true] {
        if compacted {
            for store in ["kv", "by_value"] {
                log.compact(&changelog_topic("app", store), 0, u64::MAX, true);
            }
        }
        let fresh = tempfile::tempdir().unwrap();
        let c = engine(
            &topology,
            1,
            fresh.path(),
            &log,
            log.clone(),
            PriorClaim::None,
            3,
        );
        assert_eq!(entries(&c, "kv"), expected, "compacted: {compacted}");
        assert_eq!(
            entries(&c, "by_value").get("2"),
            None,
            "compacted: {compacted}"
        );
    }
}

/// A crash after the last marker was written but before the process learned it: the commit is
/// complete in the changelog (restore applies it), while the local state lacks it.
#[test]
fn a_marker_written_but_unacknowledged_completes_its_commit() {
    let topology = counting();
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let dying = Dying::new(&log);
    {
        let mut a = engine(
            &topology,
            1,
            dir.path(),
            &log,
            dying.clone(),
            PriorClaim::Unknown,
            1,
        );
        feed(&mut a, 0, &[("k", "v")]);
        a.dispatch("in", 0, 1, record("k", "v")).unwrap();
        // One data record, then the marker: written, never acknowledged.
        dying.die_after(1, true);
        a.request_durable_commit();
        assert!(a.wait_idle(Duration::from_secs(20)));
        assert!(a.failure().is_some());
    }
    // Same dir (a restart): local progress is at offset 1, the changelog has the commit of 2.
    let mut e = engine(
        &topology,
        1,
        dir.path(),
        &log,
        log.clone(),
        PriorClaim::Unknown,
        2,
    );
    assert_eq!(count(&e, "k"), Some(2));
    feed(&mut e, 0, &[("k", "v"), ("k", "v"), ("k", "v")]);
    assert_eq!(
        count(&e, "k"),
        Some(3),
        "offsets 0 and 1 skipped, 2 counted"
    );
}

/// Issue 10, item 3: the store `by_value` is keyed by the record's value, not its key. Restore
/// must put each entry in the range of the input record that wrote it, where that range's
/// processor finds it again.
#[test]
fn restore_puts_entries_in_the_range_that_wrote_them() {
    let p = 4;
    // A key and a value whose hashes fall in different ranges.
    let (key, value) = (0..)
        .map(|i| (format!("key{i}"), format!("value{i}")))
        .find(|(k, v)| range_of(key_hash(k.as_bytes()), p) != range_of(key_hash(v.as_bytes()), p))
        .unwrap();
    let topology = topology();
    let log = Arc::new(MemoryChangelog::default());
    {
        let (_dir, mut e) = first_owner(&topology, p, &log);
        feed(&mut e, 0, &[(&key, &value)]);
    }
    let (_dir, mut e, sink) = owner_from_scratch(&topology, p, &log);
    feed(&mut e, 1, &[(&key, &value)]);
    let out: Vec<String> = sink
        .records("out", 0)
        .into_iter()
        .map(|(_, r)| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    assert_eq!(
        out,
        vec![key.clone()],
        "the range found its own entry after the restore"
    );
}

mod bases;
mod emit_final;
mod hashes;
mod store_options;
mod versioned;
mod zombies;

/// A live factor change that comes while a task restores skips it; once the task runs it is
/// behind the factor asked for, which `factors_behind` reports (the Kafka source then changes
/// it), and a change of that partition clears it.
#[test]
fn a_task_restoring_during_a_live_change_is_reported_behind_once_it_runs() {
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let sink: Arc<dyn RecordSink> = log.clone();
    let mut e = restoring_engine(&counting(), 2, dir.path(), &log, sink, PriorClaim::None, 1);
    // Still restoring: the restore thread's result is taken only by `finish_restores`.
    let change = e
        .set_parallelising_factor(4, None, Duration::from_secs(20))
        .unwrap();
    assert!(
        change
            .skipped
            .iter()
            .any(|(p, why)| *p == 0 && why.contains("restoring")),
        "{:?}",
        change.skipped
    );
    assert!(e.wait_restored(Duration::from_secs(20)).unwrap());
    assert_eq!(e.factors_behind(), [(0, 4)]);
    e.set_parallelising_factor(4, Some(&[0]), Duration::from_secs(20))
        .unwrap();
    assert!(e.factors_behind().is_empty());
    assert!(e.factors().values().all(|f| *f == 4));
}

/// Issue 43: a read routed to its key's partition answers while another partition of the store
/// restores (a failover's survivor serves its own keys); a scan, or a read routed to the
/// restoring partition, answers `Restoring`.
#[test]
fn a_read_routed_to_a_running_partition_does_not_wait_for_one_that_restores() {
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let sink: Arc<dyn RecordSink> = log.clone();
    let mut e = engine(&counting(), 2, dir.path(), &log, sink, PriorClaim::None, 1);
    // Partition 1 stays restoring: the restore thread's result is taken only by
    // `finish_restores`.
    let resume = Resume {
        claim: PriorClaim::None,
        generation: 1,
        ..Resume::default()
    };
    e.assign("in", 1, resume).unwrap();
    let store = counting().sub_topologies()[0].stores[0].clone();
    let hash = Some(key_hash(b"k"));
    let restoring = |r: Result<_, crate::query::QueryError>| matches!(r, Err(crate::query::QueryError::Restoring { partitions, .. }) if partitions == [1]);
    assert!(e.query_ranges(&store, hash, Some(0)).is_ok());
    assert!(restoring(e.query_ranges(&store, hash, Some(1))));
    assert!(restoring(e.query_ranges(&store, hash, None)));
}

/// Issue 43: a task another member ran before answers queries only once it has taken its input
/// up to the end offset read at its assignment. Its previous owner may have answered from
/// records past its last commit; a read here must not go back behind those answers.
#[test]
fn a_taken_over_task_answers_queries_once_it_has_caught_up_with_the_input_end() {
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let sink: Arc<dyn RecordSink> = log.clone();
    let mut e = engine(&counting(), 2, dir.path(), &log, sink, PriorClaim::None, 1);
    let resume = Resume {
        claim: PriorClaim::None,
        generation: 1,
        end: Some(3),
        ..Resume::default()
    };
    e.assign("in", 1, resume).unwrap();
    assert!(e.wait_restored(Duration::from_secs(20)).unwrap());
    let store = counting().sub_topologies()[0].stores[0].clone();
    let hash = Some(key_hash(b"k"));
    let catching_up = |r: Result<_, crate::query::QueryError>| matches!(r, Err(crate::query::QueryError::Restoring { partitions, .. }) if partitions == [1]);
    e.tick_quiet_ranges();
    assert!(catching_up(e.query_ranges(&store, hash, Some(1))));
    assert!(
        e.query_ranges(&store, hash, Some(0)).is_ok(),
        "a task without an end to reach answers at once"
    );
    for offset in 0..2 {
        e.dispatch("in", 1, offset, record("k", "v")).unwrap();
    }
    assert!(e.wait_idle(Duration::from_secs(20)));
    e.tick_quiet_ranges();
    assert!(
        catching_up(e.query_ranges(&store, hash, Some(1))),
        "offset 2 is not taken yet"
    );
    e.dispatch("in", 1, 2, record("other", "v")).unwrap();
    e.tick_quiet_ranges();
    assert!(e.wait_idle(Duration::from_secs(20)));
    assert!(e.query_ranges(&store, hash, Some(1)).is_ok());
    assert!(e.query_ranges(&store, hash, None).is_ok());
}
