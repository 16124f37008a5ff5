//! Issue 41, item 1: a versioned store's observed stream time belongs to its range. Every range
//! of a partition wrote it under one changelog key; once compacted, a restore from scratch gave
//! one range's time to one range only, and the others took puts older than their history.

use super::*;

/// A versioned table of `in` keeping 10 ms of history; its updates go to `out`.
fn versioned_table() -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.table(
        "in",
        StringSerde,
        StringSerde,
        Materialized::named("versions").versioned(Duration::from_millis(10)),
    )
    .to_stream()
    .to_with("out", Produced::with(StringSerde, StringSerde));
    Arc::new(b.build().unwrap())
}

/// The keys of every record on `out`, in order.
fn updated(sink: &MemoryChangelog) -> Vec<String> {
    sink.records("out", 0)
        .into_iter()
        .map(|(_, r)| String::from_utf8(r.key.unwrap()).unwrap())
        .collect()
}

#[test]
fn every_range_keeps_its_observed_time_through_a_restore_from_a_compacted_changelog() {
    let (lo, hi) = (key_in_half(false), key_in_half(true));
    let lo2 = (0..)
        .map(|i| format!("key{i}"))
        .filter(|k| key_hash(k.as_bytes()) < 1 << 63)
        .nth(1)
        .unwrap();
    let topology = versioned_table();
    let log = Arc::new(MemoryChangelog::default());
    {
        let (_dir, mut e) = first_owner(&topology, 2, &log);
        // The lower range observes 100, the upper one 20 (written last).
        feed_at(&mut e, 0, &[(&lo, 100)]);
        feed_at(&mut e, 1, &[(&hi, 20)]);
        assert_eq!(updated(&log), vec![lo.clone(), hi.clone()]);
    }
    log.compact(&changelog_topic("app", "versions"), 0, u64::MAX, true);
    // The state dir is lost; the task comes back at the same factor from the changelog.
    let (_dir, mut e, sink) = owner_from_scratch(&topology, 2, &log);
    // 50 is older than 100 - 10 in the lower range; 25 is within 20's history in the upper one.
    feed_at(&mut e, 2, &[(&lo2, 50), (&hi, 25)]);
    assert_eq!(updated(&sink), vec![hi.clone()], "{lo2}@50 is expired");
}
