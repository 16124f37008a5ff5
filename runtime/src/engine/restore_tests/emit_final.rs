//! Issue 41, item 1: what emit-final has released is per window of a key, not a bound per range.
//! Every range of a partition wrote its released bound under one changelog key; once compacted,
//! a restore from scratch gave one range's bound to all (or to the range its hash fell in), and
//! the others released their closed windows again.

use super::*;

/// Tumbling windows of 10 ms without grace counted per key, emitted once when they close; the
/// store keeps windows for 1 s, so released ones are still there to be released again.
fn final_counts() -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(Duration::from_millis(
            10,
        )))
        .emit_strategy(EmitStrategy::on_window_close())
        .count(Materialized::named("counts").with_retention(Duration::from_secs(1)))
        .to_stream()
        .to_with(
            "out",
            Produced::with(TimeWindowedSerde::new(StringSerde, 10), I64Serde),
        );
    Arc::new(b.build().unwrap())
}

/// (key, window start) of every record on `out`, sorted.
fn released(sink: &MemoryChangelog) -> Vec<(String, i64)> {
    let serde = TimeWindowedSerde::new(StringSerde, 10);
    let mut out: Vec<(String, i64)> = sink
        .records("out", 0)
        .into_iter()
        .map(|(_, r)| {
            let k: Windowed<String> = serde.deserialize(&r.key.unwrap()).unwrap();
            (k.key, k.window.start)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn no_window_is_released_again_after_a_restore_from_a_compacted_changelog() {
    let (lo, hi) = (key_in_half(false), key_in_half(true));
    let topology = final_counts();
    let log = Arc::new(MemoryChangelog::default());
    {
        let (_dir, mut e) = first_owner(&topology, 2, &log);
        // The lower range releases [0,10) and [10,20) of `lo`, then the upper one [0,10) of `hi`
        // (with the partition's time, 30: `hi`'s next record opens [30,40)).
        feed_at(&mut e, 0, &[(&lo, 1), (&hi, 2), (&lo, 11)]);
        feed_at(&mut e, 3, &[(&lo, 30)]);
        feed_at(&mut e, 4, &[(&hi, 31)]);
        let mut want = vec![(lo.clone(), 0), (lo.clone(), 10), (hi.clone(), 0)];
        want.sort();
        assert_eq!(released(&log), want);
    }
    log.compact(&changelog_topic("app", "counts"), 0, u64::MAX, true);
    // The state dir is lost; the task comes back at the same factor from the changelog.
    let (_dir, mut e, sink) = owner_from_scratch(&topology, 2, &log);
    feed_at(&mut e, 5, &[(&lo, 45), (&hi, 45)]);
    let mut want = vec![(lo.clone(), 30), (hi.clone(), 30)];
    want.sort();
    assert_eq!(
        released(&sink),
        want,
        "only the windows closed since: none released before the restore again"
    );
}
