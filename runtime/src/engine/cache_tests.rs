//! The record cache in the engine: one downstream record per key and commit, eviction over the
//! budget, no caching towards repartition topics, and (property) the last update of every key
//! always arrives, against an oracle count.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rill_state::{StateConfig, StateDb};
use rill_topology::prelude::*;
use rill_topology::RawRecord;

use super::*;
use crate::sink::{MemorySink, Sent};

use super::test_topologies::{counting, counting_as};

fn engine(
    topology: Arc<Topology>,
    p: usize,
    cache: usize,
    dir: &std::path::Path,
    sink: Arc<MemorySink>,
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
        cache_max_bytes: cache,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(topology, config, Some(db), sink, HashMap::new()).unwrap();
    e.assign("in", 0, Resume::default()).unwrap();
    e
}

fn feed(e: &mut Engine, from: u64, keys: &[String]) {
    for (i, k) in keys.iter().enumerate() {
        let raw = RawRecord {
            key: Some(k.as_bytes().to_vec()),
            value: Some(b"v".to_vec()),
            timestamp: 0,
            headers: Headers::new(),
        };
        assert!(!matches!(
            e.dispatch("in", 0, from + i as u64, raw).unwrap(),
            Dispatch::Full(_)
        ));
    }
    assert!(e.wait_idle(Duration::from_secs(20)));
}

fn commit(e: &mut Engine) {
    e.request_durable_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
    e.collect_progress();
}

/// (key, count) of each record sent.
fn counts(sent: Sent) -> Vec<(String, i64)> {
    sent.into_iter()
        .map(|(_, r)| {
            (
                String::from_utf8(r.key.unwrap()).unwrap(),
                I64Serde.deserialize(&r.value.unwrap()).unwrap(),
            )
        })
        .collect()
}

fn keys(names: &[&str], times: usize) -> Vec<String> {
    (0..times)
        .flat_map(|_| names.iter().map(|s| s.to_string()))
        .collect()
}

#[test]
fn a_commit_sends_one_update_per_key_with_its_last_count() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(counting(), 2, 1 << 20, dir.path(), sink.clone());
    feed(&mut e, 0, &keys(&["a", "b", "c"], 30));
    assert!(
        sink.take("out").is_empty(),
        "nothing leaves before the commit"
    );
    commit(&mut e);
    let mut got = counts(sink.take("out"));
    got.sort();
    assert_eq!(
        got,
        vec![("a".into(), 30), ("b".into(), 30), ("c".into(), 30)]
    );
    feed(&mut e, 90, &keys(&["b"], 5));
    commit(&mut e);
    assert_eq!(
        counts(sink.take("out")),
        vec![("b".into(), 35)],
        "only the key updated"
    );
}

#[test]
fn without_a_cache_every_update_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(counting(), 2, 0, dir.path(), sink.clone());
    feed(&mut e, 0, &keys(&["a"], 4));
    let got: Vec<i64> = counts(sink.take("out"))
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(got, vec![1, 2, 3, 4]);
}

/// in -> group_by_key -> 100 ms tumbling windows -> count, materialized as `materialized` says
/// -> out (the windowed key's key).
fn windowed_counting_as(materialized: Materialized<String, i64>) -> Arc<Topology> {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(Duration::from_millis(
            100,
        )))
        .count(materialized)
        .to_stream()
        .map(|k: Option<Windowed<String>>, n: i64| (k.map(|w| w.key).unwrap_or_default(), n))
        .to_with("out", Produced::with(StringSerde, I64Serde));
    Arc::new(builder.build().unwrap())
}

/// Issue 42, item 5: `Materialized::with_caching_disabled` gives Kafka Streams' meaning to the
/// flag: with the record cache on, a count with caching disabled forwards every update, one
/// with caching enabled (the default) the last one per key at the commit.
#[test]
fn a_count_with_caching_disabled_forwards_every_update_despite_the_cache() {
    let tables = [
        (
            "count",
            counting_as as fn(Materialized<String, i64>) -> Arc<Topology>,
        ),
        ("windowed count", windowed_counting_as),
    ];
    for (what, table) in tables {
        let run = |materialized: Materialized<String, i64>| {
            let dir = tempfile::tempdir().unwrap();
            let sink = Arc::new(MemorySink::new());
            let mut e = engine(table(materialized), 2, 1 << 20, dir.path(), sink.clone());
            feed(&mut e, 0, &keys(&["a", "b"], 10));
            commit(&mut e);
            let mut got = counts(sink.take("out"));
            got.sort();
            got
        };
        let every: Vec<(String, i64)> = ["a", "b"]
            .iter()
            .flat_map(|k| (1..=10).map(move |n| (k.to_string(), n)))
            .collect();
        let disabled = run(Materialized::named("counts").with_caching_disabled());
        assert_eq!(disabled, every, "{what}: caching disabled");
        let enabled = run(Materialized::named("counts").with_caching_enabled());
        let last = vec![("a".to_string(), 10), ("b".to_string(), 10)];
        assert_eq!(enabled, last, "{what}: caching enabled");
    }
}

#[test]
fn a_full_cache_sends_its_least_recently_updated_key_early() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    // Room for two entries (key of 1 byte, count of 8, plus the overhead), at P = 1.
    let room = 2 * (rill_topology::cache::ENTRY_OVERHEAD + 9);
    let mut e = engine(counting(), 1, room, dir.path(), sink.clone());
    feed(&mut e, 0, &keys(&["a", "b", "c"], 2));
    // a b c a b c: each put of a third key evicts the oldest one.
    assert_eq!(
        counts(sink.take("out")),
        vec![
            ("a".into(), 1),
            ("b".into(), 1),
            ("c".into(), 1),
            ("a".into(), 2)
        ]
    );
    commit(&mut e);
    assert_eq!(
        counts(sink.take("out")),
        vec![("b".into(), 2), ("c".into(), 2)]
    );
}

#[test]
fn an_aggregation_feeding_a_repartition_topic_sends_every_update() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count("per-key")
        .to_stream()
        .group_by(|_k, n: &i64| *n, Grouped::with(I64Serde, I64Serde))
        .count("per-count");
    let topology = Arc::new(builder.build().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(topology, 2, 1 << 20, dir.path(), sink.clone());
    feed(&mut e, 0, &keys(&["a"], 5));
    let repartition: Vec<String> = sink
        .topics()
        .into_iter()
        .filter(|t| t.ends_with("-repartition"))
        .collect();
    assert_eq!(repartition.len(), 1, "topics: {:?}", sink.topics());
    assert_eq!(
        sink.take(&repartition[0]).len(),
        5,
        "every update of `per-key` goes to the repartition topic at once"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the budget, factor and commit points: per key the counts sent only grow, and
    /// after the last commit the last one sent is the oracle's count.
    #[test]
    fn the_last_update_of_every_key_arrives(
        batches in proptest::collection::vec(proptest::collection::vec(0u8..6, 0..40), 1..6),
        p in 1usize..4,
        cache in prop_oneof![Just(0usize), Just(150), Just(400), Just(1 << 20)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let sink = Arc::new(MemorySink::new());
        let mut e = engine(counting(), p, cache, dir.path(), sink.clone());
        let mut oracle: HashMap<String, i64> = HashMap::new();
        let mut last: HashMap<String, i64> = HashMap::new();
        let mut offset = 0;
        for batch in batches {
            let ks: Vec<String> = batch.iter().map(|k| format!("k{k}")).collect();
            for k in &ks {
                *oracle.entry(k.clone()).or_default() += 1;
            }
            feed(&mut e, offset, &ks);
            offset += ks.len() as u64;
            commit(&mut e);
            for (k, n) in counts(sink.take("out")) {
                let before = last.insert(k.clone(), n);
                prop_assert!(before.is_none_or(|b| b < n), "{k}: {before:?} then {n}");
            }
            prop_assert_eq!(&last, &oracle);
        }
    }
}

/// in -> tumbling windows of 10 ms, grace 5 -> count -> suppress until the window closes ->
/// out (`<key>@<start>`, count).
fn final_counts() -> Arc<Topology> {
    use rill_topology::window::{BufferConfig, Suppressed, TimeWindows, Windowed};
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_and_grace(
            Duration::from_millis(10),
            Duration::from_millis(5),
        ))
        .count("windows")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
        })
        .to_with("out", Produced::with(StringSerde, I64Serde));
    Arc::new(builder.build().unwrap())
}

/// Runs `records` (key, timestamp) through [`final_counts`], committing after the records whose
/// index is in `commits`, then at the end; returns every record sent, sorted.
fn run_final_counts(
    p: usize,
    cache: usize,
    records: &[(u8, i64)],
    commits: &[usize],
) -> Vec<(String, i64)> {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(final_counts(), p, cache, dir.path(), sink.clone());
    for (i, (k, ts)) in records.iter().enumerate() {
        let raw = RawRecord {
            key: Some(format!("k{k}").into_bytes()),
            value: Some(b"v".to_vec()),
            timestamp: *ts,
            headers: Headers::new(),
        };
        assert!(!matches!(
            e.dispatch("in", 0, i as u64, raw).unwrap(),
            Dispatch::Full(_)
        ));
        if commits.contains(&i) {
            assert!(e.wait_idle(Duration::from_secs(20)));
            commit(&mut e);
        }
    }
    assert!(e.wait_idle(Duration::from_secs(20)));
    commit(&mut e);
    let mut out = counts(sink.take("out"));
    out.sort();
    out
}

/// The case the property below looks for, spelled out: `k0`'s window is held with count 1 by
/// the first commit; `k2` then `k0` update their windows and `k1` moves stream time past them.
/// Were the cached `k2` update delivered at the latest stream time, the buffer would release
/// `k0`'s window with count 1 before its count of 2 arrived, and then again.
#[test]
fn a_cached_update_does_not_release_a_window_early() {
    let records = [(0, 1), (2, 2), (0, 3), (1, 30)];
    let expected = vec![("k0@0".to_string(), 2), ("k2@0".to_string(), 1)];
    assert_eq!(run_final_counts(1, 0, &records, &[]), expected);
    assert_eq!(run_final_counts(1, 1 << 20, &records, &[0]), expected);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A cache in front of a suppression buffer changes nothing it emits: every window once,
    /// with its final count, as without a cache (updates leave the cache with the stream time
    /// they were made at, so a later update waiting in the cache cannot close a window early).
    #[test]
    fn emit_final_behind_a_cache_emits_what_it_emits_without(
        records in proptest::collection::vec((0u8..3, 0i64..80), 1..60),
        commits in proptest::collection::vec(0usize..60, 0..4),
        p in 1usize..3,
        cache in prop_oneof![Just(150usize), Just(400), Just(1 << 20)],
    ) {
        let without = run_final_counts(p, 0, &records, &[]);
        let with = run_final_counts(p, cache, &records, &commits);
        prop_assert_eq!(with, without);
    }
}
