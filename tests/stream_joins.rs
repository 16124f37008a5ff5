//! Windowed stream-stream joins (`join_windowed`, `left_join_windowed`, `outer_join_windowed`):
//! cases from Kafka Streams' own join tests, and a property test against an in-memory oracle of
//! Kafka Streams' rules at parallelising factors 1 and 3 (each key range takes the partition's
//! stream time of each input with the records it gets, so the oracle keeps one per range).

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::{key_hash, range_of};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Inner,
    Left,
    Outer,
}

/// `left` joined with `right` into `joined`: values `l+r`, a missing side shown as `null`.
fn topology(kind: Kind, windows: JoinWindows) -> Topology {
    let builder = StreamsBuilder::new();
    let left = builder.stream("left", StringSerde, StringSerde);
    let right = builder.stream("right", StringSerde, StringSerde);
    let name = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    let joined = match kind {
        Kind::Inner => left.join_windowed(
            &right,
            |l: String, r: String| format!("{l}+{r}"),
            windows,
            StreamJoined::default(),
        ),
        Kind::Left => left.left_join_windowed(
            &right,
            move |l: String, r: Option<String>| format!("{l}+{}", name(r)),
            windows,
            StreamJoined::default(),
        ),
        Kind::Outer => left.outer_join_windowed(
            &right,
            move |l: Option<String>, r: Option<String>| format!("{}+{}", name(l), name(r)),
            windows,
            StreamJoined::default(),
        ),
    };
    joined.to_with("joined", Produced::with(StringSerde, StringSerde));
    builder.build().expect("the join builds")
}

fn driver(kind: Kind, windows: JoinWindows, p: usize) -> TestDriver {
    TestDriver::builder(topology(kind, windows))
        .parallelising_factor(p)
        .build()
        .expect("driver")
}

/// (key, value, timestamp) of every output so far.
fn outputs(driver: &TestDriver) -> Vec<(String, String, i64)> {
    let out = driver.output_topic("joined", StringSerde, StringSerde);
    let mut got = Vec::new();
    while let Some(r) = out.read_raw_record() {
        let s = |b: Option<Vec<u8>>| String::from_utf8(b.unwrap_or_default()).expect("utf-8");
        got.push((s(r.key), s(r.value), r.timestamp));
    }
    got
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn triple(k: &str, v: &str, ts: i64) -> (String, String, i64) {
    (k.to_string(), v.to_string(), ts)
}

#[test]
fn records_within_the_difference_join_with_the_larger_timestamp() {
    let d = driver(
        Kind::Inner,
        JoinWindows::of_time_difference_with_no_grace(ms(100)),
        1,
    );
    let (left, right) = (
        d.input_topic("left", StringSerde, StringSerde),
        d.input_topic("right", StringSerde, StringSerde),
    );
    left.pipe_input_at("k".into(), "a0".into(), 1000);
    right.pipe_input_at("k".into(), "b0".into(), 1100);
    right.pipe_input_at("k".into(), "b1".into(), 1101);
    right.pipe_input_at("j".into(), "b2".into(), 1050);
    left.pipe_input_at("k".into(), "a1".into(), 1050);
    assert_eq!(
        outputs(&d),
        vec![
            triple("k", "a0+b0", 1100),
            triple("k", "a1+b0", 1100),
            triple("k", "a1+b1", 1101),
        ]
    );
}

#[test]
fn a_left_join_emits_the_unmatched_record_only_once_its_window_closed() {
    // Kafka Streams' KStreamKStreamLeftJoinTest.testOrdering: the unmatched A0 comes out
    // before the later match A1+a1.
    let d = driver(
        Kind::Left,
        JoinWindows::of_time_difference_and_grace(ms(10), ms(5)),
        1,
    );
    let (left, right) = (
        d.input_topic("left", StringSerde, StringSerde),
        d.input_topic("right", StringSerde, StringSerde),
    );
    left.pipe_input_at("0".into(), "A0".into(), 0);
    assert!(
        outputs(&d).is_empty(),
        "its window is open: no null result yet"
    );
    left.pipe_input_at("1".into(), "A1".into(), 100);
    right.pipe_input_at("1".into(), "a1".into(), 110);
    assert_eq!(
        outputs(&d),
        vec![triple("0", "A0+null", 0), triple("1", "A1+a1", 110)]
    );
    // A match within the window plus grace means no null result, ever.
    left.pipe_input_at("2".into(), "A2".into(), 200);
    right.pipe_input_at("9".into(), "x".into(), 212);
    right.pipe_input_at("2".into(), "a2".into(), 209);
    right.pipe_input_at("9".into(), "y".into(), 400);
    assert_eq!(outputs(&d), vec![triple("2", "A2+a2", 209)]);
}

#[test]
fn an_outer_join_emits_both_sides_unmatched_records_by_timestamp_with_an_asymmetric_window() {
    // KStreamKStreamOuterJoinTest.testEmitAllNonJoinedResultsForAsymmetricWindow, in spirit:
    // before 5, after 20, no grace.
    let windows = JoinWindows::of_time_difference_with_no_grace(ms(0))
        .before(ms(5))
        .after(ms(20));
    let d = driver(Kind::Outer, windows, 1);
    let (left, right) = (
        d.input_topic("left", StringSerde, StringSerde),
        d.input_topic("right", StringSerde, StringSerde),
    );
    right.pipe_input_at("k".into(), "r0".into(), 0);
    left.pipe_input_at("k".into(), "l10".into(), 10);
    right.pipe_input_at("x".into(), "r30".into(), 30);
    // r0 (right, look-ahead = before = 5) closed at 5 < 30; l10 (left, look-ahead 20) closes
    // after 30.
    assert_eq!(outputs(&d), vec![triple("k", "null+r0", 0)]);
    right.pipe_input_at("x".into(), "r31".into(), 31);
    assert_eq!(outputs(&d), vec![triple("k", "l10+null", 10)]);
}

#[test]
fn a_record_without_a_key_passes_an_outer_side_and_is_dropped_elsewhere() {
    let d = driver(
        Kind::Left,
        JoinWindows::of_time_difference_with_no_grace(ms(10)),
        2,
    );
    let (left, right) = (
        d.input_topic("left", StringSerde, StringSerde),
        d.input_topic("right", StringSerde, StringSerde),
    );
    left.pipe_value("A".into());
    right.pipe_value("b".into());
    let out = d.output_topic("joined", StringSerde, StringSerde);
    assert_eq!(out.read_record(), Some((None, "A+null".to_string())));
    assert_eq!(out.read_record(), None);
    assert_eq!(d.with_stats(|s| s.discarded("null_key")), 1);
}

/// One input record: (from the left stream, key, value, timestamp).
type Input = (bool, String, String, i64);

/// Kafka Streams' join rules, with one stream time per key range: the largest of each input's
/// partition time at the records the range got (rill's).
fn oracle(kind: Kind, w: (i64, i64, i64), p: usize, input: &[Input]) -> Vec<(String, String, i64)> {
    let (before, after, grace) = w;
    let retention = before + after + grace;
    // Per range: stream time; the stores: (is left, key) -> [(ts, value)] in arrival order;
    // the outer store: (ts, side byte (right 0, left 1), key) -> values.
    let mut time: BTreeMap<usize, i64> = BTreeMap::new();
    // Per input (left, right): the partition's stream time.
    let mut partition = [i64::MIN; 2];
    let mut stores: BTreeMap<(usize, bool, String), Vec<(i64, String)>> = BTreeMap::new();
    let mut outer: BTreeMap<(usize, i64, u8, String), Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "null".into());
    let result = |l: Option<&String>, r: Option<&String>| format!("{}+{}", show(l), show(r));
    let is_outer = |left: bool| match kind {
        Kind::Inner => false,
        Kind::Left => left,
        Kind::Outer => true,
    };
    // Emits range `r`'s unmatched records whose windows closed at stream time `st`.
    let release = |outer: &mut BTreeMap<(usize, i64, u8, String), Vec<String>>,
                   out: &mut Vec<(String, String, i64)>,
                   r: usize,
                   st: i64| {
        let due: Vec<_> = outer
            .range((r, i64::MIN, 0, String::new())..(r + 1, i64::MIN, 0, String::new()))
            .filter(|((_, t, side, _), _)| {
                let look = if *side == 1 { after } else { before };
                t + look + grace < st
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((_, t, side, k), values) in due {
            for v in &values {
                let value = if side == 1 {
                    result(Some(v), None)
                } else {
                    result(None, Some(v))
                };
                out.push((k.clone(), value, t));
            }
            outer.remove(&(r, t, side, k));
        }
    };
    for (left, key, value, ts) in input {
        let (left, ts) = (*left, *ts);
        let r = range_of(key_hash(key.as_bytes()), p);
        let p_time = &mut partition[usize::from(left)];
        *p_time = (*p_time).max(ts);
        let st = time.entry(r).or_insert(i64::MIN);
        let advanced = *p_time > *st;
        *st = (*st).max(*p_time);
        let st = *st;
        // This side's look-back and look-ahead.
        let (back, ahead) = if left {
            (before, after)
        } else {
            (after, before)
        };
        if advanced && kind != Kind::Inner {
            release(&mut outer, &mut out, r, st);
        }
        if ts >= st - retention {
            stores
                .entry((r, left, key.clone()))
                .or_default()
                .push((ts, value.clone()));
        }
        let (from, to) = ((ts - back).max(0), (ts + ahead).max(0));
        let visible = st - retention;
        let mut others: Vec<(i64, String)> = stores
            .get(&(r, !left, key.clone()))
            .map(|v| {
                v.iter()
                    .filter(|(t, _)| *t >= from.max(visible) && *t <= to)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        others.sort_by_key(|(t, _)| *t); // stable: arrival order within a timestamp
        let other_side = if left { 0 } else { 1 };
        for (t, o) in &others {
            let value = if left {
                result(Some(value), Some(o))
            } else {
                result(Some(o), Some(value))
            };
            out.push((key.clone(), value, ts.max(*t)));
            outer.remove(&(r, *t, other_side, key.clone()));
        }
        if others.is_empty() && is_outer(left) {
            if to >= st {
                outer
                    .entry((r, ts, if left { 1 } else { 0 }, key.clone()))
                    .or_default()
                    .push(value.clone());
            } else {
                let value = if left {
                    result(Some(value), None)
                } else {
                    result(None, Some(value))
                };
                out.push((key.clone(), value, ts));
            }
        }
        // The TestDriver's ticks after the record: every range takes each input's partition
        // time (left, then right), releasing what closed.
        for r in 0..p {
            for source in [1, 0] {
                let t = partition[source];
                let st = time.entry(r).or_insert(i64::MIN);
                if t > *st {
                    *st = t;
                    if kind != Kind::Inner {
                        release(&mut outer, &mut out, r, t);
                    }
                }
            }
        }
    }
    out
}

fn inputs() -> impl Strategy<Value = Vec<Input>> {
    // Mostly increasing timestamps with some disorder; a few keys; both sides.
    prop::collection::vec((any::<bool>(), 0..4u8, 0i64..40, any::<bool>()), 1..60).prop_map(
        |steps| {
            let mut t = 0i64;
            steps
                .into_iter()
                .enumerate()
                .map(|(i, (left, k, dt, back))| {
                    t += dt / 4;
                    let ts = if back { (t - dt).max(0) } else { t };
                    (
                        left,
                        format!("k{k}"),
                        format!("{}{i}", if left { "L" } else { "R" }),
                        ts,
                    )
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Inner, left and outer joins at P = 1 and 3 emit what the oracle emits: the same records
    /// per key in the same order (ranges run independently, so only per-key order is fixed).
    #[test]
    fn stream_joins_emit_what_the_oracle_emits(
        input in inputs(),
        before in 0i64..8,
        after in 0i64..8,
        grace in 0i64..6,
        kind in prop_oneof![Just(Kind::Inner), Just(Kind::Left), Just(Kind::Outer)],
        p in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let windows = JoinWindows::of_time_difference_and_grace(ms(0), ms(grace as u64))
            .before(ms(before as u64))
            .after(ms(after as u64));
        let d = driver(kind, windows, p);
        let (left, right) = (
            d.input_topic("left", StringSerde, StringSerde),
            d.input_topic("right", StringSerde, StringSerde),
        );
        for (is_left, k, v, ts) in &input {
            let topic = if *is_left { &left } else { &right };
            topic.pipe_input_at(k.clone(), v.clone(), *ts);
        }
        let per_key = |v: Vec<(String, String, i64)>| {
            let mut m: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
            for (k, v, t) in v {
                m.entry(k).or_default().push((v, t));
            }
            m
        };
        let want = oracle(kind, (before, after, grace), p, &input);
        prop_assert_eq!(per_key(outputs(&d)), per_key(want));
    }
}
