//! The uncaught-error handler (issue 42, item 6; Kafka Streams' `StreamsUncaughtExceptionHandler`)
//! against a real broker, with in-process instances:
//! - `ReplaceThread`: a processor that fails once; the instance closes its tasks without
//!   committing, rejoins with a new consumer, processes the record again from the last commit
//!   and keeps running; the sums end exact;
//! - `ShutdownApplication`: one of two instances fails; the other reads its request from the
//!   endpoints topic, commits and stops with `ApplicationShutdown`; an instance started
//!   afterwards is not stopped by the old request.
//!
//! Run with `scripts/test`, or by hand after `scripts/kafka start`:
//! `RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo test --test kafka_uncaught_errors -- --ignored`.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill::prelude::*;
use rill::runtime::{
    Config, ConfigBuilder, RunningRuntime, Runtime, RuntimeError, SourceError,
    UncaughtErrorResponse,
};

const POISON: i64 = 13;

/// `input` -> a step that panics on [`POISON`] while `failures` lasts -> sum by key (`sums`).
fn topology(input: &str, failures: Arc<AtomicUsize>) -> Topology {
    let b = StreamsBuilder::new();
    b.stream(input, StringSerde, I64Serde)
        .map_values(move |v: i64| {
            let fail = v == POISON
                && failures
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            assert!(!fail, "the poison value {POISON}");
            v
        })
        .group_by_key()
        .reduce(
            |a: i64, b: i64| a + b,
            Materialized::with(StringSerde, I64Serde).with_name("sums"),
        );
    b.build().expect("topology")
}

fn config(app: &str, dir: &std::path::Path) -> Config {
    ConfigBuilder::new()
        .set("bootstrap.servers", common::bootstrap())
        .set("application.id", app)
        .set("state.dir", dir.display())
        .set("metrics.addr", "off")
        .set("parallelising.factor", 2)
        .set("commit.interval.ms", 100)
        .set("kafka.session.timeout.ms", 6000)
        .build()
        .expect("config")
}

fn send(input: &str, records: &[(String, i64)]) {
    let records: Vec<(Option<Vec<u8>>, Vec<u8>)> = records
        .iter()
        .map(|(k, v)| (Some(k.as_bytes().to_vec()), v.to_be_bytes().to_vec()))
        .collect();
    common::produce(input, &records);
}

/// Waits up to `within` for `f` to hold.
fn wait(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sums(running: &RunningRuntime) -> BTreeMap<String, i64> {
    running
        .key_value_store("sums", StringSerde, I64Serde)
        .and_then(|s| s.all())
        .map(|all| all.into_iter().collect())
        .unwrap_or_default()
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn replace_thread_processes_the_failed_record_again_and_runs_on() {
    let (app, input) = (
        common::unique("uncaught-replace"),
        common::unique("uncaught-in"),
    );
    common::create_topic(&input, 2);
    let dir = tempfile::tempdir().expect("dir");
    let failures = Arc::new(AtomicUsize::new(1));
    let mut runtime =
        Runtime::new(topology(&input, failures.clone()), config(&app, dir.path())).expect("new");
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    runtime.set_uncaught_error_handler(move |e| {
        assert!(e.to_string().contains("poison"), "{e}");
        seen.fetch_add(1, Ordering::SeqCst);
        UncaughtErrorResponse::ReplaceThread
    });
    let running = runtime.start().expect("start");
    let records: Vec<(String, i64)> = (0..200)
        .map(|i| (format!("k{}", i % 10), if i == 77 { POISON } else { i }))
        .collect();
    let mut truth: BTreeMap<String, i64> = BTreeMap::new();
    for (k, v) in &records {
        *truth.entry(k.clone()).or_default() += v;
    }
    send(&input, &records);
    wait(Duration::from_secs(90), "the exact sums", || {
        sums(&running) == truth
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler saw one error");
    assert_eq!(failures.load(Ordering::SeqCst), 0, "the poison failed once");
    assert!(!running.is_finished(), "the instance runs on");
    send(&input, &[("k0".into(), 1000)]);
    *truth.get_mut("k0").expect("k0") += 1000;
    wait(
        Duration::from_secs(30),
        "a record after the replacement",
        || sums(&running) == truth,
    );
    running.shutdown().expect("a clean stop");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn shutdown_application_stops_every_instance_but_not_a_later_start() {
    let (app, input) = (
        common::unique("uncaught-app"),
        common::unique("uncaught-in"),
    );
    common::create_topic(&input, 2);
    let dirs = [(); 3].map(|_| tempfile::tempdir().expect("dir"));
    let handler = |e: &SourceError| {
        assert!(!matches!(e, SourceError::ApplicationShutdown { .. }), "{e}");
        UncaughtErrorResponse::ShutdownApplication
    };
    // Only `a` fails on the poison; `b` sums it like any value.
    let start = |dir: &std::path::Path, failures: usize| {
        let failures = Arc::new(AtomicUsize::new(failures));
        let mut r = Runtime::new(topology(&input, failures), config(&app, dir)).expect("new");
        r.set_uncaught_error_handler(handler);
        r.start().expect("start")
    };
    let a = start(dirs[0].path(), usize::MAX);
    let b = start(dirs[1].path(), 0);
    // Both own a partition once both processed a record of their own.
    let mut n = 0;
    wait(Duration::from_secs(90), "both instances processing", || {
        n += 1;
        send(&input, &[(format!("warm{n}"), 1), (format!("up{n}"), 1)]);
        a.processed() > 0 && b.processed() > 0
    });
    // The poison in each partition: whichever partition `a` owns, it fails on it.
    send(
        &input,
        &(0..20)
            .map(|i| (format!("p{i}"), POISON))
            .collect::<Vec<_>>(),
    );
    wait(Duration::from_secs(60), "both instances stopped", || {
        a.is_finished() && b.is_finished()
    });
    let (ra, rb) = (a.join(), b.join());
    assert!(
        matches!(&ra, Err(e) if e.to_string().contains("poison")),
        "a stopped on its own error: {ra:?}"
    );
    match &rb {
        Err(RuntimeError::Source(SourceError::ApplicationShutdown { error, .. })) => {
            assert!(error.contains("poison"), "b names a's error: {error}")
        }
        other => panic!("b stopped at a's request: {other:?}"),
    }
    // A later start does not obey the request that stays in the compacted topic.
    let c = start(dirs[2].path(), 0);
    send(&input, &[("after".into(), 5)]);
    wait(
        Duration::from_secs(90),
        "a later instance processing",
        || sums(&c).get("after") == Some(&5),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(!c.is_finished(), "the old request stopped a later instance");
    c.shutdown().expect("a clean stop");
}
