//! Interactive queries (issue 43, the local part): typed reads of a running topology's stores,
//! from code on the TestDriver and on a running runtime on the embedded cluster, and over HTTP.
//! Its own test binary: the metrics recorder is process-wide.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rill::prelude::*;
use rill::runtime::query::{QueryError, ReadOnlyKeyValueStore, Rendering};
use rill::runtime::{ConfigBuilder, RunningRuntime, Runtime};
use serde_json::Value;

const INPUT: &str = "iq-in";
const CLICKS: &str = "iq-clicks";
const STORE: &str = "kv-store";
const WINDOWS: &str = "win-store";
const PARTITIONS: u32 = 2;

/// The latest value of each key of `iq-in` in `kv-store`; clicks per key in 1 s windows of
/// `iq-clicks` in `win-store`.
fn topology() -> Topology {
    let b = StreamsBuilder::new();
    b.table(INPUT, StringSerde, I64Serde, STORE);
    b.stream(CLICKS, StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(Duration::from_secs(1)))
        .count(WINDOWS);
    b.build().expect("topology")
}

/// The key universe: `a0`..`d4`, so prefixes (`a`, `b`, ...) and ranges select several.
fn key(i: usize) -> String {
    format!("{}{}", (b'a' + (i / 5) as u8) as char, i % 5)
}

const KEYS: usize = 20;

/// A read and what it asks.
#[derive(Clone, Debug)]
enum Read {
    Get(usize),
    Range(usize, usize),
    ReverseRange(usize, usize),
    Prefix(char),
    All,
    Count,
}

fn read_strategy() -> impl Strategy<Value = Read> {
    prop_oneof![
        (0..KEYS + 2).prop_map(Read::Get),
        (0..KEYS, 0..KEYS).prop_map(|(a, b)| Read::Range(a.min(b), a.max(b))),
        (0..KEYS, 0..KEYS).prop_map(|(a, b)| Read::ReverseRange(a.min(b), a.max(b))),
        prop::sample::select(vec!['a', 'b', 'c', 'd', 'e']).prop_map(Read::Prefix),
        Just(Read::All),
        Just(Read::Count),
    ]
}

/// Puts, then reads once they are applied.
#[derive(Clone, Debug)]
struct Phase {
    puts: Vec<(usize, i64)>,
    reads: Vec<Read>,
}

fn phases() -> impl Strategy<Value = Vec<Phase>> {
    prop::collection::vec(
        (
            prop::collection::vec((0..KEYS, -1000i64..1000), 1..25),
            prop::collection::vec(read_strategy(), 1..12),
        )
            .prop_map(|(puts, reads)| Phase { puts, reads }),
        2..5,
    )
}

/// Entries of the store, in the order a read answers them.
type Entries = Vec<(String, i64)>;

/// Checks `read` against `oracle` on `store`.
fn check(
    store: &ReadOnlyKeyValueStore<String, i64>,
    oracle: &BTreeMap<String, i64>,
    read: &Read,
) -> Result<(), String> {
    let e = |e: QueryError| e.to_string();
    let between = |a: &str, b: &str| -> Vec<(String, i64)> {
        oracle
            .range(a.to_string()..=b.to_string())
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    let (got, want): (Entries, Entries) = match read {
        Read::Get(i) => {
            let k = key(*i);
            let got = store.get(&k).map_err(e)?.map(|v| (k.clone(), v));
            let want = oracle.get(&k).map(|v| (k.clone(), *v));
            (got.into_iter().collect(), want.into_iter().collect())
        }
        Read::Range(a, b) => (
            store.range(&key(*a), &key(*b)).map_err(e)?,
            between(&key(*a), &key(*b)),
        ),
        Read::ReverseRange(a, b) => {
            let mut want = between(&key(*a), &key(*b));
            want.reverse();
            (store.reverse_range(&key(*a), &key(*b)).map_err(e)?, want)
        }
        Read::Prefix(c) => (
            store.prefix_scan(&c.to_string(), StringSerde).map_err(e)?,
            oracle
                .iter()
                .filter(|(k, _)| k.starts_with(*c))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        ),
        Read::All => (
            store.all().map_err(e)?,
            oracle.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        ),
        Read::Count => {
            let n = store.approximate_num_entries().map_err(e)?;
            if n != oracle.len() as u64 {
                return Err(format!(
                    "{read:?}: {n} entries, the oracle has {}",
                    oracle.len()
                ));
            }
            return Ok(());
        }
    };
    if got != want {
        return Err(format!("{read:?}: got {got:?}, want {want:?}"));
    }
    Ok(())
}

/// Runs `phases` on the TestDriver: factor `from`, then `to` after phase `change_after`.
fn on_driver(phases: &[Phase], from: usize, to: usize, change_after: usize) -> Result<(), String> {
    let driver = TestDriver::builder(topology())
        .parallelising_factor(from)
        .partitions(INPUT, PARTITIONS)
        .partitions(CLICKS, PARTITIONS)
        .build()
        .map_err(|e| e.to_string())?;
    let input = driver.input_topic(INPUT, StringSerde, I64Serde);
    let store = driver.key_value_store(STORE, StringSerde, I64Serde);
    let mut oracle = BTreeMap::new();
    for (i, phase) in phases.iter().enumerate() {
        for (k, v) in &phase.puts {
            input.pipe_input(key(*k), *v);
            oracle.insert(key(*k), *v);
        }
        for read in &phase.reads {
            check(store.view(), &oracle, read).map_err(|e| format!("phase {i}: {e}"))?;
        }
        if i == change_after {
            driver
                .set_parallelising_factor(to)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A runtime on a new embedded cluster, with the query routes on a free port when `http`.
fn start(factor: usize, http: bool) -> (Runtime, RunningRuntime) {
    let config = ConfigBuilder::new()
        .set("application.id", format!("iq-{}", std::process::id()))
        .set("metrics.addr", if http { "127.0.0.1:0" } else { "off" })
        .set("interactive.queries.enabled", http)
        .set("parallelising.factor", factor)
        .set("worker.threads", 2)
        .set("commit.interval.ms", 100)
        .build()
        .expect("config");
    let mut runtime = Runtime::new(topology(), config).expect("runtime");
    runtime
        .render_store(STORE, Rendering::string(), Rendering::i64())
        .expect("kv-store renders");
    runtime
        .render_store(WINDOWS, Rendering::string(), Rendering::i64())
        .expect("win-store renders");
    let cluster = runtime.embedded().expect("embedded cluster");
    cluster.create_topic(INPUT, PARTITIONS).expect("input");
    cluster.create_topic(CLICKS, PARTITIONS).expect("clicks");
    let running = runtime.start().expect("start");
    (runtime, running)
}

/// Polls `store.all()` until it equals `oracle` (every put applied), or fails after 60 s.
fn await_applied(
    store: &ReadOnlyKeyValueStore<String, i64>,
    oracle: &BTreeMap<String, i64>,
) -> Result<(), String> {
    let want: Vec<(String, i64)> = oracle.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        match store.all() {
            Ok(got) if got == want => return Ok(()),
            Ok(got) => last = format!("{got:?}"),
            // Restoring, busy or moving: retry, as the error says.
            Err(e) if e.retry_after().is_some() => last = e.to_string(),
            Err(e) => return Err(e.to_string()),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "the puts were not applied in 60 s: last read {last}, want {want:?}"
    ))
}

/// Runs `phases` on a running runtime: factor `from`, then a live change to `to` after phase
/// `change_after`. Each phase's puts are produced, then read once applied.
fn on_runtime(phases: &[Phase], from: usize, to: usize, change_after: usize) -> Result<(), String> {
    let (runtime, running) = start(from, false);
    let producer = common::producer::input_producer(runtime.bootstrap_servers(), 0)
        .map_err(|e| e.to_string())?;
    let store = running
        .key_value_store(STORE, StringSerde, I64Serde)
        .map_err(|e| e.to_string())?;
    let mut oracle = BTreeMap::new();
    let result = (|| {
        for (i, phase) in phases.iter().enumerate() {
            for (k, v) in &phase.puts {
                let k = key(*k);
                common::producer::send(&producer, INPUT, Some(k.as_bytes()), &v.to_be_bytes())
                    .map_err(|e| e.to_string())?;
                oracle.insert(k, *v);
            }
            common::producer::flush(&producer).map_err(|e| e.to_string())?;
            await_applied(&store, &oracle).map_err(|e| format!("phase {i}: {e}"))?;
            for read in &phase.reads {
                check(&store, &oracle, read).map_err(|e| format!("phase {i}: {e}"))?;
            }
            if i == change_after {
                // A task that was restoring during the change takes the new factor once it
                // runs (the source changes it then): wait for that, without asking again.
                running
                    .set_parallelising_factor(to, None, Duration::from_secs(60))
                    .map_err(|e| format!("factor {from} -> {to}: {e}"))?;
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let factors = running.parallelising_factors();
                    if factors.values().all(|f| *f == to) {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(format!("factors after the change to {to}: {factors:?}"));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Ok(())
    })();
    running.shutdown().map_err(|e| e.to_string())?;
    result
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every read of the TestDriver's typed view equals the oracle's, at P = 1 and P > 1, across
    /// a factor change.
    #[test]
    fn prop_driver_reads_match_an_oracle_across_a_factor_change(
        phases in phases(),
        (from, to) in prop::sample::select(vec![(1usize, 3usize), (3, 1), (2, 4), (4, 2)]),
        change in 0usize..3,
    ) {
        if let Err(e) = on_driver(&phases, from, to, change) {
            return Err(TestCaseError::fail(format!("P {from} -> {to} after phase {change}: {e}")));
        }
    }
}

proptest! {
    // Each case starts an embedded cluster and a runtime: a few cases, each one covering
    // P = 1 and P > 1 around a live change.
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Every read of a running runtime's typed view equals the oracle's once the puts are
    /// applied, at P = 1 and P > 1, across a live factor change.
    #[test]
    fn prop_running_runtime_reads_match_an_oracle_across_a_live_factor_change(
        phases in phases(),
        (from, to) in prop::sample::select(vec![(1usize, 3usize), (3, 1)]),
        change in 0usize..2,
    ) {
        if let Err(e) = on_runtime(&phases, from, to, change) {
            return Err(TestCaseError::fail(format!("P {from} -> {to} after phase {change}: {e}")));
        }
    }
}

use common::http::{await_status, get_json};

/// The routes' status codes and bodies on a running runtime, and the typed errors from code.
#[test]
fn http_routes_answer_values_with_their_range_404_for_unknown_stores_and_absent_keys() {
    let (runtime, running) = start(2, true);
    let addr = running.metrics_addr().expect("metrics addr");
    let producer =
        common::producer::input_producer(runtime.bootstrap_servers(), 0).expect("producer");
    for (k, v) in [("kafka", 7i64), ("rill", 3), ("streams", 11)] {
        common::producer::send(&producer, INPUT, Some(k.as_bytes()), &v.to_be_bytes())
            .expect("send");
    }
    for _ in 0..3 {
        common::producer::send(&producer, CLICKS, Some(b"alice"), b"click").expect("send");
    }
    common::producer::flush(&producer).expect("flush");

    let found = await_status(addr, "/stores/kv-store/keys/kafka", 200);
    assert_eq!(found["store"], "kv-store");
    assert_eq!(found["key"], "kafka");
    assert_eq!(found["value"], 7);
    let served = &found["served_by"];
    assert_eq!(served["instance"], "local");
    assert!(
        served["partition"]
            .as_u64()
            .is_some_and(|p| p < u64::from(PARTITIONS)),
        "{found}"
    );
    assert_eq!(served["range"]["factor"], 2, "{found}");
    assert!(
        served["range"]["start"]
            .as_str()
            .is_some_and(|s| s.starts_with("0x")),
        "{found}"
    );

    let (code, absent) = get_json(addr, "/stores/kv-store/keys/nobody");
    assert_eq!(code, 404, "{absent}");
    assert_eq!(absent["error"], "key_not_found");
    let (code, unknown) = get_json(addr, "/stores/no-such-store/keys/kafka");
    assert_eq!(code, 404, "{unknown}");
    assert_eq!(unknown["error"], "unknown_store");
    assert!(
        unknown["stores"]
            .as_array()
            .is_some_and(|s| s.contains(&Value::from(STORE))),
        "{unknown}"
    );

    // Every key applied before the scans (a 200 for one key says nothing of the others).
    for k in ["rill", "streams"] {
        await_status(addr, &format!("/stores/kv-store/keys/{k}"), 200);
    }
    let range = await_status(addr, "/stores/kv-store/range?from=kafka&to=rill", 200);
    let keys: Vec<&str> = range["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert_eq!(keys, ["kafka", "rill"], "{range}");
    assert_eq!(range["entries"][1]["value"], 3);
    let all = await_status(addr, "/stores/kv-store/range", 200);
    assert_eq!(all["count"], 3, "{all}");
    let limited = await_status(addr, "/stores/kv-store/range?limit=1", 200);
    assert_eq!(
        (limited["count"].clone(), limited["truncated"].clone()),
        (Value::from(1), Value::from(true))
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    let windows = loop {
        let w = await_status(addr, "/stores/win-store/windows/alice", 200);
        let total: i64 = w["windows"]
            .as_array()
            .expect("windows")
            .iter()
            .filter_map(|w| w["value"].as_i64())
            .sum();
        if total == 3 {
            break w;
        }
        assert!(Instant::now() < deadline, "{w}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let first = &windows["windows"][0];
    assert_eq!(
        first["end"].as_i64().unwrap() - first["start"].as_i64().unwrap(),
        1000,
        "{windows}"
    );
    let (code, none) = get_json(addr, "/stores/win-store/windows/alice?from=0&to=1");
    assert_eq!(
        (code, none["error"].clone()),
        (404, Value::from("key_not_found")),
        "{none}"
    );

    let (code, wrong) = get_json(addr, "/stores/win-store/keys/alice");
    assert_eq!(
        (code, wrong["error"].clone()),
        (400, Value::from("wrong_kind")),
        "{wrong}"
    );
    let (code, bad) = get_json(addr, "/stores/win-store/windows/alice?from=yesterday");
    assert_eq!(
        (code, bad["error"].clone()),
        (400, Value::from("bad_request")),
        "{bad}"
    );

    // From code: the same reads, typed, and typed errors.
    let store = running
        .key_value_store(STORE, StringSerde, I64Serde)
        .expect("kv-store");
    assert_eq!(store.get(&"streams".to_string()).expect("get"), Some(11));
    assert!(matches!(
        running.key_value_store("no-such-store", StringSerde, I64Serde),
        Err(QueryError::UnknownStore { .. })
    ));
    assert!(matches!(
        running.key_value_store(WINDOWS, StringSerde, I64Serde),
        Err(QueryError::WrongKind { .. })
    ));
    let wrong_serde = running
        .key_value_store(STORE, StringSerde, I32Serde)
        .expect("kv-store");
    assert!(matches!(
        wrong_serde.get(&"kafka".to_string()),
        Err(QueryError::Serde { what: "value", .. })
    ));
    // The window store's sub-topology restores on its own, and a partition of it assigned
    // later restores then too: read once it serves, retrying what says to retry.
    await_status(addr, &format!("/stores/{WINDOWS}/windows/alice"), 200);
    let windows = running
        .window_store(WINDOWS, StringSerde, I64Serde)
        .expect("win-store");
    let deadline = Instant::now() + Duration::from_secs(60);
    let fetched = loop {
        match windows.fetch(&"alice".to_string(), i64::MIN, i64::MAX) {
            Err(e) if e.retry_after().is_some() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => break other.expect("fetch"),
        }
    };
    let counted: i64 = fetched.iter().map(|(_, n)| n).sum();
    assert_eq!(counted, 3);

    let (_, metrics) = common::http::get(addr, "/metrics");
    let count =
        |labels: &[&str]| common::http::sum(&metrics, "rill_queries_total", labels).unwrap_or(0.0);
    assert!(
        count(&["route=\"keys\"", "store=\"kv-store\"", "outcome=\"local\""]) >= 1.0,
        "{metrics}"
    );
    assert!(
        count(&[
            "route=\"keys\"",
            "store=\"kv-store\"",
            "outcome=\"not_found\""
        ]) >= 1.0
    );
    assert!(
        count(&[
            "route=\"keys\"",
            "store=\"unknown\"",
            "outcome=\"unknown_store\""
        ]) >= 1.0
    );
    assert!(
        metrics.contains("rill_query_latency_seconds_bucket"),
        "a latency histogram"
    );
    running.shutdown().expect("shutdown");
}
