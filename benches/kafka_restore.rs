//! Restore and rebalance figures against a real broker.
//!
//! ```sh
//! scripts/kafka start
//! RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo bench --bench kafka_restore
//! ```
//! 1. Restore: one instance counts `RILL_BENCH_KEYS` (default 1,000,000) distinct keys over 4
//!    partitions (P = 4) and stops; a second instance with an empty state dir restores the store
//!    from its changelog. Reported: changelog records restored, restore wall time (first task
//!    restoring to none restoring), records/s and MB/s of key+value bytes, and the time from start
//!    to the first new record processed (group join + restore).
//! 2. Rebalance: instance A processes 4 partitions under a steady input; instance B joins. Reported:
//!    the longest stretch in which A processed nothing, before and during the rebalance.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{bootstrap, input_producer, send, stamp};
use rdkafka::producer::Producer;
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, RunningRuntime, Runtime};

mod common;

fn counting(input: &str) -> Topology {
    let b = StreamsBuilder::new();
    b.stream(input, StringSerde, StringSerde)
        .group_by_key()
        .count("restore-bench-store");
    b.build().expect("topology")
}

fn start(app: &str, input: &str, state: &std::path::Path) -> RunningRuntime {
    let config = ConfigBuilder::new()
        .set("application.id", app)
        .set("bootstrap.servers", bootstrap())
        .set("parallelising.factor", 4)
        .set("state.dir", state.display())
        .set("metrics.addr", "off")
        .with_env()
        .build()
        .expect("config");
    Runtime::new(counting(input), config)
        .expect("runtime")
        .start()
        .expect("start")
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn restore_rate(keys: u64) {
    let input = format!("restore-bench-{}", stamp());
    create_topics(
        &client_config(&bootstrap(), &BTreeMap::new()),
        &[(input.clone(), 4)],
        Duration::from_secs(30),
    )
    .expect("topic");
    let p = input_producer(&bootstrap(), 20).expect("producer");
    let mut bytes = 0u64;
    for i in 0..keys {
        let key = format!("key-{i:09}");
        bytes += key.len() as u64 + 8; // the count is a big-endian i64
        send(&p, &input, Some(key.as_bytes()), b"x").expect("send");
    }
    p.flush(Duration::from_secs(120)).expect("flush");
    let app = format!("restore-bench-{}", stamp());
    let first = tempfile::tempdir().expect("tempdir");
    let running = start(&app, &input, first.path());
    wait_for(
        "the first instance to count every key",
        Duration::from_secs(900),
        || running.processed() >= keys,
    );
    running.shutdown().expect("shutdown");

    let fresh = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let running = start(&app, &input, fresh.path());
    wait_for("a restore to start", Duration::from_secs(120), || {
        running.restoring() > 0 || running.restored() >= keys
    });
    let restore_began = Instant::now();
    for k in 0..4 {
        send(&p, &input, Some(format!("new-{k}").as_bytes()), b"x").expect("send");
    }
    p.flush(Duration::from_secs(30)).expect("flush");
    wait_for("restores to finish", Duration::from_secs(900), || {
        running.restoring() == 0
    });
    let restore_secs = restore_began.elapsed().as_secs_f64();
    wait_for(
        "a new record to be processed",
        Duration::from_secs(120),
        || running.processed() >= 1,
    );
    let first_processed = started.elapsed().as_secs_f64();
    let restored = running.restored();
    running.shutdown().expect("shutdown");
    println!("restore of a {keys}-key store (4 partitions, P = 4, fresh state dir):");
    println!("  changelog records restored: {restored}");
    println!(
        "  restore wall time: {restore_secs:.2} s  ({:.0} records/s, {:.1} MB/s of key+value bytes; \
         sampled every 5 ms, so an upper bound)",
        restored as f64 / restore_secs,
        bytes as f64 / restore_secs / 1e6
    );
    println!(
        "  start to first new record processed (group join + restore): {first_processed:.2} s"
    );
}

/// The longest time `running.processed()` stayed unchanged while sampled for `window`, and the
/// wall-clock time (UTC seconds within the minute) it began, to line up with the logs.
fn longest_stall(running: &RunningRuntime, window: Duration) -> (Duration, f64) {
    let clock = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() % 60.0)
    };
    let end = Instant::now() + window;
    let (mut last, mut since, mut since_clock) = (running.processed(), Instant::now(), clock());
    let mut worst = (Duration::ZERO, since_clock);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
        let now = running.processed();
        if now != last {
            if since.elapsed() > worst.0 {
                worst = (since.elapsed(), since_clock);
            }
            last = now;
            since = Instant::now();
            since_clock = clock();
        }
    }
    if since.elapsed() > worst.0 {
        worst = (since.elapsed(), since_clock);
    }
    worst
}

fn rebalance_pause() {
    let input = format!("rebalance-bench-{}", stamp());
    create_topics(
        &client_config(&bootstrap(), &BTreeMap::new()),
        &[(input.clone(), 4)],
        Duration::from_secs(30),
    )
    .expect("topic");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeder = {
        let (stop, input) = (stop.clone(), input.clone());
        std::thread::spawn(move || {
            // About 2,000 records/s, spread over the partitions by key.
            let p = input_producer(&bootstrap(), 20).expect("producer");
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                send(
                    &p,
                    &input,
                    Some(format!("k{}", i % 10_000).as_bytes()),
                    b"x",
                )
                .expect("send");
                i += 1;
                if i % 20 == 0 {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        })
    };
    let app = format!("rebalance-bench-{}", stamp());
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let a = start(&app, &input, da.path());
    wait_for("A to process", Duration::from_secs(60), || {
        a.processed() > 1000
    });
    let before = longest_stall(&a, Duration::from_secs(5));
    let b = start(&app, &input, db.path());
    let during = longest_stall(&a, Duration::from_secs(10));
    let b_processed = b.processed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    feeder.join().expect("feeder");
    b.shutdown().expect("shutdown B");
    a.shutdown().expect("shutdown A");
    println!("rebalance: instance B joins A's group (4 partitions, ~2,000 records/s):");
    println!(
        "  longest stretch with nothing processed by A, 5 s before B: {:?} (from second {:.3})",
        before.0, before.1
    );
    println!(
        "  the same over the 10 s after B started: {:?} (from second {:.3}; B processed {b_processed} meanwhile)",
        during.0, during.1
    );
}

fn main() {
    rill::runtime::service::init_logging();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let keys = std::env::var("RILL_BENCH_KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    restore_rate(keys);
    rebalance_pause();
}
