//! Helpers for tests against the real Kafka broker that `scripts/test` starts.
#![allow(dead_code)]

pub mod broker;
pub mod eos;
pub mod http;
pub mod producer;
pub mod proxy;
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

/// A Kafka cluster the tests talk to: its bootstrap address and the librdkafka settings a client
/// needs there (security, for a secure broker).
#[derive(Clone, Debug)]
pub struct Cluster {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Further librdkafka settings of every client (empty for a plaintext broker).
    pub kafka: BTreeMap<String, String>,
}

impl Cluster {
    /// The broker `scripts/test` started ([`bootstrap`]).
    pub fn test() -> Self {
        Cluster {
            bootstrap: bootstrap(),
            kafka: BTreeMap::new(),
        }
    }

    /// A client config for this cluster.
    pub fn client(&self) -> ClientConfig {
        client_config(&self.bootstrap, &self.kafka)
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        create_topics(
            &self.client(),
            &[(topic.to_string(), partitions)],
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("creating {topic}: {e}"));
    }

    /// The input producer ([`producer::input_producer`]) for this cluster.
    pub fn producer(&self) -> producer::InputProducer {
        let mut cfg = producer::input_producer_config(&self.bootstrap, 5);
        for (k, v) in &self.kafka {
            cfg.set(k, v);
        }
        cfg.create().expect("producer")
    }

    /// Produces (key, value) pairs to `topic` and waits until they are written.
    pub fn produce(&self, topic: &str, records: &[Input]) {
        let p = self.producer();
        for (k, v) in records {
            producer::send(&p, topic, k.as_deref(), v).expect("send");
        }
        producer::flush(&p).expect("flush");
    }

    /// A consumer of `topic` from its start, in a group of its own.
    pub fn reader(&self, topic: &str) -> BaseConsumer {
        let consumer: BaseConsumer = self
            .client()
            .set("group.id", unique("reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        consumer
    }

    /// Reads `topic` from the start until `done(latest value per key)` holds or `timeout`
    /// passes; returns the latest value per key and every record read.
    pub fn read_until(
        &self,
        topic: &str,
        timeout: Duration,
        mut done: impl FnMut(&Latest) -> bool,
    ) -> (Latest, Read) {
        let consumer = self.reader(topic);
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
}

/// Creates `topic` with `partitions` partitions on the test broker.
pub fn create_topic(topic: &str, partitions: u32) {
    Cluster::test().create_topic(topic, partitions)
}

/// A record to produce: optional key bytes and value bytes.
pub type Input = (Option<Vec<u8>>, Vec<u8>);
/// Latest value per key.
pub type Latest = HashMap<Vec<u8>, Vec<u8>>;
/// Every (key, value) read, in order.
pub type Read = Vec<(Vec<u8>, Vec<u8>)>;

/// Produces (key, value) pairs to `topic` on the test broker and waits until they are written.
pub fn produce(topic: &str, records: &[Input]) {
    Cluster::test().produce(topic, records)
}

/// Reads `topic` of the test broker from the start until `done(latest value per key)` holds or
/// `timeout` passes; returns the latest value per key and every record read.
pub fn read_until(
    topic: &str,
    timeout: Duration,
    done: impl FnMut(&Latest) -> bool,
) -> (Latest, Read) {
    Cluster::test().read_until(topic, timeout, done)
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

/// Runs Kafka's `StreamsGroupCommand` (what `kafka-streams-groups.sh` runs) against the test
/// broker with `args`; its stdout and stderr.
pub fn streams_groups(args: &[&str]) -> String {
    let home = std::env::var("HOME").expect("HOME");
    let dir = format!("{home}/.cache/rill/kafka-4.4.0");
    let classpath = std::fs::read_to_string(format!("{dir}/classpath"))
        .expect("the broker's classpath (scripts/kafka start writes it)");
    let out = std::process::Command::new("java")
        .arg("-cp")
        .arg(classpath.trim())
        .arg(format!(
            "-Dlog4j2.configurationFile={dir}/tools-log4j2.properties"
        ))
        .arg("org.apache.kafka.tools.streams.StreamsGroupCommand")
        .args(["--bootstrap-server", &bootstrap()])
        .args(args)
        .output()
        .expect("java");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The active tasks `kafka-streams-groups --describe --members` shows for `member` of
/// `group`, as (sub-topology, partition); empty when the member is not listed.
pub fn described_active_tasks(
    group: &str,
    member: &str,
) -> std::collections::BTreeSet<(String, u32)> {
    let text = streams_groups(&["--describe", "--members", "--group", group]);
    let mut out = std::collections::BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == member))
    {
        let Some((_, active)) = line.split_once("ACTIVE:") else {
            continue;
        };
        // "0:[0,1]; 1:[2]" up to the next kind of task.
        let active = active.split(['S', 'W']).next().unwrap_or("");
        for task in active.split(';') {
            let Some((sub, parts)) = task.trim().split_once(':') else {
                continue;
            };
            let parts = parts.trim().trim_start_matches('[').trim_end_matches(']');
            out.extend(
                parts
                    .split(',')
                    .filter_map(|p| p.trim().parse().ok())
                    .map(|p| (sub.trim().to_string(), p)),
            );
        }
    }
    out
}
