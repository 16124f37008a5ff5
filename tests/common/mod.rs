//! Helpers for tests against the real Kafka broker that `scripts/test` starts.
#![allow(dead_code)]

pub mod producer;
pub mod service;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers as _;
use rdkafka::Message;
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};

/// The broker under test, from `RILL_TEST_BOOTSTRAP`; panics (never skips) when it is not set.
pub fn bootstrap() -> String {
    match std::env::var("RILL_TEST_BOOTSTRAP") {
        Ok(s) if !s.trim().is_empty() => s,
        _ => panic!(
            "RILL_TEST_BOOTSTRAP is not set: this test needs a real Kafka broker. Run it through \
             scripts/test, or `scripts/kafka start` and set RILL_TEST_BOOTSTRAP=127.0.0.1:9092"
        ),
    }
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "rill-test-{prefix}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000
    )
}

/// Creates `topic` with `partitions` partitions on the test broker.
pub fn create_topic(topic: &str, partitions: u32) {
    create_topics(
        &client_config(&bootstrap(), &BTreeMap::new()),
        &[(topic.to_string(), partitions)],
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("creating {topic}: {e}"));
}

/// A record to produce: optional key bytes and value bytes.
pub type Input = (Option<Vec<u8>>, Vec<u8>);
/// Latest value per key.
pub type Latest = HashMap<Vec<u8>, Vec<u8>>;
/// Every (key, value) read, in order.
pub type Read = Vec<(Vec<u8>, Vec<u8>)>;

/// Produces (key, value) pairs to `topic` and waits until they are written.
pub fn produce(topic: &str, records: &[Input]) {
    let p = producer::input_producer(&bootstrap(), 5).expect("producer");
    for (k, v) in records {
        producer::send(&p, topic, k.as_deref(), v).expect("send");
    }
    producer::flush(&p).expect("flush");
}

/// Reads `topic` from the start until `done(latest value per key)` holds or `timeout` passes;
/// returns the latest value per key and every record read.
pub fn read_until(
    topic: &str,
    timeout: Duration,
    mut done: impl FnMut(&Latest) -> bool,
) -> (Latest, Read) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut latest = HashMap::new();
    let mut all = Vec::new();
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && !done(&latest) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let k = m.key().unwrap_or_default().to_vec();
            let v = m.payload().unwrap_or_default().to_vec();
            latest.insert(k.clone(), v.clone());
            all.push((k, v));
        }
    }
    (latest, all)
}

/// Decodes a big-endian i64 (Kafka's LongSerializer layout).
pub fn long(v: &[u8]) -> i64 {
    i64::from_be_bytes(v.try_into().expect("8-byte long"))
}

/// The header names of the first record of `topic`.
pub fn first_header_names(topic: &str) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("headers"))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            return m
                .headers()
                .map(|h| h.iter().map(|h| h.key.to_string()).collect())
                .unwrap_or_default();
        }
    }
    panic!("no record on {topic}");
}

/// Word count as in Kafka Streams' WordCountDemo: lines -> lower-case words -> count per word in
/// `counts-store` -> `output` (word, big-endian i64).
pub fn wordcount(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, StringSerde)
        .flat_map_values(|line: String| {
            line.to_lowercase()
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .group_by(
            |_k, w: &String| w.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("counts-store")
        .to_stream()
        .to(output);
    builder.build().expect("topology")
}
