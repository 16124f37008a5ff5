//! End-to-end wordcount throughput against a real broker, with P = 1, 2, 4, 8 on 1 and on 4 input
//! partitions, and a bare rdkafka consume loop over the same topic as the ceiling.
//!
//! ```sh
//! scripts/kafka start
//! RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo bench --bench kafka_wordcount
//! ```
//! Each run reads the whole input topic (`RILL_BENCH_LINES` lines of 5 words) from the start with a fresh
//! application id and stops when every word count is final; the figure is input records per
//! second over that time, group join included.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::Message;
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, Runtime};

use common::{bootstrap, cpu_seconds, input_producer, send, stamp};

mod common;

/// Lines per input topic (`RILL_BENCH_LINES` overrides).
fn lines() -> usize {
    std::env::var("RILL_BENCH_LINES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000)
}
const WORDS: [&str; 16] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi",
];

fn topology(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, StringSerde)
        .flat_map_values(|line: String| line.split(' ').map(str::to_string).collect::<Vec<_>>())
        .group_by(
            |_k, w: &String| w.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("counts")
        .to_stream()
        .to(output);
    builder.build().expect("topology")
}

/// Fills `topic` with lines() lines and returns the ground-truth counts.
fn fill(topic: &str) -> HashMap<String, i64> {
    let p = input_producer(&bootstrap(), 20).expect("producer");
    let mut truth = HashMap::new();
    for i in 0..lines() {
        let line: Vec<&str> = (0..5)
            .map(|j| WORDS[(i * 7 + j * 5 + i / 3) % WORDS.len()])
            .collect();
        for w in &line {
            *truth.entry(w.to_string()).or_insert(0) += 1;
        }
        let text = line.join(" ");
        send(&p, topic, None, text.as_bytes()).expect("send");
    }
    p.flush(Duration::from_secs(60)).expect("flush");
    truth
}

fn ceiling(topic: &str) -> f64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("ceiling-{}", stamp()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let start = Instant::now();
    let mut n = 0;
    while n < lines() {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            std::hint::black_box(m.payload());
            n += 1;
        }
    }
    lines() as f64 / start.elapsed().as_secs_f64()
}

/// Lines per second and CPU seconds per million lines of one rill run.
fn rill_run(input: &str, p: usize, truth: &HashMap<String, i64>) -> (f64, f64) {
    let output = format!("{input}-out-{}", stamp());
    create_topics(
        &client_config(&bootstrap(), &BTreeMap::new()),
        &[(output.clone(), 4)],
        Duration::from_secs(30),
    )
    .expect("output topic");
    let state = tempfile::tempdir().expect("tempdir");
    let config = ConfigBuilder::new()
        .set("application.id", format!("bench-{}", stamp()))
        .set("bootstrap.servers", bootstrap())
        .set("parallelising.factor", p)
        .set("state.dir", state.path().display())
        .set("metrics.addr", "off")
        .set(
            "mailbox.capacity",
            std::env::var("RILL_BENCH_MAILBOX").unwrap_or_else(|_| "10000".into()),
        )
        .with_env()
        .build()
        .expect("config");
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("reader-{}", stamp()))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("reader");
    reader.subscribe(&[output.as_str()]).expect("subscribe");
    let runtime = Runtime::new(topology(input, &output), config).expect("runtime");
    let cpu = cpu_seconds();
    let start = Instant::now();
    let running = runtime.start().expect("start");
    let mut latest: HashMap<String, i64> = HashMap::new();
    while latest != *truth && start.elapsed() < Duration::from_secs(600) {
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(50)) {
            if let (Some(k), Some(v)) = (m.key(), m.payload()) {
                let k = String::from_utf8_lossy(k).into_owned();
                latest.insert(k, I64Serde.deserialize(v).expect("long"));
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    running.shutdown().expect("shutdown");
    assert_eq!(latest, *truth, "counts must be exact");
    (lines() as f64 / secs, cpu / lines() as f64 * 1e6)
}

fn main() {
    rill::runtime::service::init_logging();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let parts: Vec<u32> = std::env::var("RILL_BENCH_PARTITIONS")
        .ok()
        .map_or(vec![1, 4], |s| {
            s.split(',').filter_map(|x| x.parse().ok()).collect()
        });
    let factors: Vec<usize> = std::env::var("RILL_BENCH_FACTORS")
        .ok()
        .map_or(vec![1, 2, 4, 8], |s| {
            s.split(',').filter_map(|x| x.parse().ok()).collect()
        });
    for partitions in parts {
        let input = format!("bench-lines-{partitions}p-{}", stamp());
        create_topics(
            &client_config(&bootstrap(), &BTreeMap::new()),
            &[(input.clone(), partitions)],
            Duration::from_secs(30),
        )
        .expect("input topic");
        let truth = fill(&input);
        println!("{partitions} partition(s), {} lines of 5 words:", lines());
        println!(
            "  bare rdkafka consume loop: {:>10.0} lines/s",
            ceiling(&input)
        );
        for &p in &factors {
            let (rate, cpu) = rill_run(&input, p, &truth);
            println!(
                "  rill wordcount P = {p}:      {rate:>10.0} lines/s  {cpu:>6.1} CPU-s per million lines"
            );
        }
    }
}
