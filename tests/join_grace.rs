//! Stream-table joins with a grace period (`Joined::with_grace_period`, issue 42 item 6, Kafka
//! Streams' KIP-923) against an oracle of Kafka Streams' semantics: each stream record waits in a
//! buffer until the stream's time passes its timestamp by the grace period, then the due records
//! join in timestamp order with the versioned table as of their timestamps; a record older than
//! the stream's time minus the grace period joins at once.

use std::collections::BTreeMap;
use std::time::Duration;

use rill::prelude::*;

/// One input record: a table update or a stream record (key, value, timestamp).
#[derive(Clone, Debug)]
enum Event {
    Table(String, String, i64),
    Stream(String, String, i64),
}

/// `orders` joined (inner or left) with the versioned table of `accounts` -> `out`, with a
/// grace period of `grace_ms`.
fn topology(grace_ms: u64, left: bool) -> Topology {
    let b = StreamsBuilder::new();
    let accounts = b.table(
        "accounts",
        StringSerde,
        StringSerde,
        Materialized::named("accounts-store").versioned(Duration::from_secs(3600)),
    );
    let orders = b.stream("orders", StringSerde, StringSerde);
    let joined = Joined::named("orders-join").with_grace_period(Duration::from_millis(grace_ms));
    let out = if left {
        orders.left_join_with(
            &accounts,
            |o: String, a: Option<String>| format!("{o}+{}", a.unwrap_or_else(|| "-".into())),
            joined,
        )
    } else {
        orders.join_with(&accounts, |o: String, a: String| format!("{o}+{a}"), joined)
    };
    out.to_with("out", Produced::with(StringSerde, StringSerde));
    b.build().unwrap()
}

/// The outputs (key, value, timestamp) of `events` in the order the join writes them.
fn run(events: &[Event], grace_ms: u64, left: bool) -> Vec<(String, String, i64)> {
    let driver = TestDriver::new(topology(grace_ms, left)).unwrap();
    pipe(&driver, events)
}

/// [`run`] with the driver closed and reopened on its state after every event: the buffer and
/// its stream time come back from the state.
fn run_restarting(events: &[Event], grace_ms: u64, left: bool) -> Vec<(String, String, i64)> {
    let dir = tempfile::tempdir().unwrap();
    let mut got = Vec::new();
    for e in events {
        let driver = TestDriver::builder(topology(grace_ms, left))
            .state_dir(dir.path())
            .build()
            .unwrap();
        got.extend(pipe(&driver, std::slice::from_ref(e)));
        driver.close().unwrap();
    }
    got
}

/// Pipes `events` and reads what the join wrote.
fn pipe(driver: &TestDriver, events: &[Event]) -> Vec<(String, String, i64)> {
    let accounts = driver.input_topic("accounts", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    for e in events {
        match e {
            Event::Table(k, v, ts) => accounts.pipe_input_at(k.clone(), v.clone(), *ts),
            Event::Stream(k, v, ts) => orders.pipe_input_at(k.clone(), v.clone(), *ts),
        }
    }
    let out = driver.output_topic("out", StringSerde, StringSerde);
    let mut got = Vec::new();
    while let Some(raw) = out.read_raw_record() {
        let key = String::from_utf8(raw.key.unwrap_or_default()).unwrap();
        let value = String::from_utf8(raw.value.unwrap_or_default()).unwrap();
        got.push((key, value, raw.timestamp));
    }
    got
}

/// Kafka Streams' KStreamKTableJoinProcessor with its time-ordered buffer, on one task, with
/// the task's stream time (see the table arm).
fn oracle(events: &[Event], grace_ms: u64, left: bool) -> Vec<(String, String, i64)> {
    let grace = grace_ms as i64;
    let mut versions: BTreeMap<String, BTreeMap<i64, String>> = BTreeMap::new();
    // (timestamp, arrival) -> (key, value).
    let mut buffer: BTreeMap<(i64, usize), (String, String)> = BTreeMap::new();
    let mut time: Option<i64> = None;
    let mut out = Vec::new();
    let join = |versions: &BTreeMap<String, BTreeMap<i64, String>>,
                out: &mut Vec<(String, String, i64)>,
                (k, v, ts): (String, String, i64)| {
        let table = versions
            .get(&k)
            .and_then(|m| m.range(..=ts).next_back())
            .map(|(_, a)| a.clone());
        match (table, left) {
            (Some(a), _) => out.push((k, format!("{v}+{a}"), ts)),
            (None, true) => out.push((k, format!("{v}+-"), ts)),
            (None, false) => {}
        }
    };
    for (arrival, e) in events.iter().enumerate() {
        match e.clone() {
            Event::Table(k, v, ts) => {
                versions.entry(k).or_default().insert(ts, v);
                // rill's task time counts the table's records too (Kafka Streams' join only the
                // stream's: see `rill_topology::dsl::join`); they release nothing by themselves.
                time = Some(time.map_or(ts, |t| t.max(ts)));
            }
            Event::Stream(k, v, ts) => {
                let now = time.map_or(ts, |t| t.max(ts));
                time = Some(now);
                // Too old to wait: joins at once; then, either way, what is due is released.
                if ts < now - grace {
                    join(&versions, &mut out, (k, v, ts));
                } else {
                    buffer.insert((ts, arrival), (k, v));
                }
                let due: Vec<(i64, usize)> = buffer
                    .range(..(now - grace + 1, 0))
                    .map(|(at, _)| *at)
                    .collect();
                for at in due {
                    if let Some((k, v)) = buffer.remove(&at) {
                        join(&versions, &mut out, (k, v, at.0));
                    }
                }
            }
        }
    }
    out
}

/// An order before the account update it should meet (the table's topic lags).
fn lagging_table() -> Vec<Event> {
    let s = |k: &str, v: &str, ts| Event::Stream(k.into(), v.into(), ts);
    let t = |k: &str, v: &str, ts| Event::Table(k.into(), v.into(), ts);
    vec![
        t("alice", "Alice", 0),
        s("alice", "o1", 10),
        // Late on the table side: valid from 8, so o1 (at 10) should see it.
        t("alice", "Alice B.", 8),
        t("bob", "Bob", 9),
        s("bob", "o2", 12),
        // Moves the stream's time to 16: o1 (10) is due with a grace of 5, o2 (12) not yet.
        s("alice", "o3", 16),
        // Too old to wait (16 - 5 > 3): joins at once with the version of time 3.
        s("alice", "o4", 3),
        s("bob", "o5", 30),
    ]
}

#[test]
fn a_record_waits_for_a_late_table_update_within_the_grace_period() {
    let got = run(&lagging_table(), 5, false);
    assert_eq!(got, oracle(&lagging_table(), 5, false));
    let want: Vec<(String, String, i64)> = [
        ("alice", "o1+Alice B.", 10),
        ("alice", "o4+Alice", 3),
        ("bob", "o2+Bob", 12),
        ("alice", "o3+Alice B.", 16),
    ]
    .map(|(k, v, ts)| (k.to_string(), v.to_string(), ts))
    .to_vec();
    assert_eq!(got, want);
    // Without a grace period o1 joins before the late update: with the older version.
    let none = run(&lagging_table(), 0, false);
    assert_eq!(none[0], ("alice".into(), "o1+Alice".into(), 10));
    assert_eq!(none, oracle(&lagging_table(), 0, false));
    assert_eq!(run_restarting(&lagging_table(), 5, false), want);
}

#[test]
fn a_grace_period_on_a_table_that_is_not_versioned_is_refused() {
    let b = StreamsBuilder::new();
    let accounts = b.table("accounts", StringSerde, StringSerde, "accounts-store");
    b.stream("orders", StringSerde, StringSerde)
        .join_with(
            &accounts,
            |o: String, a: String| format!("{o}+{a}"),
            Joined::named("orders-join").with_grace_period(Duration::from_millis(5)),
        )
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let e = b.build().unwrap_err();
    assert_eq!(
        e,
        TopologyError::GraceNeedsVersionedTable {
            node: "orders-join".into(),
            store: "accounts-store".into(),
        }
    );
    assert!(e.to_string().contains("Materialized::versioned"), "{e}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(32)
    ))]

    /// Random updates and records of three keys, timestamps out of order: the join writes
    /// what the oracle does, in its order, for inner and left joins and several grace periods.
    #[test]
    fn the_join_with_a_grace_period_matches_the_oracle(
        steps in proptest::collection::vec((proptest::bool::ANY, 0usize..3, 0i64..40), 1..40),
        grace in proptest::sample::select(vec![0u64, 3, 10]),
        left in proptest::bool::ANY,
    ) {
        const KEYS: [&str; 3] = ["a", "b", "c"];
        let events: Vec<Event> = steps
            .iter()
            .enumerate()
            .map(|(i, &(table, k, ts))| {
                let (k, v) = (KEYS[k].to_string(), format!("v{i}"));
                if table { Event::Table(k, v, ts) } else { Event::Stream(k, v, ts) }
            })
            .collect();
        proptest::prop_assert_eq!(run(&events, grace, left), oracle(&events, grace, left));
    }
}

/// A key of another key range than `a`'s at P = 16.
fn key_in_another_range_than(a: &str) -> String {
    use rill::topology::{key_hash, range_of};
    let range = |k: &str| range_of(key_hash(k.as_bytes()), 16);
    (0..)
        .map(|i| format!("b{i}"))
        .find(|k| range(k) != range(a))
        .unwrap()
}

/// The buffer follows the partition's stream time in a quiet range: at P = 16 a record of
/// another range moves the time past `a`'s held record, which joins then, as at P = 1. Before,
/// each range's buffer kept its own time and `a`'s record waited for a record of its own range.
#[test]
fn a_quiet_range_releases_its_held_records_by_the_partition_time() {
    let b = key_in_another_range_than("a");
    let events = vec![
        Event::Table("a".into(), "A".into(), 0),
        Event::Table(b.clone(), "B".into(), 0),
        Event::Stream("a".into(), "o1".into(), 10),
        Event::Stream(b.clone(), "o2".into(), 30),
    ];
    let want = oracle(&events, 5, false);
    assert_eq!(
        want,
        vec![("a".to_string(), "o1+A".to_string(), 10)],
        "the oracle releases o1 at o2 (30 - 5 >= 10); o2 waits"
    );
    for p in [1, 16] {
        let driver = TestDriver::builder(topology(5, false))
            .parallelising_factor(p)
            .build()
            .unwrap();
        assert_eq!(pipe(&driver, &events), want, "P = {p}");
    }
}

/// Sorts outputs: ranges interleave their outputs differently at different factors.
fn sorted(mut v: Vec<(String, String, i64)>) -> Vec<(String, String, i64)> {
    v.sort();
    v
}

/// `events` with the factor changed live, or the driver reopened on its state, before the
/// events `changes` names: `(at, Some(factor))` or `(at, None)` for a restart.
fn run_changing(
    events: &[Event],
    grace_ms: u64,
    left: bool,
    changes: &[(usize, Option<usize>)],
) -> Vec<(String, String, i64)> {
    let dir = tempfile::tempdir().unwrap();
    let open = |factor: usize| {
        TestDriver::builder(topology(grace_ms, left))
            .parallelising_factor(factor)
            .state_dir(dir.path())
            .build()
            .unwrap()
    };
    let mut factor = 4;
    let mut driver = open(factor);
    let mut got = Vec::new();
    for (i, e) in events.iter().enumerate() {
        for &(_, change) in changes.iter().filter(|(at, _)| *at == i) {
            match change {
                Some(f) => {
                    factor = f;
                    driver.set_parallelising_factor(f).unwrap();
                }
                None => {
                    driver.close().unwrap();
                    driver = open(factor);
                }
            }
        }
        got.extend(pipe(&driver, std::slice::from_ref(e)));
    }
    got
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24)
    ))]

    /// Eight keys over several ranges, the factor split and merged live (4 -> 1, 2, 3, 8) and
    /// the driver restarted at random points: the join writes what the oracle does (as a
    /// multiset: ranges interleave). The table's timestamps lag the stream's (the case a grace
    /// period is for), so only stream records move the time, as the oracle has it.
    #[test]
    fn the_buffer_holds_across_factor_changes_and_restarts(
        steps in proptest::collection::vec((proptest::bool::ANY, 0usize..8, 0i64..40), 1..50),
        changes in proptest::collection::vec(
            (0usize..50, proptest::option::of(proptest::sample::select(vec![1usize, 2, 3, 8]))),
            0..5,
        ),
        grace in proptest::sample::select(vec![0u64, 3, 10]),
        left in proptest::bool::ANY,
    ) {
        let mut high: Option<i64> = None;
        let events: Vec<Event> = steps
            .iter()
            .enumerate()
            .map(|(i, &(table, k, ts))| {
                let (k, v) = (format!("k{k}"), format!("v{i}"));
                if table {
                    Event::Table(k, v, high.map_or(0, |h| ts.min(h)))
                } else {
                    high = Some(high.map_or(ts, |h| h.max(ts)));
                    Event::Stream(k, v, ts)
                }
            })
            .collect();
        proptest::prop_assert_eq!(
            sorted(run_changing(&events, grace, left, &changes)),
            sorted(oracle(&events, grace, left))
        );
    }
}
