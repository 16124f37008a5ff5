//! An output record larger than `message.max.bytes`: with the default
//! `production.exception.handler=fail` the runtime stops with an error naming the topic and the
//! way out; with `log_and_continue` that record is dropped and every other one is written.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{bootstrap, create_topic, produce, read_until, unique};
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, RunningRuntime, Runtime};

/// Bytes of the oversized value: above librdkafka's default `message.max.bytes` (1 000 000).
const OVERSIZED: usize = 2_000_000;

/// Copies `input` to `output`, turning the value `big` into an oversized one.
fn topology(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, StringSerde)
        .map_values(|v: String| if v == "big" { "x".repeat(OVERSIZED) } else { v })
        .to_with(output, Produced::with(StringSerde, StringSerde));
    builder.build().expect("topology")
}

fn start(input: &str, output: &str, handler: Option<&str>) -> RunningRuntime {
    let mut config = ConfigBuilder::new()
        .set("application.id", unique("poison"))
        .set("bootstrap.servers", bootstrap())
        .set("metrics.addr", "off");
    if let Some(h) = handler {
        config = config.set("production.exception.handler", h);
    }
    let config = config.build().expect("config");
    Runtime::new(topology(input, output), config)
        .expect("runtime")
        .start()
        .expect("start")
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn an_oversized_output_record_fails_by_default_and_is_dropped_with_log_and_continue() {
    let input = unique("poison-in");
    create_topic(&input, 1);
    let records: Vec<common::Input> = (0..10)
        .map(|i| {
            let v = if i == 4 {
                "big".to_string()
            } else {
                format!("v{i}")
            };
            (Some(format!("k{i}").into_bytes()), v.into_bytes())
        })
        .collect();
    produce(&input, &records);
    let expected: HashMap<Vec<u8>, Vec<u8>> = records
        .iter()
        .filter(|(_, v)| v != b"big")
        .map(|(k, v)| (k.clone().expect("key"), v.clone()))
        .collect();

    let output = unique("poison-out-continue");
    create_topic(&output, 1);
    let running = start(&input, &output, Some("log_and_continue"));
    let (latest, all) = read_until(&output, Duration::from_secs(60), |l| *l == expected);
    assert!(
        !running.is_finished(),
        "log_and_continue keeps the runtime running"
    );
    running.shutdown().expect("clean shutdown");
    assert_eq!(latest, expected, "every record but the oversized one");
    assert_eq!(all.len(), 9, "nothing else was written: {all:?}");

    let output = unique("poison-out-fail");
    create_topic(&output, 1);
    let running = start(&input, &output, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the default handler must stop the runtime on an oversized record"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = running
        .shutdown()
        .expect_err("the runtime stopped on an error")
        .to_string();
    println!("oversized record, default handler: {err}");
    assert!(
        err.contains(&format!("could not write to topic `{output}`"))
            && err.contains("more than kafka.message.max.bytes allows")
            && err.contains("production.exception.handler=log_and_continue"),
        "{err}"
    );
}
