//! A broker that goes away mid-run and comes back loses nothing: the test broker is frozen
//! (SIGSTOP) for longer than the session timeout while the runtime processes, then resumed
//! (SIGCONT); the final counts must equal the ground truth.
//!
//! Its own test binary, so no other broker test runs while the broker is frozen.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use common::{bootstrap, create_topic, long, produce, read_until, unique};
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime};

/// The pid of the broker `scripts/kafka` started.
fn broker_pid() -> String {
    let cache = std::env::var("RILL_BROKER_CACHE").unwrap_or_else(|_| {
        format!(
            "{}/.cache/rill/kafka-4.4.0",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let port = std::env::var("RILL_BROKER_PORT").unwrap_or_else(|_| "9092".into());
    let path = format!("{cache}/run-{port}/pid");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| {
            panic!("broker pid file {path}: {e} (start the broker with scripts/kafka)")
        })
        .trim()
        .to_string()
}

fn signal(sig: &str, pid: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}

/// Resumes the broker even if the test panics while it is frozen.
struct Thaw(String);
impl Drop for Thaw {
    fn drop(&mut self) {
        signal("CONT", &self.0);
    }
}

/// Waits until a new client sees `topic`'s partitions led by a listed broker. Right after a
/// freeze the broker is fenced for a moment and a metadata answer lists no broker; a client that
/// gets that answer may forget every broker (librdkafka#5301; rill's clients have a watch for
/// it, the test's input producer does not), so the test produces only once three answers in a
/// row, a second apart, list them (a first good answer can come from the broker's cache before
/// the fence).
fn wait_until_served(topic: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut in_a_row = 0;
    loop {
        let consumer: BaseConsumer = common::Cluster::test().client().create().expect("client");
        let served = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .is_ok_and(|md| {
                !md.brokers().is_empty()
                    && md.topics().iter().all(|t| {
                        t.error().is_none()
                            && !t.partitions().is_empty()
                            && t.partitions().iter().all(|p| p.leader() >= 0)
                    })
            });
        in_a_row = if served { in_a_row + 1 } else { 0 };
        if in_a_row == 3 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broker did not serve {topic} within 2 minutes of its thaw"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_frozen_broker_that_comes_back_loses_nothing() {
    // What the clients saw goes to the test's output (`RILL_LOG`, default info): a failure in CI
    // is diagnosed from it.
    rill::runtime::service::init_logging();
    let (input, output, app) = (unique("outage-in"), unique("outage-out"), unique("outage"));
    create_topic(&input, 2);
    create_topic(&output, 2);
    let mut truth: HashMap<String, i64> = HashMap::new();
    let mut batch = |from: usize| -> Vec<common::Input> {
        (from..from + 2000)
            .map(|i| {
                let key = format!("k{}", i % 50);
                *truth.entry(key.clone()).or_default() += 1;
                (Some(key.into_bytes()), i.to_string().into_bytes())
            })
            .collect()
    };
    let first = batch(0);
    let second = batch(2000);
    produce(&input, &first);
    let builder = StreamsBuilder::new();
    builder
        .stream(&input, StringSerde, StringSerde)
        .group_by_key()
        .count("counts")
        .to_stream()
        .to(&output);
    let state = tempfile::tempdir().expect("tempdir");
    let config = ConfigBuilder::new()
        .set("application.id", &app)
        .set("bootstrap.servers", bootstrap())
        .set("parallelising.factor", 4)
        .set("state.dir", state.path().display())
        .set("metrics.addr", "off")
        .set("kafka.session.timeout.ms", 6000)
        .build()
        .expect("config");
    let runtime = Runtime::new(builder.build().expect("topology"), config).expect("runtime");
    let running = runtime.start().expect("start");
    std::thread::sleep(Duration::from_secs(2));
    let pid = broker_pid();
    signal("STOP", &pid);
    let thaw = Thaw(pid);
    std::thread::sleep(Duration::from_secs(12));
    drop(thaw);
    wait_until_served(&input);
    produce(&input, &second);
    let expected: HashMap<Vec<u8>, Vec<u8>> = truth
        .iter()
        .map(|(k, n)| (k.as_bytes().to_vec(), n.to_be_bytes().to_vec()))
        .collect();
    let (latest, _) = read_until(&output, Duration::from_secs(120), |l| *l == expected);
    if running.is_finished() {
        panic!(
            "the runtime must survive the outage; it stopped with {:?}",
            running.shutdown()
        );
    }
    running.shutdown().expect("clean shutdown");
    let got: HashMap<String, i64> = latest
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), long(v)))
        .collect();
    assert_eq!(got, truth);
}
