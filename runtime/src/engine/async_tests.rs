//! Async stages in the engine: runs with random call durations, `async.max.in.flight`, factors
//! and crashes must end in the state and final outputs of a sequential run, with per-key order
//! kept; a slow call holds up only its key; retries and failed calls follow the handlers.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rill_state::{StateConfig, StateDb};
use rill_topology::prelude::*;
use rill_topology::{key_hash, range_of, RawRecord};

use super::config::AsyncConfig;
use super::*;
use crate::sink::MemorySink;

/// `in` -> `map_values_async` (sleeps `delay(value)` ms) -> per key, the values joined in the
/// order applied -> `out`.
fn joining_topology() -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(|v: String| async move {
            tokio::time::sleep(Duration::from_millis(delay(&v))).await;
            Ok(v)
        })
        .group_by_key_with(Grouped::with(StringSerde, StringSerde))
        .reduce(|a: String, b: String| format!("{a},{b}"), "joined")
        .to_stream()
        .to("out");
    Arc::new(b.build().unwrap())
}

/// A call duration that varies from record to record: completions come out of offset order,
/// and every 11th call is slow, so commits list offsets completed above it.
fn delay(v: &str) -> u64 {
    v.parse::<u64>().map_or(0, |i| {
        if i % 11 == 0 {
            15
        } else {
            (i * 37 + i / 3) % 3
        }
    })
}

fn raw(key: &str, value: &str) -> RawRecord {
    RawRecord {
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.as_bytes().to_vec()),
        timestamp: 0,
        headers: rill_topology::Headers::new(),
    }
}

fn engine(
    topology: Arc<Topology>,
    db: Option<Arc<StateDb>>,
    factor: usize,
    config: AsyncConfig,
    sink: Arc<MemorySink>,
) -> Engine {
    engine_at(topology, db, factor, config, sink, Resume::default())
}

/// [`engine`], resuming as an offset commit says.
fn engine_at(
    topology: Arc<Topology>,
    db: Option<Arc<StateDb>>,
    factor: usize,
    config: AsyncConfig,
    sink: Arc<MemorySink>,
    resume: Resume,
) -> Engine {
    let config = EngineConfig {
        parallelising_factor: factor,
        worker_threads: 2,
        mailbox_capacity: 64,
        async_stages: config,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(topology, config, db, sink, HashMap::new()).unwrap();
    e.assign("in", 0, resume).unwrap();
    e
}

fn open_db(dir: &Path) -> Arc<StateDb> {
    StateDb::open(&StateConfig {
        dir: dir.to_path_buf(),
        memory_bytes: 8 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    })
    .unwrap()
}

/// Dispatches `input[..to]` (offset = index), committing every `commit_every` records.
fn feed(e: &mut Engine, input: &[(String, String)], to: usize, commit_every: usize) {
    feed_from(e, input, 0, to, commit_every)
}

/// Dispatches `input[from..to]` (offset = index), committing every `commit_every` records.
fn feed_from(
    e: &mut Engine,
    input: &[(String, String)],
    from: usize,
    to: usize,
    commit_every: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for (offset, (k, v)) in input.iter().enumerate().take(to).skip(from) {
        let mut r = raw(k, v);
        while let Dispatch::Full(back) = e.dispatch("in", 0, offset as u64, r).unwrap() {
            assert!(
                Instant::now() < deadline,
                "the engine stopped taking records"
            );
            r = back;
            std::thread::sleep(Duration::from_millis(1));
        }
        if offset % commit_every == commit_every - 1 {
            e.request_commit();
        }
    }
}

/// Takes the records written to `out` until there are `n` or 20 s passed.
fn wait_outputs(sink: &MemorySink, n: usize) -> crate::sink::Sent {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        out.extend(sink.take("out"));
        std::thread::sleep(Duration::from_millis(5));
    }
    out
}

/// The last output per key.
fn last_outputs(sink: &MemorySink, into: &mut BTreeMap<String, String>) {
    for (_, r) in sink.take("out") {
        let k = String::from_utf8(r.key.unwrap_or_default()).unwrap();
        let v = String::from_utf8(r.value.unwrap_or_default()).unwrap();
        into.insert(k, v);
    }
}

/// Per key, its values in offset order, joined: what a sequential run ends with.
fn oracle(input: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in input {
        out.entry(k.clone())
            .and_modify(|a| *a = format!("{a},{v}"))
            .or_insert_with(|| v.clone());
    }
    out
}

/// Record `i` of key `k{keys[i]}` has the value `i`.
fn keyed_input(keys: &[u8]) -> Vec<(String, String)> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| (format!("k{k}"), i.to_string()))
        .collect()
}

fn in_flight_limit(in_flight: usize) -> AsyncConfig {
    AsyncConfig {
        max_in_flight: in_flight,
        ..AsyncConfig::default()
    }
}

fn run(
    keys: &[u8],
    factor: usize,
    in_flight: usize,
    crashes: &[usize],
) -> Result<(), TestCaseError> {
    let input = keyed_input(keys);
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let config = in_flight_limit(in_flight);
    let mut outputs = BTreeMap::new();
    let mut stops: Vec<usize> = crashes.iter().map(|c| c % (input.len() + 1)).collect();
    stops.sort_unstable();
    for stop in stops {
        // A run that dies at a random moment: after `stop` records, with calls in flight.
        let mut e = engine(
            joining_topology(),
            Some(open_db(dir.path())),
            factor,
            config.clone(),
            sink.clone(),
        );
        feed(&mut e, &input, stop, 7);
        if stop % 3 == 0 {
            // Every call answered: the commit covers all that was dispatched.
            prop_assert!(e.wait_idle(Duration::from_secs(60)));
            e.request_commit();
            prop_assert!(e.wait_idle(Duration::from_secs(60)));
        }
        // Commits while calls run, then the crash.
        for _ in 0..(stop % 4) {
            std::thread::sleep(Duration::from_millis(3));
            e.request_commit();
        }
        std::thread::sleep(Duration::from_millis(2));
        e.abandon();
        drop(e);
        last_outputs(&sink, &mut outputs);
    }
    let mut e = engine(
        joining_topology(),
        Some(open_db(dir.path())),
        factor,
        config,
        sink.clone(),
    );
    feed(&mut e, &input, input.len(), 7);
    prop_assert!(e.wait_idle(Duration::from_secs(60)), "the run finished");
    prop_assert!(e.failure().is_none(), "{:?}", e.failure());
    last_outputs(&sink, &mut outputs);
    prop_assert_eq!(&outputs, &oracle(&input), "final output per key");
    // The state too: every key's aggregate, in offset order, each record applied once.
    for (k, joined) in oracle(&input) {
        let stored = e.store_get("joined", k.as_bytes()).unwrap();
        let stored = stored.map(|b| String::from_utf8_lossy(&b).into_owned());
        prop_assert!(
            stored.as_deref().is_some_and(|s| s.ends_with(&joined)),
            "state of {}: {:?}, want {}",
            k,
            stored,
            joined
        );
    }
    Ok(())
}

/// Unordered and stateless: live factor changes with calls in flight run every record once.
#[test]
fn live_factor_changes_of_an_unordered_stage_run_every_record_once() {
    let sink = Arc::new(MemorySink::new());
    let mut e = engine_at(
        stateless_topology(None),
        None,
        2,
        unordered(16),
        sink.clone(),
        Resume::default(),
    );
    let input: Vec<(String, String)> = (0..300).map(|i| ("k".to_string(), i.to_string())).collect();
    feed_from(&mut e, &input, 0, 100, 7);
    e.set_parallelising_factor(3, None, Duration::from_secs(60))
        .unwrap();
    feed_from(&mut e, &input, 100, 200, 7);
    e.set_parallelising_factor(1, None, Duration::from_secs(60))
        .unwrap();
    feed_from(&mut e, &input, 200, 300, 7);
    assert!(e.wait_idle(Duration::from_secs(60)));
    assert!(e.failure().is_none(), "{:?}", e.failure());
    assert_eq!(sorted_values(&sink), (0..300).collect::<Vec<u64>>());
}

/// Like [`run`] without crashes, but changing the factor live at the given input indexes, with
/// calls in flight and records queued behind them.
fn run_changing(
    keys: &[u8],
    from: usize,
    changes: &[(usize, usize)],
    in_flight: usize,
) -> Result<(), TestCaseError> {
    let input = keyed_input(keys);
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let config = in_flight_limit(in_flight);
    let mut e = engine(
        joining_topology(),
        Some(open_db(dir.path())),
        from,
        config,
        sink.clone(),
    );
    let mut changes: Vec<(usize, usize)> = changes
        .iter()
        .map(|&(at, to)| (at % (input.len() + 1), to))
        .collect();
    changes.sort_unstable();
    let mut fed = 0;
    for (at, to) in changes {
        feed_from(&mut e, &input, fed, at, 7);
        fed = at;
        let changed = e.set_parallelising_factor(to, None, Duration::from_secs(60));
        prop_assert!(changed.is_ok(), "change to {}: {:?}", to, changed);
    }
    feed_from(&mut e, &input, fed, input.len(), 7);
    prop_assert!(e.wait_idle(Duration::from_secs(60)), "the run finished");
    prop_assert!(e.failure().is_none(), "{:?}", e.failure());
    // The settles' durable commits, made when their last call answered, waited on a worker.
    prop_assert_eq!(super::subtask::WAITS_ON_RUNTIME.load(Ordering::SeqCst), 0);
    let mut outputs = BTreeMap::new();
    last_outputs(&sink, &mut outputs);
    prop_assert_eq!(&outputs, &oracle(&input), "final output per key");
    for (k, joined) in oracle(&input) {
        let stored = e.store_get("joined", k.as_bytes()).unwrap();
        let stored = stored.map(|b| String::from_utf8_lossy(&b).into_owned());
        prop_assert_eq!(stored, Some(joined), "state of {}", k);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("RILL_ASYNC_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24), ..ProptestConfig::default() })]

    /// Live factor changes while calls run and records wait behind them (splits, merges,
    /// factors that do not divide each other): every record applied once, in per-key order.
    #[test]
    fn live_factor_changes_with_calls_in_flight_end_as_the_sequential_run(
        keys in proptest::collection::vec(0u8..6, 1..120),
        from in 1usize..4,
        changes in proptest::collection::vec((0usize..200, 1usize..5), 1..3),
        in_flight in 1usize..12,
    ) {
        run_changing(&keys, from, &changes, in_flight)?;
    }

    /// Random keys and call durations (so random completion orders), P and in-flight limits,
    /// and up to three crashes with calls in flight: the end equals the sequential run.
    #[test]
    fn async_runs_end_as_the_sequential_run(
        keys in proptest::collection::vec(0u8..6, 1..120),
        factor in 1usize..4,
        in_flight in 1usize..12,
        crashes in proptest::collection::vec(0usize..200, 0..3),
    ) {
        run(&keys, factor, in_flight, &crashes)?;
    }
}

/// A call that never answers holds up its own key only: the other keys of the same range go
/// on, and the range's committed offset stays at the stuck record.
#[test]
fn a_slow_call_holds_up_only_its_key() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(|v: String| async move {
            if v == "stuck" {
                std::future::pending::<()>().await;
            }
            Ok(v)
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let sink = Arc::new(MemorySink::new());
    let topology = Arc::new(b.build().unwrap());
    let mut e = engine(topology, None, 1, AsyncConfig::default(), sink.clone());
    let mut input = vec![("a".to_string(), "stuck".to_string())];
    input.extend((0..200).map(|i| (format!("k{}", i % 10), i.to_string())));
    feed(&mut e, &input, input.len(), 1000);
    let out = wait_outputs(&sink, 200);
    assert_eq!(out.len(), 200, "every other key went on");
    // Per key, the order of offsets.
    let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
    for (_, r) in &out {
        let v: u64 = String::from_utf8_lossy(r.value.as_deref().unwrap())
            .parse()
            .unwrap();
        let k = r.key.clone().unwrap();
        assert!(last.get(&k).is_none_or(|&p| p < v), "per-key order");
        last.insert(k, v);
    }
    e.request_commit();
    std::thread::sleep(Duration::from_millis(100));
    let progress = e.collect_progress();
    assert_eq!(
        progress[0].low_watermark, 0,
        "the stuck record is not committed"
    );
    e.abandon();
}

/// Sets its flag when dropped: a call's future holds one to show it was cancelled.
struct DropFlag(Arc<AtomicUsize>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A partition lost while calls run: its sub-task goes, its driver drops the calls (their
/// records were not committed), and they stop counting as the engine's work.
#[test]
fn calls_of_a_lost_partition_are_dropped_and_stop_counting_as_work() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(move |v: String| {
            let flag = DropFlag(d.clone());
            async move {
                let _flag = flag;
                std::future::pending::<()>().await;
                Ok(v)
            }
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(
        Arc::new(b.build().unwrap()),
        None,
        2,
        AsyncConfig::default(),
        sink.clone(),
    );
    let input: Vec<(String, String)> = (0..20).map(|i| (format!("k{i}"), i.to_string())).collect();
    feed(&mut e, &input, 20, 1000);
    assert!(
        !e.wait_idle(Duration::from_millis(300)),
        "stuck calls count as work"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    e.revoke(
        &[TopicPartition::new("in", 0)],
        Duration::from_secs(1),
        true,
    );
    assert!(
        e.wait_idle(Duration::from_secs(10)),
        "the lost partition's calls are work no more"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped.load(Ordering::SeqCst) < 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(dropped.load(Ordering::SeqCst), 20, "every call was dropped");
    assert!(sink.take("out").is_empty());
}

/// Keys of several ranges with in-flight limit 1 still make progress, each key in order.
#[test]
fn an_in_flight_limit_of_one_runs_one_call_at_a_time() {
    let running = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let (r, m) = (running.clone(), most.clone());
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(move |v: String| {
            let (r, m) = (r.clone(), m.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok(v)
            }
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let sink = Arc::new(MemorySink::new());
    let config = AsyncConfig {
        max_in_flight: 1,
        ..AsyncConfig::default()
    };
    let mut e = engine(Arc::new(b.build().unwrap()), None, 1, config, sink.clone());
    let input: Vec<(String, String)> = (0..50).map(|i| (format!("k{i}"), i.to_string())).collect();
    feed(&mut e, &input, 50, 1000);
    assert!(e.wait_idle(Duration::from_secs(30)));
    assert_eq!(sink.take("out").len(), 50);
    assert_eq!(most.load(Ordering::SeqCst), 1, "one call at a time");
}

/// A retryable error is retried with backoff; after `retry.max.attempts` the processing
/// handler decides, and a dead-letter record says how many attempts were made.
#[test]
fn retryable_errors_are_retried_then_dead_lettered() {
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(move |v: String| {
            let n = a.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                match v.as_str() {
                    // Fails twice, then answers: within 3 attempts.
                    "flaky" if n <= 2 => Err(ProcessError::retryable("briefly down")),
                    "down" => Err(ProcessError::retryable("still down")),
                    "panics" => panic!("a bug in the call"),
                    _ => Ok(v),
                }
            }
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let sink = Arc::new(MemorySink::new());
    let config = EngineConfig {
        processing_handler: RecordErrorHandler::DeadLetter("dlq".into()),
        async_stages: AsyncConfig {
            max_in_flight: 1,
            retry_max_attempts: 3,
            retry_backoff: Duration::from_millis(5),
            ..AsyncConfig::default()
        },
        ..EngineConfig::default()
    };
    let mut e = Engine::new(
        Arc::new(b.build().unwrap()),
        config,
        None,
        sink.clone(),
        HashMap::new(),
    )
    .unwrap();
    e.assign("in", 0, Resume::default()).unwrap();
    let input = [("k", "flaky"), ("k", "down"), ("k", "panics"), ("k", "ok")];
    for (i, (k, v)) in input.iter().enumerate() {
        let _ = e.dispatch("in", 0, i as u64, raw(k, v)).unwrap();
    }
    assert!(e.wait_idle(Duration::from_secs(30)));
    assert!(e.failure().is_none(), "{:?}", e.failure());
    let out: Vec<String> = sink
        .take("out")
        .into_iter()
        .map(|(_, r)| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    assert_eq!(out, ["flaky", "ok"], "per key in order, failures skipped");
    let dead = sink.take("dlq");
    assert_eq!(dead.len(), 2);
    let header = |r: &RawRecord, name: &str| {
        r.headers
            .last(name)
            .flatten()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(
        header(&dead[0].1, "rill.error.attempts").as_deref(),
        Some("3")
    );
    assert_eq!(
        header(&dead[0].1, "rill.source.offset").as_deref(),
        Some("1")
    );
    assert_eq!(
        header(&dead[1].1, "rill.error.attempts").as_deref(),
        Some("1")
    );
    assert!(header(&dead[1].1, "rill.error").is_some_and(|e| e.contains("a bug in the call")));
    // flaky: 3 calls, down: 3, panics: 1, ok: 1.
    assert_eq!(attempts.load(Ordering::SeqCst), 8);
}

/// Keys spread over ranges at P = 4 with per-key order: the outputs of each key are in offset
/// order although calls of later records finish first.
#[test]
fn per_key_order_holds_across_ranges() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(|v: String| async move {
            // Earlier records of a key take longer.
            let i: u64 = v.parse().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(10u64.saturating_sub(i / 10))).await;
            Ok(v)
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(
        Arc::new(b.build().unwrap()),
        None,
        4,
        AsyncConfig::default(),
        sink.clone(),
    );
    let input: Vec<(String, String)> = (0..100)
        .map(|i| (format!("k{}", i % 7), i.to_string()))
        .collect();
    feed(&mut e, &input, 100, 1000);
    assert!(e.wait_idle(Duration::from_secs(30)));
    let mut per_key: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
    for (_, r) in sink.take("out") {
        let v = String::from_utf8_lossy(r.value.as_deref().unwrap())
            .parse()
            .unwrap();
        per_key.entry(r.key.unwrap()).or_default().push(v);
    }
    assert_eq!(per_key.len(), 7);
    for (k, vs) in per_key {
        let mut sorted = vs.clone();
        sorted.sort_unstable();
        assert_eq!(vs, sorted, "key {:?}", String::from_utf8_lossy(&k));
        let r = range_of(key_hash(&k), 4);
        assert!(r < 4);
    }
}

/// `in` -> `map_values_async` (sleeps `delay(value)` ms) -> `out`, without state.
fn stateless_topology(stuck: Option<&'static str>) -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(move |v: String| async move {
            if Some(v.as_str()) == stuck {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(delay(&v))).await;
            Ok(v)
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    Arc::new(b.build().unwrap())
}

/// `in` -> `map_values` (blocking: sleeps 1 ms while `running` counts the records in it and
/// `most` the most at once) -> `out`, without state.
fn blocking_topology(running: Arc<AtomicUsize>, most: Arc<AtomicUsize>) -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values(move |v: String| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            running.fetch_sub(1, Ordering::SeqCst);
            v
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    Arc::new(b.build().unwrap())
}

fn unordered(in_flight: usize) -> AsyncConfig {
    AsyncConfig {
        max_in_flight: in_flight,
        order: super::config::ProcessingOrder::Unordered,
        ..AsyncConfig::default()
    }
}

/// `processing.order=unordered`: a stuck call holds up no record, not even of its own key.
#[test]
fn unordered_runs_records_of_one_key_at_once() {
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(
        stateless_topology(Some("stuck")),
        None,
        1,
        unordered(100),
        sink.clone(),
    );
    let mut input = vec![("a".to_string(), "stuck".to_string())];
    input.extend((0..50).map(|i| ("a".to_string(), i.to_string())));
    feed(&mut e, &input, input.len(), 1000);
    let out = wait_outputs(&sink, 50);
    assert_eq!(out.len(), 50, "the key's other records went on");
    e.request_commit();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        e.collect_progress()[0].low_watermark,
        0,
        "the stuck record is not committed"
    );
    e.abandon();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Unordered, stateless, async or blocking, with crashes: every record's output is there at
    /// least once (and exactly once without a crash), whatever the completion order.
    #[test]
    fn unordered_outputs_are_at_least_once(
        keys in proptest::collection::vec(0u8..3, 1..100),
        factor in 1usize..4,
        in_flight in 1usize..20,
        crashes in proptest::collection::vec(0usize..150, 0..3),
        blocking in any::<bool>(),
    ) {
        let topology = if blocking {
            blocking_topology(Arc::default(), Arc::default())
        } else {
            stateless_topology(None)
        };
        let input: Vec<(String, String)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (format!("k{k}"), i.to_string()))
            .collect();
        let sink = Arc::new(MemorySink::new());
        let mut stops: Vec<usize> = crashes.iter().map(|c| c % (input.len() + 1)).collect();
        stops.sort_unstable();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut take = |sink: &MemorySink| {
            for (_, r) in sink.take("out") {
                *seen.entry(String::from_utf8(r.value.unwrap_or_default()).unwrap()).or_default() += 1;
            }
        };
        // What the last offset commit said: each run resumes there, as from Kafka.
        let mut resume = Resume::default();
        for &stop in &stops {
            let from = resume.committed.unwrap_or(0) as usize;
            let mut e = engine_at(topology.clone(), None, factor, unordered(in_flight), sink.clone(), resume.clone());
            feed_from(&mut e, &input, from, stop.max(from), 5);
            std::thread::sleep(Duration::from_millis(3));
            e.request_commit();
            std::thread::sleep(Duration::from_millis(2));
            if let Some(p) = e.collect_progress().into_iter().next() {
                resume.committed = Some(p.low_watermark);
                resume.ranges = p.ranges;
                resume.hash_id = p.hash_id;
            }
            e.abandon();
            drop(e);
            take(&sink);
        }
        let from = resume.committed.unwrap_or(0) as usize;
        let mut e = engine_at(topology, None, factor, unordered(in_flight), sink.clone(), resume);
        feed_from(&mut e, &input, from, input.len(), 5);
        prop_assert!(e.wait_idle(Duration::from_secs(60)));
        prop_assert!(e.failure().is_none());
        take(&sink);
        for (_, v) in &input {
            let n = seen.get(v).copied().unwrap_or(0);
            prop_assert!(n >= 1, "record {} has no output", v);
            prop_assert!(!stops.is_empty() || n == 1, "record {} output {} times without a crash", v, n);
        }
    }
}

/// Without state a range resumes from the commit metadata alone: the offsets it completed above
/// a stuck record travel there (`PartitionProgress::applied`), so after a restart only the stuck
/// record runs again, not the 50 that completed after it.
#[test]
fn a_restart_without_state_runs_only_the_incomplete_records_again() {
    for order in [
        super::config::ProcessingOrder::Key,
        super::config::ProcessingOrder::Unordered,
    ] {
        let config = AsyncConfig {
            order,
            ..AsyncConfig::default()
        };
        let sink = Arc::new(MemorySink::new());
        let mut input = vec![("a".to_string(), "stuck".to_string())];
        input.extend((0..50).map(|i| (format!("k{i}"), i.to_string())));
        let mut e = engine(
            stateless_topology(Some("stuck")),
            None,
            2,
            config.clone(),
            sink.clone(),
        );
        feed(&mut e, &input, input.len(), 1000);
        assert_eq!(wait_outputs(&sink, 50).len(), 50);
        e.request_commit();
        std::thread::sleep(Duration::from_millis(200));
        let p = e.collect_progress().remove(0);
        assert_eq!(p.low_watermark, 0, "the stuck record holds the watermark");
        let listed: usize = p.applied.iter().map(Vec::len).sum();
        // The stuck record's range lists the ones after it; the other range passed them all.
        assert!(
            listed > 0,
            "the completed records are listed: {:?}",
            p.applied
        );
        e.abandon();
        drop(e);
        // Through the codec, as the committer and the next owner see it.
        let (_, m) = through_metadata(&p);
        let resume = Resume {
            committed: Some(p.low_watermark),
            applied: m.ranges.iter().map(|(r, _)| *r).zip(m.applied).collect(),
            ranges: m.ranges,
            hash_id: m.hash_id,
            ..Resume::default()
        };
        let mut e = engine_at(
            stateless_topology(None),
            None,
            2,
            config,
            sink.clone(),
            resume,
        );
        feed(&mut e, &input, input.len(), 1000);
        assert!(e.wait_idle(Duration::from_secs(20)));
        let again: Vec<String> = sink
            .take("out")
            .into_iter()
            .map(|(_, r)| String::from_utf8(r.value.unwrap_or_default()).unwrap())
            .collect();
        assert_eq!(
            again,
            ["stuck"],
            "{order}: only the incomplete record runs again"
        );
    }
}

/// A partition's progress through the commit-metadata codec, as the committer writes it and
/// the next owner reads it: the text and what it decodes to.
fn through_metadata(
    p: &crate::engine::PartitionProgress,
) -> (String, crate::kafka::metadata::RangeOffsets) {
    let text = crate::kafka::metadata::encode(
        &crate::kafka::metadata::RangeOffsets {
            hash_id: p.hash_id,
            ranges: p.ranges.clone(),
            lineage: None,
            applied: p.applied.clone(),
            handed_over: false,
        },
        p.low_watermark,
    )
    .expect("the listing fits the commit metadata");
    let m = crate::kafka::metadata::decode(&text, p.low_watermark).expect("decodes");
    (text, m)
}

/// Dispatches `input` (offset = index) until done or until the engine has taken nothing for
/// 300 ms (a range that starts no more records); returns how many it took.
fn feed_until_held(e: &mut Engine, input: &[(String, String)]) -> usize {
    let mut stalled_since = Instant::now();
    let mut offset = 0;
    while offset < input.len() && stalled_since.elapsed() < Duration::from_millis(300) {
        let (k, v) = &input[offset];
        match e.dispatch("in", 0, offset as u64, raw(k, v)).unwrap() {
            Dispatch::Full(_) => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                offset += 1;
                stalled_since = Instant::now();
            }
        }
    }
    offset
}

/// Without state, the completed offsets a range lists travel in the commit metadata in their
/// shortest form: one stuck record below thousands of completed ones costs one run (before,
/// gaps let a range list 993 and then start nothing more); with a stuck record every third,
/// the range stops starting records before their listing would overflow the metadata, so the
/// commit still carries every one of them.
#[test]
fn the_listed_offsets_fit_the_commit_metadata() {
    for (stuck_every, records) in [(usize::MAX, 5_000), (3, 60_000)] {
        let sink = Arc::new(MemorySink::new());
        let mut e = engine(
            stateless_topology(Some("stuck")),
            None,
            1,
            // Stuck calls keep their slots: room for all of them.
            unordered(30_000),
            sink.clone(),
        );
        let input: Vec<(String, String)> = (0..records)
            .map(|i| {
                let v = if i % stuck_every == 0 {
                    "stuck".to_string()
                } else {
                    "1".to_string()
                };
                (format!("k{i}"), v)
            })
            .collect();
        let taken = feed_until_held(&mut e, &input);
        // Every started call but the stuck ones answers within a few milliseconds.
        std::thread::sleep(Duration::from_millis(300));
        e.request_commit();
        std::thread::sleep(Duration::from_millis(200));
        let p = e.collect_progress().remove(0);
        let listed: usize = p.applied.iter().map(Vec::len).sum();
        let (text, m) = through_metadata(&p);
        assert_eq!(
            m.applied, p.applied,
            "the metadata carries every listed offset"
        );
        eprintln!(
            "stuck every {stuck_every}: {taken} records taken, {listed} listed, {} bytes of metadata",
            text.len()
        );
        if stuck_every == usize::MAX {
            assert_eq!(taken, records);
            assert_eq!(listed, records - 1, "all but the stuck one completed");
        } else {
            assert!(taken < records, "the range stopped starting records");
            // ~3,000 bytes of bitmap: about 24,000 offsets, two thirds of them completed.
            assert!(listed > 10_000, "listed {listed}");
        }
        e.abandon();
    }
}

/// A range whose listing of completed offsets has reached its share of the commit metadata
/// still starts its lowest open record (here queued behind a slow call of its key): completing
/// it is what shrinks the listing. Before, it started nothing more and stalled for good.
#[test]
fn a_full_listing_still_starts_the_lowest_open_record() {
    // 64 ranges: a range's share is ~20 bytes, about ten listed offsets.
    let p = 64;
    let hot = "hot".to_string();
    let range = range_of(key_hash(hot.as_bytes()), p);
    let (same, elsewhere): (Vec<String>, Vec<String>) = (0..8000)
        .map(|i| format!("k{i}"))
        .partition(|k| range_of(key_hash(k.as_bytes()), p) == range);
    // Values are offsets; `delay`: offset 0 (the hot key's first record) sleeps 15 ms, most
    // others 0-2 ms. The range's records are 11 offsets apart (the others go to other ranges),
    // so what completes above the hot key's second record lists as gaps and fills the share.
    let mut input = vec![(hot.clone(), String::new()), (hot.clone(), String::new())];
    for (i, k) in same.iter().take(60).enumerate() {
        input.push((k.clone(), String::new()));
        input.extend(
            elsewhere[i * 10..i * 10 + 10]
                .iter()
                .map(|k| (k.clone(), String::new())),
        );
    }
    input.push((hot.clone(), String::new()));
    for (i, (_, v)) in input.iter_mut().enumerate() {
        *v = i.to_string();
    }
    let sink = Arc::new(MemorySink::new());
    let mut e = engine(
        stateless_topology(None),
        None,
        p,
        AsyncConfig::default(),
        sink.clone(),
    );
    feed(&mut e, &input, input.len(), 1000);
    assert!(
        e.wait_idle(Duration::from_secs(10)),
        "the range went on after its listing was full"
    );
    assert_eq!(
        sorted_values(&sink),
        (0..input.len() as u64).collect::<Vec<u64>>()
    );
}

/// The values written to `out` so far (numbers), sorted.
fn sorted_values(sink: &MemorySink) -> Vec<u64> {
    let mut values: Vec<u64> = sink
        .take("out")
        .into_iter()
        .map(|(_, r)| {
            String::from_utf8_lossy(r.value.as_deref().unwrap_or_default())
                .parse()
                .unwrap()
        })
        .collect();
    values.sort_unstable();
    values
}

/// Unordered without state routes records to ranges by offset, not key: a single hot key's
/// blocking records run on every worker at once, and the commit says how it routed them. Keyed
/// routing runs them one at a time.
#[test]
fn unordered_spreads_one_hot_key_over_every_range() {
    use rill_topology::OFFSET_HASH_ID;
    for (order, hash_id, at_once) in [
        (super::config::ProcessingOrder::Key, HASH_ID, 1..=1),
        (
            super::config::ProcessingOrder::Unordered,
            OFFSET_HASH_ID,
            2..=2,
        ),
    ] {
        let (running, most) = (Arc::default(), Arc::new(AtomicUsize::new(0)));
        let sink = Arc::new(MemorySink::new());
        let config = AsyncConfig {
            order,
            ..AsyncConfig::default()
        };
        let topology = blocking_topology(running, most.clone());
        let mut e = engine(topology, None, 4, config, sink.clone());
        let input: Vec<(String, String)> = (0..200)
            .map(|i| ("hot".to_string(), i.to_string()))
            .collect();
        feed(&mut e, &input, input.len(), 1000);
        assert!(e.wait_idle(Duration::from_secs(30)));
        e.request_commit();
        assert!(e.wait_idle(Duration::from_secs(30)));
        let progress = e.collect_progress();
        assert_eq!(progress[0].hash_id, hash_id, "{order}");
        assert_eq!(progress[0].low_watermark, 200, "{order}");
        assert!(
            at_once.contains(&most.load(Ordering::SeqCst)),
            "{order}: {} records of the hot key ran at once on 2 workers",
            most.load(Ordering::SeqCst)
        );
        let values = sorted_values(&sink);
        assert_eq!(values, (0..200).collect::<Vec<u64>>(), "{order}: each once");
    }
}

/// Range offsets committed under one routing are not read under the other (a change of
/// `processing.order` between runs): the range's offsets name other records there. A restart
/// with the same routing skips exactly what the ranges applied; with the other, it runs every
/// record above the committed offset again (at least once), and skips none wrongly.
#[test]
fn range_offsets_of_another_routing_are_not_trusted() {
    use super::config::ProcessingOrder::{Key, Unordered};
    use rill_topology::keyrange::null_key_hash;
    use rill_topology::{ranges, OFFSET_HASH_ID};
    let input: Vec<(String, String)> = (0..60).map(|i| (format!("k{i}"), i.to_string())).collect();
    // Range 0 of 4 applied everything below 40 that routes to it; the others nothing.
    let committed = |hash_id| Resume {
        committed: Some(0),
        ranges: ranges(4).into_iter().zip([40, 0, 0, 0]).collect(),
        hash_id,
        ..Resume::default()
    };
    let routes_to_0 = |i: u64, hash_id| {
        let hash = if hash_id == HASH_ID {
            key_hash(format!("k{i}").as_bytes())
        } else {
            null_key_hash(i)
        };
        range_of(hash, 4) == 0
    };
    for (order, ran_with) in [(Key, HASH_ID), (Unordered, OFFSET_HASH_ID)] {
        for hash_id in [HASH_ID, OFFSET_HASH_ID] {
            let sink = Arc::new(MemorySink::new());
            let config = AsyncConfig {
                order,
                ..AsyncConfig::default()
            };
            let topology = blocking_topology(Arc::default(), Arc::default());
            let mut e = engine_at(topology, None, 4, config, sink.clone(), committed(hash_id));
            feed(&mut e, &input, input.len(), 1000);
            assert!(e.wait_idle(Duration::from_secs(30)));
            let ran = sorted_values(&sink);
            let want: Vec<u64> = (0..60)
                .filter(|&i| hash_id != ran_with || i >= 40 || !routes_to_0(i, hash_id))
                .collect();
            assert_eq!(ran, want, "{order} after a commit with hash id {hash_id}");
            assert!(
                want.len() < 60 || hash_id != ran_with,
                "some records skipped"
            );
        }
    }
}

/// Offset routing only where nothing depends on the key's range: a sub-topology with state,
/// or one that writes or reads a repartition topic (whose de-duplication follows the upstream
/// routing), keeps routing by key under `processing.order=unordered`.
#[test]
fn only_sub_topologies_without_state_or_repartition_route_by_offset() {
    use super::config::ProcessingOrder::{Key, Unordered};
    use rill_topology::OFFSET_HASH_ID;
    let b = StreamsBuilder::new();
    let s = b.stream("in", StringSerde, StringSerde);
    s.to_with("copy", Produced::with(StringSerde, StringSerde));
    s.select_key(|_k: Option<&String>, v: &String| v.clone())
        .group_by_key_with(Grouped::with(StringSerde, StringSerde))
        .count("counts");
    let topology = b.build().unwrap();
    let subs = topology.sub_topologies();
    assert_eq!(
        subs.len(),
        2,
        "the stream, and the count after its repartition"
    );
    for sub in subs {
        assert_eq!(routing_hash_id(sub, Key), HASH_ID);
        assert_eq!(
            routing_hash_id(sub, Unordered),
            HASH_ID,
            "sub-topology {}",
            sub.id
        );
    }
    let plain = blocking_topology(Arc::default(), Arc::default());
    let sub = &plain.sub_topologies()[0];
    assert_eq!(routing_hash_id(sub, Key), HASH_ID);
    assert_eq!(routing_hash_id(sub, Unordered), OFFSET_HASH_ID);
}

/// The threads that handled the answers of 300 quick calls, one per downstream record.
fn threads_handling_answers(sink: Arc<dyn RecordSink>) -> Vec<String> {
    let names = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let n = names.clone();
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(|v: String| async move {
            tokio::time::sleep(Duration::from_micros(200)).await;
            Ok(v)
        })
        .peek(move |_: Option<&String>, _: &String| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            n.lock().push(name);
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let config = EngineConfig {
        parallelising_factor: 1,
        worker_threads: 2,
        mailbox_capacity: 64,
        async_stages: AsyncConfig::default(),
        ..EngineConfig::default()
    };
    let topology = Arc::new(b.build().unwrap());
    let mut e = Engine::new(topology, config, None, sink, HashMap::new()).unwrap();
    e.assign("in", 0, Resume::default()).unwrap();
    let input: Vec<(String, String)> = (0..300).map(|i| (format!("k{i}"), i.to_string())).collect();
    for (i, chunk) in input.chunks(10).enumerate() {
        feed_from(&mut e, &input, i * 10, i * 10 + chunk.len(), 1000);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(e.wait_idle(Duration::from_secs(30)));
    let names = names.lock().clone();
    assert_eq!(names.len(), 300, "each answer handled once");
    names
}

/// Answers are handled on the runtime thread only while the sink has room: a send there could
/// wait for deliveries, and every other call on the runtime would wait behind it.
#[test]
fn answers_go_to_the_pool_while_the_sink_is_short_of_room() {
    let on_runtime =
        |names: &[String]| names.iter().filter(|n| n.starts_with("rill-async")).count();
    let with_room = threads_handling_answers(Arc::new(MemorySink::new()));
    assert!(
        on_runtime(&with_room) > 0,
        "no answer was handled on the runtime thread even with room: {with_room:?}"
    );
    let without = threads_handling_answers(Arc::new(super::tests::NoRoom::default()));
    assert_eq!(on_runtime(&without), 0, "{without:?}");
}

/// Answers that arrive while a job runs go before the records queued behind it: handling an
/// answer frees a call's place, and records that waited for places would otherwise wait for
/// the whole queue ahead of it (at the start, or after a restart, a full mailbox).
#[test]
fn answers_are_handled_before_records_queued_ahead_of_them() {
    let log = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let gate = Arc::new(super::tests::Gate::default());
    let (l1, l2, g) = (log.clone(), log.clone(), gate.clone());
    // Set by the test once the records are queued; set by the slow call when it answers.
    let queued = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (q, a) = (queued.clone(), answered.clone());
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .peek(move |_: Option<&String>, v: &String| {
            if v == "gate" {
                l1.lock().push("at the gate".to_string());
                g.wait();
            }
            l1.lock().push(format!("start {v}"));
        })
        .map_values_async(move |v: String| {
            let (q, a) = (q.clone(), a.clone());
            async move {
                if v == "slow" {
                    while !q.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    a.store(true, Ordering::SeqCst);
                }
                Ok(v)
            }
        })
        .peek(move |_: Option<&String>, v: &String| l2.lock().push(format!("done {v}")))
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let sink = Arc::new(MemorySink::new());
    let topology = Arc::new(b.build().unwrap());
    let mut e = engine(topology, None, 1, AsyncConfig::default(), sink.clone());
    // "slow" starts its call; "gate" holds the job; the rest queue in the mailbox after that.
    let mut input = vec![
        ("a".to_string(), "slow".to_string()),
        ("b".to_string(), "gate".to_string()),
    ];
    input.extend((0..5).map(|i| (format!("k{i}"), format!("x{i}"))));
    feed(&mut e, &input, 2, 1000);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.lock().contains(&"at the gate".to_string()) {
        assert!(Instant::now() < deadline, "the job never reached the gate");
        std::thread::sleep(Duration::from_millis(1));
    }
    feed_from(&mut e, &input, 2, input.len(), 1000);
    // The slow call answers while the job still waits at the gate (its answer is queued in the
    // same poll of the driver that saw it resolve).
    queued.store(true, Ordering::SeqCst);
    while !answered.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the slow call never answered");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(!log.lock().contains(&"done slow".to_string()));
    gate.open();
    assert!(e.wait_idle(Duration::from_secs(10)));
    let log = log.lock().clone();
    let at = |s: &str| log.iter().position(|l| l == s).unwrap_or(usize::MAX);
    assert!(at("done slow") < at("start x0"), "{log:?}");
    assert_eq!(sink.take("out").len(), 7);
}

/// `in` (value: the call's delay in ms) -> an async call -> count per key in 10 ms tumbling
/// windows without grace, emitted when they close -> `out` as `key@start` = count.
fn windowed_count_after_call() -> Arc<Topology> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .map_values_async(|v: String| async move {
            tokio::time::sleep(Duration::from_millis(v.parse().unwrap_or(0))).await;
            Ok(v)
        })
        .group_by_key_with(Grouped::with(StringSerde, StringSerde))
        .windowed_by(TimeWindows::of_size_and_grace(
            Duration::from_millis(10),
            Duration::ZERO,
        ))
        .emit_strategy(EmitStrategy::on_window_close())
        .count("per-window")
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n.to_string()))
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    Arc::new(b.build().unwrap())
}

/// A crash while an early record's call runs and later ones completed: the commit must record
/// the settled time, not the time of the later records, or the replayed early record is late
/// (issue 42, item 1: drops after a downtime).
#[test]
fn a_record_replayed_after_a_crash_is_not_late_for_records_that_completed_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(MemorySink::new());
    let input = [("slow", "2000", 1), ("fast", "0", 2), ("fast", "0", 25)];
    let send = |e: &mut Engine, from: usize, records: &[(&str, &str, i64)]| {
        for (i, (k, v, ts)) in records.iter().enumerate() {
            let mut r = raw(k, v);
            r.timestamp = *ts;
            let offset = (from + i) as u64;
            assert!(matches!(
                e.dispatch("in", 0, offset, r).unwrap(),
                Dispatch::Queued
            ));
        }
    };
    let topology = windowed_count_after_call();
    let config = in_flight_limit(16);
    let mut e = engine(
        topology.clone(),
        Some(open_db(dir.path())),
        1,
        config.clone(),
        sink.clone(),
    );
    send(&mut e, 0, &input);
    // The fast records complete; the commit lists them above the open slow one.
    std::thread::sleep(Duration::from_millis(200));
    e.request_commit();
    std::thread::sleep(Duration::from_millis(200));
    e.abandon();
    drop(e);
    let mut e = engine(topology, Some(open_db(dir.path())), 1, config, sink.clone());
    send(
        &mut e,
        0,
        &[("slow", "0", 1), ("fast", "0", 2), ("fast", "0", 25)],
    );
    send(&mut e, 3, &[("fast", "0", 50)]);
    assert!(e.wait_idle(Duration::from_secs(60)));
    assert!(e.failure().is_none(), "{:?}", e.failure());
    assert_eq!(e.stats().late_dropped(), 0, "the slow record was on time");
    let mut got: Vec<(String, String)> = sink
        .take("out")
        .into_iter()
        .map(|(_, r)| {
            let text = |b: Option<Vec<u8>>| String::from_utf8(b.unwrap_or_default()).unwrap();
            (text(r.key), text(r.value))
        })
        .collect();
    got.sort();
    let want = [("fast@0", "1"), ("fast@20", "1"), ("slow@0", "1")]
        .map(|(k, v)| (k.to_string(), v.to_string()));
    assert_eq!(got, want);
    assert!(
        e.stats().duplicates() >= 2,
        "the fast records ran before the crash"
    );
}
