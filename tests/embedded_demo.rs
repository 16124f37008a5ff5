//! A demo on the embedded cluster, run twice: its own test binary, because the metrics
//! recorder is process-wide and `tests/service.rs` checks gauges.

mod common;

use std::time::{Duration, Instant};

use common::{producer, wordcount};
use rill::runtime::{ConfigBuilder, Runtime};

fn produce_lines(bootstrap: &str, topic: &str, n: usize) {
    let p = producer::input_producer(bootstrap, 5).expect("producer");
    for i in 0..n {
        let line = format!("alpha beta gamma{} delta", i % 7);
        producer::send(&p, topic, None, line.as_bytes()).expect("send");
    }
    producer::flush(&p).expect("flush");
}

/// Issue 10, item 9: a second demo run on a new embedded cluster with the default state dir
/// counts its input (it used to skip everything: the old run's offsets looked applied).
#[test]
fn a_second_demo_run_on_a_new_embedded_cluster_counts_its_input() {
    let app = format!("svc-rerun-{}", std::process::id());
    let (input, output) = ("rerun-lines", "rerun-counts");
    for run in 0..2 {
        let config = ConfigBuilder::new()
            .set("application.id", &app)
            .set("metrics.addr", "off")
            .set("commit.interval.ms", 100)
            .build()
            .expect("config");
        let runtime = Runtime::new(wordcount(input, output), config).expect("runtime");
        let cluster = runtime.embedded().expect("embedded cluster");
        cluster.create_topic(input, 1).expect("input topic");
        cluster.create_topic(output, 1).expect("output topic");
        produce_lines(runtime.bootstrap_servers(), input, 50);
        let running = runtime.start().expect("start");
        // 50 lines, and 4 words each through the repartition topic.
        let deadline = Instant::now() + Duration::from_secs(60);
        while running.processed() < 250 {
            assert!(
                Instant::now() < deadline,
                "run {run}: only {} records processed",
                running.processed()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        running.shutdown().expect("clean shutdown");
    }
}
