//! Store builder options against restores and factor changes:
//! - stores built `with_logging_disabled`: no changelog, kept by the local state dir through
//!   restarts and factor changes, empty after a restore from the changelogs (Kafka Streams'
//!   meaning of an unlogged store);
//! - in-memory stores: on the heap, kept through factor changes, restored from their changelogs
//!   at every process start.

use std::collections::BTreeSet;

use super::*;
use crate::engine::test_topologies::counting_as;

/// A persistent key-value store of strings.
fn persistent(name: &str) -> StoreBuilder<String, String> {
    Stores::key_value_store_builder(
        Stores::persistent_key_value_store(name),
        StringSerde,
        StringSerde,
    )
}

/// An in-memory key-value store of strings.
fn in_memory(name: &str) -> StoreBuilder<String, String> {
    Stores::key_value_store_builder(
        Stores::in_memory_key_value_store(name),
        StringSerde,
        StringSerde,
    )
}

/// [`topology`]'s processor over `kv` (logged unless `kv_unlogged`) and `by_value` (unlogged).
fn half_logged(kv_unlogged: bool) -> Arc<Topology> {
    let kv = persistent("kv");
    with_stores(
        if kv_unlogged {
            kv.with_logging_disabled()
        } else {
            kv
        },
        persistent("by_value").with_logging_disabled(),
    )
}

/// [`topology`]'s processor over `kv` and `by_value` built as given.
fn with_stores(
    kv: StoreBuilder<String, String>,
    by_value: StoreBuilder<String, String>,
) -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.add_state_store(kv).add_state_store(by_value);
    b.stream("in", StringSerde, StringSerde)
        .process("key-value", || KeyValue, &["kv", "by_value"])
        .to_with("out", Produced::with(StringSerde, StringSerde));
    Arc::new(b.build().unwrap())
}

/// 30 records `k<i % 11>` -> `v<i>`.
fn input() -> Vec<(String, String)> {
    (0..30)
        .map(|i| (format!("k{}", i % 11), format!("v{i}")))
        .collect()
}

fn feed_all(e: &mut Engine, offset: u64, records: &[(String, String)]) {
    let pairs: Vec<(&str, &str)> = records
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    feed(e, offset, &pairs);
}

/// What `by_value` must hold after `records`: each value -> the key that wrote it.
fn by_value_of(records: &[(String, String)]) -> BTreeMap<String, String> {
    records
        .iter()
        .map(|(k, v)| (v.clone(), k.clone()))
        .collect()
}

#[test]
fn only_logged_stores_have_changelogs() {
    let topology = half_logged(false);
    let sub = &topology.sub_topologies()[0];
    assert_eq!(sub.stores, vec!["kv".to_string(), "by_value".to_string()]);
    assert_eq!(sub.logged, vec!["kv".to_string()]);
    let log = Arc::new(MemoryChangelog::default());
    let (_dir, mut e) = first_owner(&topology, 4, &log);
    feed_all(&mut e, 0, &input());
    assert!(changelog_len(&log, "kv") > 0);
    assert_eq!(
        changelog_len(&log, "by_value"),
        0,
        "an unlogged store wrote its changelog"
    );
}

#[test]
fn an_unlogged_store_keeps_its_entries_through_factor_changes_and_restarts() {
    let topology = half_logged(false);
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let records = input();
    let want = by_value_of(&records);
    {
        let mut e = simple(&topology, dir.path(), &log);
        feed_all(&mut e, 0, &records[..15]);
        for p in [1, 3, 8] {
            e.set_parallelising_factor(p, None, Duration::from_secs(20))
                .unwrap();
        }
        feed_all(&mut e, 15, &records[15..]);
        assert_eq!(entries(&e, "by_value"), want);
        e.set_parallelising_factor(2, None, Duration::from_secs(20))
            .unwrap();
        assert_eq!(entries(&e, "by_value"), want);
    }
    // A restart on the same state dir at another factor (re-split at start).
    let e = simple(&topology, dir.path(), &log);
    assert_eq!(entries(&e, "by_value"), want);
    assert_eq!(entries(&e, "kv")["k3"], "v25");
}

#[test]
fn a_restore_from_the_changelogs_starts_an_unlogged_store_empty_and_skips_replayed_input() {
    let topology = half_logged(false);
    let log = Arc::new(MemoryChangelog::default());
    let records = input();
    let kv_before = {
        let (_dir, mut e) = first_owner(&topology, 2, &log);
        feed_all(&mut e, 0, &records);
        entries(&e, "kv")
    };
    let (_dir, mut e, _sink) = owner_from_scratch(&topology, 3, &log);
    assert_eq!(entries(&e, "kv"), kv_before);
    assert!(entries(&e, "by_value").is_empty());
    // The input the old owner committed is not processed again, for either store.
    feed_all(&mut e, 0, &records);
    assert!(entries(&e, "by_value").is_empty());
    assert_eq!(entries(&e, "kv"), kv_before);
    let more = vec![("k1".to_string(), "new".to_string())];
    feed_all(&mut e, 30, &more);
    assert_eq!(entries(&e, "by_value"), by_value_of(&more));
}

#[test]
fn a_distrusted_state_dir_clears_its_unlogged_stores() {
    for all_unlogged in [false, true] {
        let topology = half_logged(all_unlogged);
        let log = Arc::new(MemoryChangelog::default());
        let dir = tempfile::tempdir().unwrap();
        let records = input();
        {
            let mut e = simple(&topology, dir.path(), &log);
            feed_all(&mut e, 0, &records);
        }
        if all_unlogged {
            assert_eq!(
                changelog_len(&log, "kv") + changelog_len(&log, "by_value"),
                0
            );
        }
        // Another member owned the task since (the group names a lineage the local state does
        // not know): what only this dir held is stale, so it goes.
        let sink = Arc::new(MemoryChangelog::default());
        let e = engine(
            &topology,
            4,
            dir.path(),
            &log,
            sink,
            PriorClaim::Lineage(u64::MAX),
            7,
        );
        assert!(
            entries(&e, "by_value").is_empty(),
            "all unlogged: {all_unlogged}"
        );
        let kv = entries(&e, "kv");
        if all_unlogged {
            assert!(kv.is_empty());
        } else {
            assert_eq!(kv["k3"], "v25");
        }
    }
}

/// `kv` in memory (logged), `by_value` persistent.
fn kv_in_memory() -> Arc<Topology> {
    with_stores(in_memory("kv"), persistent("by_value"))
}

/// What `kv` must hold after `records`: the last value per key.
fn kv_of(records: &[(String, String)]) -> BTreeMap<String, String> {
    records.iter().cloned().collect()
}

#[test]
fn an_in_memory_store_is_restored_at_every_process_start_and_kept_through_factor_changes() {
    let topology = kv_in_memory();
    assert_eq!(topology.in_memory_stores(), vec!["kv".to_string()]);
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let records = input();
    {
        let mut e = simple(&topology, dir.path(), &log);
        feed_all(&mut e, 0, &records[..15]);
        for p in [1, 3, 8] {
            e.set_parallelising_factor(p, None, Duration::from_secs(20))
                .unwrap();
            assert_eq!(entries(&e, "kv"), kv_of(&records[..15]), "P = {p}");
        }
        feed_all(&mut e, 15, &records[15..]);
        assert_eq!(entries(&e, "kv"), kv_of(&records));
        assert_eq!(entries(&e, "by_value"), by_value_of(&records));
    }
    // Nothing of `kv` is on disk.
    let on_disk = rill_state::inspect::inspect(dir.path(), Default::default()).unwrap();
    let stores_on_disk: BTreeSet<&str> = on_disk
        .column_families
        .iter()
        .map(|cf| cf.id.store.as_str())
        .collect();
    assert_eq!(stores_on_disk, BTreeSet::from(["by_value"]));
    // A new process on the same state dir (at P = 4: a re-split at start) restores `kv` from its
    // changelog, and with it the persistent store, whose progress was ahead of the lost one.
    let mut e = simple(&topology, dir.path(), &log);
    assert!(e.stats().restored() > 0);
    assert_eq!(entries(&e, "kv"), kv_of(&records));
    assert_eq!(entries(&e, "by_value"), by_value_of(&records));
    // Replayed input is skipped by every range, new input is applied.
    feed_all(&mut e, 0, &records);
    assert_eq!(entries(&e, "by_value"), by_value_of(&records));
    let more = vec![("k1".to_string(), "new".to_string())];
    feed_all(&mut e, 30, &more);
    assert_eq!(entries(&e, "kv")["k1"], "new");
}

#[test]
fn an_unlogged_in_memory_store_starts_empty_in_a_new_process_without_a_restore() {
    let topology = with_stores(
        in_memory("kv").with_logging_disabled(),
        persistent("by_value"),
    );
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let records = input();
    {
        let mut e = simple(&topology, dir.path(), &log);
        feed_all(&mut e, 0, &records);
        assert_eq!(entries(&e, "kv"), kv_of(&records));
    }
    let e = simple(&topology, dir.path(), &log);
    assert!(entries(&e, "kv").is_empty());
    assert_eq!(entries(&e, "by_value"), by_value_of(&records));
    assert_eq!(changelog_len(&log, "kv"), 0);
}

#[test]
fn the_dsl_materializes_in_memory_and_unlogged_stores() {
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(&str, &str)> = (0..20)
        .map(|i| if i % 3 == 0 { ("a", "x") } else { ("b", "x") })
        .collect();
    let in_memory = counting_as(Materialized::named("counts").in_memory());
    assert_eq!(in_memory.in_memory_stores(), vec!["counts".to_string()]);
    {
        let mut e = simple(&in_memory, dir.path(), &log);
        feed(&mut e, 0, &records);
        assert_eq!((count(&e, "a"), count(&e, "b")), (Some(7), Some(13)));
    }
    let mut e = simple(&in_memory, dir.path(), &log);
    assert!(e.stats().restored() > 0);
    assert_eq!((count(&e, "a"), count(&e, "b")), (Some(7), Some(13)));
    feed(&mut e, 20, &[("a", "x")]);
    assert_eq!(count(&e, "a"), Some(8));

    let unlogged = counting_as(Materialized::named("counts").with_logging_disabled());
    assert!(unlogged.sub_topologies()[0].logged.is_empty());
    assert!(unlogged.in_memory_stores().is_empty());
    let log = Arc::new(MemoryChangelog::default());
    let (_dir, mut e) = first_owner(&unlogged, 2, &log);
    feed(&mut e, 0, &records);
    assert_eq!(count(&e, "a"), Some(7));
    assert_eq!(changelog_len(&log, "counts"), 0);
}

/// Every data record of `store`'s changelog as (key, value), in log order.
fn changelog_data(log: &MemoryChangelog, store: &str) -> Vec<(String, String)> {
    log.records(&changelog_topic("app", store), 0)
        .into_iter()
        .filter(|(_, r)| r.headers.last(COMMIT_HEADER).is_some())
        .map(|(_, r)| {
            let text = |b: Option<Vec<u8>>| String::from_utf8(b.unwrap_or_default()).unwrap();
            (text(r.key), text(r.value))
        })
        .collect()
}

#[test]
fn a_store_without_caching_sends_every_write_to_its_changelog() {
    let topology = with_stores(
        persistent("kv").with_caching_disabled(),
        persistent("by_value"),
    );
    assert_eq!(topology.uncached_stores(), vec!["kv".to_string()]);
    let log = Arc::new(MemoryChangelog::default());
    let records: Vec<(String, String)> = [("a", "1"), ("a", "2"), ("b", "3"), ("a", "4")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    {
        // One commit: the cached store logs each key once, the uncached one every write.
        let (_dir, mut e) = first_owner(&topology, 2, &log);
        feed_all(&mut e, 0, &records);
        feed_all(&mut e, 4, &[("a".to_string(), "5".to_string())]);
    }
    let kv = changelog_data(&log, "kv");
    let of = |key: &str| -> Vec<String> {
        kv.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    };
    assert_eq!(of("a"), vec!["1", "2", "4", "5"]);
    assert_eq!(of("b"), vec!["3"]);
    let by_value = changelog_data(&log, "by_value");
    assert_eq!(by_value.len(), 5, "{by_value:?}");
    // A restore from the changelogs ends at each key's last write.
    let (_dir, e, _sink) = owner_from_scratch(&topology, 3, &log);
    assert_eq!(
        entries(&e, "kv"),
        BTreeMap::from([("a".into(), "5".into()), ("b".into(), "3".into())])
    );
}

#[test]
fn a_key_written_from_two_ranges_worth_of_hashes_in_one_commit_lands_in_one_range() {
    let topology = with_stores(
        persistent("kv"),
        persistent("by_value").with_caching_disabled(),
    );
    let (lo, hi) = (key_in_half(false), key_in_half(true));
    let log = Arc::new(MemoryChangelog::default());
    {
        // At P = 1 both records are one sub-task's: `by_value["v"]` is written with `lo`'s
        // hash, then with `hi`'s, in one commit.
        let (_dir, mut e) = first_owner(&topology, 1, &log);
        feed(&mut e, 0, &[(&lo, "v"), (&hi, "v")]);
    }
    assert_eq!(changelog_data(&log, "by_value").len(), 2);
    let (_dir, e, _sink) = owner_from_scratch(&topology, 2, &log);
    let stored = e.store_entries("by_value").unwrap();
    assert_eq!(stored, vec![(b"v".to_vec(), hi.into_bytes())]);
}
