//! Issue 41, item 3: a tombstone goes to the range of the entry it deletes, not to the range of
//! the record whose handling deleted it, so a restore at another factor deletes the entry where
//! it lives.

use super::*;

/// Tumbling windows of 10 ms without grace counted per key, each window's final count forwarded
/// once by `suppress`.
fn suppressed_counts() -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(Duration::from_millis(
            10,
        )))
        .count("counts")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()).with_name("final"))
        .to_stream()
        .to_with(
            "out",
            Produced::with(TimeWindowedSerde::new(StringSerde, 10), I64Serde),
        );
    Arc::new(b.build().unwrap())
}

/// (key, window start, count) of every record on `out`.
fn finals(sink: &MemoryChangelog) -> Vec<(String, i64, i64)> {
    let serde = TimeWindowedSerde::new(StringSerde, 10);
    sink.records("out", 0)
        .into_iter()
        .map(|(_, r)| {
            let k: Windowed<String> = serde.deserialize(&r.key.unwrap()).unwrap();
            let n = I64Serde.deserialize(&r.value.unwrap()).unwrap();
            (k.key, k.window.start, n)
        })
        .collect()
}

#[test]
fn a_window_released_for_another_key_is_not_released_again_after_a_restore_at_another_factor() {
    let (lo, hi) = (key_in_half(false), key_in_half(true));
    let topology = suppressed_counts();
    let log = Arc::new(MemoryChangelog::default());
    {
        let (_dir, mut e) = first_owner(&topology, 1, &log);
        // `lo`'s record at 10 releases [0,10) of both keys: `hi`'s held entry is deleted while
        // handling `lo`.
        // `hi`'s held update is committed (and changelogged) before it is deleted.
        feed_at(&mut e, 0, &[(&lo, 1), (&hi, 2)]);
        feed_at(&mut e, 2, &[(&lo, 10), (&hi, 12)]);
        let mut released = finals(&log);
        released.sort();
        let mut want = vec![(lo.clone(), 0, 1), (hi.clone(), 0, 1)];
        want.sort();
        assert_eq!(released, want);
    }
    // The state dir is lost; the task comes back at P = 2 from the changelog.
    let (_dir, mut e, sink) = owner_from_scratch(&topology, 2, &log);
    feed_at(&mut e, 4, &[(&hi, 20)]);
    let mut released = finals(&sink);
    released.sort();
    let mut want = vec![(hi.clone(), 10, 1), (lo.clone(), 10, 1)];
    want.sort();
    assert_eq!(
        released, want,
        "only [10,20) (`lo`'s by the partition's time): [0,10) was released before the restore"
    );
}
