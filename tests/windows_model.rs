//! Property tests of the windowed aggregations against simple in-memory oracles, for tumbling,
//! hopping, sliding and session windows.
//!
//! Inputs are random keys, values and timestamps, in order, out of order within grace and out
//! of order beyond it, followed by one far-future record per key range so every window closes.
//! The aggregate is the sorted list of a window's values, so a comparison checks exactly which
//! records each window holds. Each case runs rill at P = 1 and P = 3 with three outputs of the
//! same windows: every update (last value per window), emit-final by `EmitStrategy` and
//! emit-final by `suppress`; emit-final outputs must hold each closed window exactly once.
//!
//! The oracles judge each record by the partition's stream time at it, as every key range does
//! (see `rill::topology::time`): late records and closed windows are the same at every P.
//! With records within grace only, nothing is late at any P and the results at P = 1 and
//! P = 3 must be identical.
//!
//! Sliding windows: the oracle is the declarative definition (left window of every record, right
//! window where a later record falls in it, each holding the records in its bounds). It holds
//! when no record is late for only some of its windows, so sliding inputs keep records that are
//! wholly on time or wholly late at both factors. `PROPTEST_CASES` sets the number of cases.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::dsl::WindowedBy;
use rill::topology::{key_hash, range_of};

#[derive(Clone, Debug)]
struct Rec {
    key: String,
    ts: i64,
    value: i64,
}

/// Every value of a window, sorted.
type Bag = Vec<i64>;
/// (key, window start, window end) -> bag.
type Windows = BTreeMap<(String, i64, i64), Bag>;

#[derive(Debug, PartialEq)]
struct Outcome {
    /// Last update per window (sessions: the store's visible sessions before the flush).
    updates: Windows,
    /// What `EmitStrategy::on_window_close` released.
    finals: Windows,
    /// What `suppress(until_window_closes)` released.
    suppressed: Windows,
    /// Late drops of one aggregation.
    late: u64,
}

const KEYS: &[&str] = &["a", "b", "c", "d", "e", "f", "g"];
const FACTORS: [usize; 2] = [1, 3];

fn range(key: &str, p: usize) -> usize {
    range_of(key_hash(key.as_bytes()), p)
}

fn push(mut bag: Bag, v: i64) -> Bag {
    let at = bag.partition_point(|&x| x <= v);
    bag.insert(at, v);
    bag
}

fn merge(a: Bag, b: Bag) -> Bag {
    b.into_iter().fold(a, push)
}

fn is_flush(key: &str) -> bool {
    key.starts_with("flush")
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

/// Random records: the clock advances 0-5 ms per record; a record is on time, late within
/// grace, or (unless `within_grace`) late beyond it; then the flush records.
fn records(grace: i64, within_grace: bool) -> impl Strategy<Value = Vec<Rec>> {
    prop::collection::vec(
        (0..KEYS.len(), 0i64..6, 0u8..20, 0i64..50, -20i64..20),
        1..50,
    )
    .prop_map(move |steps| {
        let mut clock = 0;
        let mut out: Vec<Rec> = steps
            .into_iter()
            .map(|(k, advance, kind, late, value)| {
                clock += advance;
                let lateness = match kind {
                    0..=11 => 0,
                    12..=16 => late % (grace + 1),
                    _ if within_grace => late % (grace + 1),
                    _ => grace + 1 + late,
                };
                Rec {
                    key: KEYS[k].to_string(),
                    ts: (clock - lateness).max(0),
                    value,
                }
            })
            .collect();
        out.extend(flush(clock + 1000));
        out
    })
}

/// One record per key range of P = 3 (so of P = 1 too) at `at`.
fn flush(at: i64) -> Vec<Rec> {
    let mut seen = BTreeSet::new();
    (0..)
        .map(|i| format!("flush-{i}"))
        .filter(|k| seen.insert(range(k, 3)))
        .take(3)
        .map(|key| Rec {
            key,
            ts: at,
            value: 0,
        })
        .collect()
}

/// Stream time as the engine keeps it on the TestDriver: the partition's (the largest
/// timestamp so far), which every range takes after each record (its own, or a tick).
struct Clock(i64);

impl Clock {
    fn new() -> Self {
        Clock(i64::MIN)
    }
    fn see(&mut self, r: &Rec) -> i64 {
        self.0 = self.0.max(r.ts);
        self.0
    }
    fn of(&self) -> i64 {
        self.0
    }
}

fn without_flush(w: Windows) -> Windows {
    w.into_iter()
        .filter(|((k, _, _), _)| !is_flush(k))
        .collect()
}

// ---- running rill ----

/// The three outputs of one window definition: `windowed(grouped)` makes a windowed stream.
fn topology<W: WindowedBy<String, i64, Stream = S> + Copy, S>(
    windows: W,
    aggregate: impl Fn(S, &str, EmitStrategy) -> KTable<Windowed<String>, Bag>,
) -> Topology {
    let b = StreamsBuilder::new();
    let g = b.stream("in", StringSerde, I64Serde).group_by_key();
    let updates = aggregate(
        g.windowed_by(windows),
        "upd",
        EmitStrategy::on_window_update(),
    );
    updates.to_stream().to("updates");
    updates
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
        .to_stream()
        .to("suppressed");
    aggregate(
        g.windowed_by(windows),
        "fin",
        EmitStrategy::on_window_close(),
    )
    .to_stream()
    .to("finals");
    b.build().expect("topology")
}

fn time_topology(
    w: impl WindowedBy<String, i64, Stream = TimeWindowedKStream<String, i64>> + Copy,
) -> Topology {
    topology(w, |s: TimeWindowedKStream<String, i64>, store, emit| {
        s.emit_strategy(emit).aggregate(
            Vec::new,
            |_k, v, bag| push(bag, v),
            Materialized::named(store).with_value_serde(JsonSerde::<Bag>::new()),
        )
    })
}

fn session_topology(w: SessionWindows) -> Topology {
    topology(w, |s: SessionWindowedKStream<String, i64>, store, emit| {
        s.emit_strategy(emit).aggregate(
            Vec::new,
            |_k, v, bag| push(bag, v),
            |_k, a, b| merge(a, b),
            Materialized::named(store).with_value_serde(JsonSerde::<Bag>::new()),
        )
    })
}

/// Reads an emit-final output: each window must appear once.
fn once<S: Serde<Windowed<String>>>(driver: &TestDriver, topic: &str, serde: S) -> Windows {
    let mut out = Windows::new();
    for (k, v) in driver
        .output_topic(topic, serde, JsonSerde::<Bag>::new())
        .read_key_values()
    {
        let key = (k.key, k.window.start, k.window.end);
        if let Some(old) = out.insert(key.clone(), v) {
            panic!("{topic}: window {key:?} emitted twice (first {old:?})");
        }
    }
    without_flush(out)
}

fn run(topology: &Topology, recs: &[Rec], p: usize, sessions: bool, size: i64) -> Outcome {
    let driver = TestDriver::builder(topology.clone())
        .parallelising_factor(p)
        .build()
        .expect("driver");
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let store = driver.session_store("upd", StringSerde, JsonSerde::<Bag>::new());
    let mut before_flush = None;
    for r in recs {
        if sessions && is_flush(&r.key) && before_flush.is_none() {
            before_flush = Some(store.all());
        }
        input.pipe_input_at(r.key.clone(), r.value, r.ts);
    }
    let late = driver.with_stats(|s| s.late_dropped());
    assert_eq!(late % 2, 0, "both aggregations drop the same records");
    let (updates, finals, suppressed) = if sessions {
        let serde = || SessionWindowedSerde::new(StringSerde);
        let updates = before_flush
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| ((k.key, k.window.start, k.window.end), v))
            .collect();
        (
            updates,
            once(&driver, "finals", serde()),
            once(&driver, "suppressed", serde()),
        )
    } else {
        let serde = || TimeWindowedSerde::new(StringSerde, size);
        let updates = driver
            .output_topic("updates", serde(), JsonSerde::<Bag>::new())
            .read_key_values()
            .into_iter()
            .map(|(k, v)| ((k.key, k.window.start, k.window.end), v))
            .collect();
        (
            updates,
            once(&driver, "finals", serde()),
            once(&driver, "suppressed", serde()),
        )
    };
    Outcome {
        updates: without_flush(updates),
        finals,
        suppressed,
        late: late / 2,
    }
}

// ---- oracles ----

fn time_oracle(recs: &[Rec], size: i64, advance: i64, grace: i64) -> Outcome {
    let mut clock = Clock::new();
    let mut windows = Windows::new();
    let mut late = 0;
    for r in recs {
        let close = clock.see(r) - grace;
        // Every window [s, s + size) with s a multiple of advance, s >= 0, holding r.ts.
        for s in (0..=r.ts)
            .step_by(advance as usize)
            .filter(|s| s + size > r.ts)
        {
            if s + size > close {
                let bag = windows.entry((r.key.clone(), s, s + size)).or_default();
                *bag = push(std::mem::take(bag), r.value);
            } else {
                late += 1;
            }
        }
    }
    let closed: Windows = windows
        .iter()
        .filter(|((_, _, end), _)| *end <= clock.of() - grace)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Outcome {
        updates: without_flush(windows),
        finals: without_flush(closed.clone()),
        suppressed: without_flush(closed),
        late,
    }
}

fn sliding_oracle(recs: &[Rec], d: i64, grace: i64) -> Outcome {
    let mut clock = Clock::new();
    let mut accepted: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut late = 0;
    for r in recs {
        let close = clock.see(r) - grace;
        if r.ts + 1 + d <= close {
            late += 1;
        } else {
            accepted
                .entry(r.key.clone())
                .or_default()
                .push((r.ts, r.value));
        }
    }
    let mut windows = Windows::new();
    for (key, recs) in &accepted {
        let mut starts = BTreeSet::new();
        for &(t, _) in recs {
            // Records before d share [0, d] ("early records").
            starts.insert((t - d).max(0));
            if recs.iter().any(|&(u, _)| t < u && u <= t + 1 + d) {
                starts.insert(t + 1);
            }
        }
        for s in starts {
            let bag = recs
                .iter()
                .filter(|&&(t, _)| s <= t && t <= s + d)
                .fold(Vec::new(), |bag, &(_, v)| push(bag, v));
            windows.insert((key.clone(), s, s + d), bag);
        }
    }
    let closed: Windows = windows
        .iter()
        .filter(|((_, _, end), _)| *end < clock.of() - grace)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Outcome {
        updates: without_flush(windows),
        finals: without_flush(closed.clone()),
        suppressed: without_flush(closed),
        late,
    }
}

/// Keeps the records that are, at every factor, on time for all their sliding windows or late
/// for all of them.
fn wholly_on_time_or_late(recs: Vec<Rec>, d: i64, grace: i64) -> Vec<Rec> {
    // Every factor's ranges judge a record by the partition's time at it.
    let mut partition = i64::MIN;
    recs.into_iter()
        .filter(|r| {
            let close = partition.max(r.ts) - grace;
            let keep = r.ts >= close || r.ts + 1 + d <= close;
            if keep {
                partition = partition.max(r.ts);
            }
            keep
        })
        .collect()
}

fn session_oracle(recs: &[Rec], gap: i64, grace: i64) -> Outcome {
    let retention = gap + grace;
    let mut clock = Clock::new();
    let mut sessions: BTreeMap<String, Vec<(i64, i64, Bag)>> = BTreeMap::new();
    let mut late = 0;
    let mut before_flush = None;
    let snapshot = |sessions: &BTreeMap<String, Vec<(i64, i64, Bag)>>, clock: &Clock| -> Windows {
        sessions
            .iter()
            .flat_map(|(k, l)| {
                l.iter()
                    .map(move |(s, e, b)| ((k.clone(), *s, *e), b.clone()))
            })
            .filter(|((_, _, e), _)| *e >= clock.of() - retention)
            .collect()
    };
    for r in recs {
        if is_flush(&r.key) && before_flush.is_none() {
            before_flush = Some(snapshot(&sessions, &clock));
        }
        let s = clock.see(r);
        let (close, visible) = (s - grace - gap, s - retention);
        let list = sessions.entry(r.key.clone()).or_default();
        let (found, rest): (Vec<_>, Vec<_>) = std::mem::take(list)
            .into_iter()
            .partition(|(start, end, _)| *end >= (r.ts - gap).max(visible) && *start <= r.ts + gap);
        let start = found.iter().map(|f| f.0).fold(r.ts, i64::min);
        let end = found.iter().map(|f| f.1).fold(r.ts, i64::max);
        if end < close {
            late += 1;
            *list = rest.into_iter().chain(found).collect();
        } else {
            let bag = found.into_iter().fold(vec![r.value], |b, f| merge(b, f.2));
            *list = rest;
            list.push((start, end, bag));
        }
    }
    let closed: Windows = sessions
        .iter()
        .flat_map(|(k, l)| {
            l.iter()
                .map(move |(s, e, b)| ((k.clone(), *s, *e), b.clone()))
        })
        .filter(|((_, _, e), _)| *e < clock.of() - grace - gap)
        .collect();
    Outcome {
        updates: without_flush(before_flush.unwrap_or_default()),
        finals: without_flush(closed.clone()),
        suppressed: without_flush(closed),
        late,
    }
}

// ---- the properties ----

fn check(
    topology: &Topology,
    recs: &[Rec],
    sessions: bool,
    size: i64,
    want: Outcome,
    within_grace: bool,
) {
    let mut seen = Vec::new();
    for p in FACTORS {
        let got = run(topology, recs, p, sessions, size);
        assert_eq!(got, want, "P = {p}, records {recs:?}");
        seen.push(got);
    }
    // Every range judges by the partition's time: P changes nothing but timing.
    let (one, three) = (&seen[0], &seen[1]);
    if within_grace {
        assert_eq!(one.late, 0);
    }
    assert_eq!(one.late, three.late, "P must not change what is late");
    assert_eq!(one.finals, three.finals, "P must not change the results");
    assert_eq!(
        one.suppressed, three.suppressed,
        "P must not change the results"
    );
    // A session store's visible sessions depend on each range's stream time at the moment
    // of reading, which P changes; the update stream of time windows does not.
    if !sessions {
        assert_eq!(one.updates, three.updates, "P must not change the results");
    }
}

fn ms(n: i64) -> Duration {
    Duration::from_millis(n as u64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn tumbling_and_hopping_windows_match_the_oracle(
        (hop, grace, recs) in (any::<bool>(), 0i64..6).prop_flat_map(|(hop, grace)| {
            (Just(hop), Just(grace), records(grace, false))
        })
    ) {
        let advance = if hop { 4 } else { 10 };
        let w = TimeWindows::of_size_and_grace(ms(10), ms(grace)).advance_by(ms(advance));
        let t = time_topology(w);
        check(&t, &recs, false, 10, time_oracle(&recs, 10, advance, grace), false);
    }

    #[test]
    fn time_windows_are_the_same_at_any_p_within_grace(
        (grace, recs) in (0i64..6).prop_flat_map(|g| (Just(g), records(g, true)))
    ) {
        let w = TimeWindows::of_size_and_grace(ms(10), ms(grace)).advance_by(ms(5));
        let t = time_topology(w);
        check(&t, &recs, false, 10, time_oracle(&recs, 10, 5, grace), true);
    }

    #[test]
    fn sliding_windows_match_the_oracle(
        (d, grace, recs) in (2i64..12, 0i64..6).prop_flat_map(|(d, g)| (Just(d), Just(g), records(g, false)))
    ) {
        let recs = wholly_on_time_or_late(recs, d, grace);
        let t = time_topology(SlidingWindows::of_time_difference_and_grace(ms(d), ms(grace)));
        check(&t, &recs, false, d, sliding_oracle(&recs, d, grace), false);
    }

    #[test]
    fn sliding_windows_are_the_same_at_any_p_within_grace(
        (d, grace, recs) in (2i64..12, 0i64..6).prop_flat_map(|(d, g)| (Just(d), Just(g), records(g, true)))
    ) {
        let t = time_topology(SlidingWindows::of_time_difference_and_grace(ms(d), ms(grace)));
        check(&t, &recs, false, d, sliding_oracle(&recs, d, grace), true);
    }

    #[test]
    fn session_windows_match_the_oracle(
        (gap, grace, recs) in (1i64..9, 0i64..6).prop_flat_map(|(gap, g)| (Just(gap), Just(g), records(g, false)))
    ) {
        let t = session_topology(SessionWindows::of_inactivity_gap_and_grace(ms(gap), ms(grace)));
        check(&t, &recs, true, 0, session_oracle(&recs, gap, grace), false);
    }

    #[test]
    fn session_windows_are_the_same_at_any_p_within_grace(
        (gap, grace, recs) in (1i64..9, 0i64..6).prop_flat_map(|(gap, g)| (Just(gap), Just(g), records(g, true)))
    ) {
        let t = session_topology(SessionWindows::of_inactivity_gap_and_grace(ms(gap), ms(grace)));
        check(&t, &recs, true, 0, session_oracle(&recs, gap, grace), true);
    }
}
