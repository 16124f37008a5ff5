//! State that describes a whole key range across live factor changes (issue 41, item 1).
//!
//! - Emit-final windows and sessions: what a range has not released yet is noted per window in
//!   an entry of the window's key, so a split or a merge neither releases a window twice nor
//!   skips one. (A released bound per range went to one child of a split, and a merge kept one
//!   range's bound for both.)
//! - A bounded suppression buffer counts what each range holds.
//! - A versioned store's observed stream time is committed with the range's progress: a split
//!   gives it to both children, a merge takes the larger. (It was an entry of the store, which
//!   went to one child of a split and to either range of a merge.)

use std::time::Duration;

use rill::prelude::*;
use rill::topology::key_hash;

/// Keys whose routing hashes lie in the lower (`upper == false`) or upper half of the hash space.
fn keys_in_half(upper: bool) -> impl Iterator<Item = String> {
    (0..)
        .map(|i| format!("user-{i}"))
        .filter(move |k| (key_hash(k.as_bytes()) >= 1 << 63) == upper)
}

/// Two keys: one whose routing hash is in the lower half of the hash space, one in the upper.
fn keys_in_both_halves() -> (String, String) {
    let first = |upper| keys_in_half(upper).next().unwrap_or_default();
    (first(false), first(true))
}

/// Counts per key in 10 ms tumbling windows without grace, or in sessions with a 5 ms gap,
/// emitted once each when closed, to `out` as `key@start` = count.
fn emit_final_counts(sessions: bool) -> Topology {
    let b = StreamsBuilder::new();
    let grouped = b.stream("in", StringSerde, StringSerde).group_by_key();
    let counts = if sessions {
        grouped
            .windowed_by(SessionWindows::of_inactivity_gap_with_no_grace(
                Duration::from_millis(5),
            ))
            .emit_strategy(EmitStrategy::on_window_close())
            .count("counts")
    } else {
        grouped
            .windowed_by(TimeWindows::of_size_with_no_grace(Duration::from_millis(
                10,
            )))
            .emit_strategy(EmitStrategy::on_window_close())
            .count("counts")
    };
    counts
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
        })
        .to_with("out", Produced::with(StringSerde, I64Serde));
    b.build().unwrap()
}

struct Run {
    driver: TestDriver,
    input: TestInputTopic<String, String>,
    out: TestOutputTopic<String, i64>,
}

impl Run {
    fn new(sessions: bool, factor: usize) -> Run {
        let driver = TestDriver::builder(emit_final_counts(sessions))
            .parallelising_factor(factor)
            .build()
            .unwrap();
        let input = driver.input_topic("in", StringSerde, StringSerde);
        let out = driver.output_topic("out", StringSerde, I64Serde);
        Run { driver, input, out }
    }

    fn at(&self, key: &str, t: i64) {
        self.input.pipe_input_at(key.to_string(), "x".into(), t);
    }

    fn released(&self) -> Vec<(String, i64)> {
        let mut got = self.out.read_key_values();
        got.sort();
        got
    }
}

fn sorted(mut v: Vec<(String, i64)>) -> Vec<(String, i64)> {
    v.sort();
    v
}

/// The split: `lo@1, hi@2, lo@10` release `[0,10)` of both keys in one range; after a
/// split `hi@11` in the other child must not release `(hi,[0,10))` again.
#[test]
fn a_split_does_not_release_a_window_twice() {
    for sessions in [false, true] {
        let (lo, hi) = keys_in_both_halves();
        let run = Run::new(sessions, 1);
        run.at(&lo, 1);
        run.at(&hi, 2);
        run.at(&lo, 10);
        let first = sorted(vec![(format!("{lo}@1"), 1), (format!("{hi}@2"), 1)]);
        let first = if sessions {
            first
        } else {
            sorted(vec![(format!("{lo}@0"), 1), (format!("{hi}@0"), 1)])
        };
        assert_eq!(run.released(), first, "sessions: {sessions}");
        run.driver.set_parallelising_factor(2).unwrap();
        run.at(&hi, 11);
        run.at(&hi, 40);
        run.at(&lo, 40);
        let want = if sessions {
            sorted(vec![(format!("{lo}@10"), 1), (format!("{hi}@11"), 1)])
        } else {
            sorted(vec![(format!("{lo}@10"), 1), (format!("{hi}@10"), 1)])
        };
        assert_eq!(run.released(), want, "sessions: {sessions}: each once");
    }
}

/// The merge: both ranges have released `[0,10)` (the lower one by the partition's
/// time, its keys quiet); after a merge neither is released again, and later windows once.
#[test]
fn a_merge_neither_skips_nor_repeats_a_window() {
    for sessions in [false, true] {
        let (lo, hi) = keys_in_both_halves();
        let run = Run::new(sessions, 2);
        run.at(&lo, 1);
        run.at(&lo, 5);
        run.at(&hi, 2);
        run.at(&hi, 25);
        let (hi_first, lo_first) = if sessions { (2, 1) } else { (0, 0) };
        assert_eq!(
            run.released(),
            sorted(vec![
                (format!("{hi}@{hi_first}"), 1),
                (format!("{lo}@{lo_first}"), 2)
            ]),
            "sessions: {sessions}: the quiet lower range's window too"
        );
        run.driver.set_parallelising_factor(1).unwrap();
        run.at(&lo, 26);
        assert_eq!(
            run.released(),
            vec![],
            "sessions: {sessions}: the merged range releases nothing again"
        );
        run.at(&lo, 60);
        let want = if sessions {
            sorted(vec![(format!("{lo}@26"), 1), (format!("{hi}@25"), 1)])
        } else {
            sorted(vec![(format!("{lo}@20"), 1), (format!("{hi}@20"), 1)])
        };
        assert_eq!(run.released(), want, "sessions: {sessions}");
    }
}

/// A bounded suppression buffer counts what each range holds after a split: the count was an
/// entry of the whole range, which went to one child of the split, so that child counted the
/// other's records too and failed with a full buffer it did not have.
#[test]
fn a_bounded_suppression_buffer_counts_per_range_after_a_split() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(Duration::from_millis(
            10,
        )))
        .count("counts")
        .suppress(Suppressed::until_window_closes(
            BufferConfig::max_records(2).shutdown_when_full(),
        ))
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
        })
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let out = driver.output_topic("out", StringSerde, I64Serde);
    let lo = keys_in_half(false).next().unwrap_or_default();
    let mut upper = keys_in_half(true);
    let (hi, hi2) = (
        upper.next().unwrap_or_default(),
        upper.next().unwrap_or_default(),
    );
    let at = |k: &String, t: i64| input.try_pipe_input_at(k.clone(), "x".into(), t);
    at(&lo, 1).unwrap();
    at(&hi, 2).unwrap();
    driver.set_parallelising_factor(2).unwrap();
    // The upper range releases `hi`'s [0,10) and then holds two windows: within the bound.
    at(&hi, 12).unwrap();
    at(&hi2, 13).expect("two windows held in the upper range, the bound is 2");
    at(&lo, 20).unwrap();
    assert_eq!(
        sorted(out.read_key_values()),
        sorted(vec![
            (format!("{hi}@0"), 1),
            (format!("{lo}@0"), 1),
            (format!("{hi}@10"), 1),
            (format!("{hi2}@10"), 1)
        ])
    );
}

/// A versioned table of `in` keeping 10 ms of history; its updates go to `out` as `key` = value.
fn versioned_table(
    p: usize,
) -> (
    TestDriver,
    TestInputTopic<String, String>,
    TestOutputTopic<String, String>,
) {
    let b = StreamsBuilder::new();
    b.table(
        "in",
        StringSerde,
        StringSerde,
        Materialized::named("versions").versioned(Duration::from_millis(10)),
    )
    .to_stream()
    .to_with("out", Produced::with(StringSerde, StringSerde));
    let driver = TestDriver::builder(b.build().unwrap())
        .parallelising_factor(p)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let out = driver.output_topic("out", StringSerde, StringSerde);
    (driver, input, out)
}

/// After a split both children keep the range's observed stream time: a put older than the
/// history retention is expired in either child, as it was before the split.
#[test]
fn a_split_keeps_the_versioned_stores_observed_time_in_both_children() {
    let (lo, hi) = keys_in_both_halves();
    let (driver, input, out) = versioned_table(1);
    input.pipe_input_at(lo.clone(), "a".into(), 100);
    driver.set_parallelising_factor(2).unwrap();
    input.pipe_input_at(hi.clone(), "old".into(), 50);
    input.pipe_input_at(lo.clone(), "old".into(), 50);
    assert_eq!(
        out.read_key_values(),
        vec![(lo.clone(), "a".to_string())],
        "puts at 50 are older than 100 - 10 in both children"
    );
    let store = driver.versioned_store("versions", StringSerde, StringSerde);
    assert_eq!(store.get(&hi), None);
    assert_eq!(
        store.get_as_of(&lo, 105).map(|r| r.value),
        Some("a".to_string())
    );
}

/// A merge takes the larger observed time of its parts: the lower range observed 100, the upper
/// 20; after the merge a put at 50 is expired for either key, and reads before 90 answer none.
#[test]
fn a_merge_takes_the_larger_observed_time() {
    for (ahead, behind) in [(false, true), (true, false)] {
        let first = |upper| keys_in_half(upper).next().unwrap_or_default();
        let (ahead, behind) = (first(ahead), first(behind));
        let (driver, input, out) = versioned_table(2);
        input.pipe_input_at(ahead.clone(), "a".into(), 100);
        input.pipe_input_at(behind.clone(), "b".into(), 20);
        assert_eq!(out.read_key_values().len(), 2);
        driver.set_parallelising_factor(1).unwrap();
        input.pipe_input_at(behind.clone(), "old".into(), 50);
        assert_eq!(
            out.read_key_values(),
            vec![],
            "a put at 50 is older than 100 - 10 after the merge"
        );
        let store = driver.versioned_store("versions", StringSerde, StringSerde);
        assert_eq!(
            store.get_as_of(&behind, 85),
            None,
            "below the history bound"
        );
        assert_eq!(store.get(&behind).map(|r| r.value), Some("b".to_string()));
    }
}
