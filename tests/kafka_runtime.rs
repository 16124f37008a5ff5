//! The Kafka runtime against a real broker: wordcount end to end at P = 1 and P = 4, and bad
//! input under each deserialization handler.
//!
//! `#[ignore]`d for a plain `cargo test`; `scripts/test` starts a broker and runs them with
//! `RILL_TEST_BOOTSTRAP` set. Without it they fail, never skip.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{
    bootstrap, create_topic, first_header_names, long, produce, read_until, unique, wordcount,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime, RuntimeError};

fn config(app: &str, p: usize, state: &std::path::Path) -> ConfigBuilder {
    ConfigBuilder::new()
        .set("application.id", app)
        .set("bootstrap.servers", bootstrap())
        .set("parallelising.factor", p)
        .set("state.dir", state.display())
        .set("metrics.addr", "off")
        .set("commit.interval.ms", 100)
}

fn wordcount_end_to_end(p: usize) {
    let (input, output, app) = (unique("lines"), unique("counts"), unique("wc"));
    create_topic(&input, 3);
    create_topic(&output, 3);
    let words = ["apple", "banana", "cherry", "date", "elder", "fig", "grape"];
    let mut truth: HashMap<String, i64> = HashMap::new();
    let lines: Vec<common::Input> = (0..600)
        .map(|i| {
            let line: Vec<&str> = (0..(i % 5 + 1))
                .map(|j| words[(i * 7 + j * 3) % words.len()])
                .collect();
            for w in &line {
                *truth.entry(w.to_string()).or_default() += 1;
            }
            (None, line.join(" ").into_bytes())
        })
        .collect();
    produce(&input, &lines);
    let state = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::new(
        wordcount(&input, &output),
        config(&app, p, state.path()).build().expect("config"),
    )
    .expect("runtime");
    let running = runtime.start().expect("start");
    let expected: HashMap<Vec<u8>, Vec<u8>> = truth
        .iter()
        .map(|(w, n)| (w.as_bytes().to_vec(), n.to_be_bytes().to_vec()))
        .collect();
    let (latest, _) = read_until(&output, Duration::from_secs(90), |l| *l == expected);
    running.shutdown().expect("clean shutdown");
    let got: HashMap<String, i64> = latest
        .iter()
        .map(|(k, v)| (String::from_utf8(k.clone()).expect("utf8"), long(v)))
        .collect();
    assert_eq!(
        got, truth,
        "P = {p}: final counts must equal the ground truth"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn wordcount_end_to_end_p1() {
    wordcount_end_to_end(1);
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn wordcount_end_to_end_p4() {
    wordcount_end_to_end(4);
}

fn sum_topology(input: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, I64Serde)
        .group_by_key()
        .reduce(|a, b| a + b, "sums")
        .to_stream()
        .to(output);
    builder.build().expect("topology")
}

fn good(k: &str, v: i64) -> common::Input {
    (Some(k.as_bytes().to_vec()), v.to_be_bytes().to_vec())
}

fn bad(k: &str) -> common::Input {
    (Some(k.as_bytes().to_vec()), b"not a long".to_vec())
}

fn committed(app: &str, topic: &str) -> Option<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", app)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed");
    let offset = got.elements().first().map(|e| e.offset());
    match offset {
        Some(Offset::Offset(o)) => Some(o),
        _ => None,
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn fail_handler_stops_at_the_bad_record_and_commits_nothing_past_it() {
    let (input, output, app) = (unique("fail-in"), unique("fail-out"), unique("fail"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    produce(
        &input,
        &[good("a", 1), good("a", 2), bad("a"), good("a", 4)],
    );
    let state = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::new(
        sum_topology(&input, &output),
        config(&app, 2, state.path()).build().expect("config"),
    )
    .expect("runtime");
    let running = runtime.start().expect("start");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !running.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = running
        .join()
        .expect_err("the fail handler stops processing");
    let msg = err.to_string();
    assert!(matches!(err, RuntimeError::Source(_)), "{msg}");
    assert!(msg.contains(&format!("{input}-0 offset 2")), "{msg}");
    let c = committed(&app, &input);
    assert!(
        c.is_some_and(|o| o <= 2),
        "committed {c:?} must not pass the bad record at offset 2"
    );
    // The failed range commits nothing, so the record cache never sent a = 3 (as a Kafka Streams
    // task closed dirty). A restart that skips the bad record proves that the records before it
    // were neither lost nor applied twice: a ends at 1 + 2 + 4.
    let cfg =
        config(&app, 2, state.path()).set("deserialization.error.handler", "log_and_continue");
    let running = Runtime::new(sum_topology(&input, &output), cfg.build().expect("config"))
        .expect("runtime")
        .start()
        .expect("restart");
    let (latest, all) = read_until(&output, Duration::from_secs(60), |l| {
        l.get(b"a".as_slice()).is_some_and(|v| long(v) == 7)
    });
    running.shutdown().expect("clean shutdown");
    assert_eq!(latest.get(b"a".as_slice()).map(|v| long(v)), Some(7));
    // Outputs are at least once, but every one is a sum of a prefix of the good records.
    for (_, v) in &all {
        assert!(
            [1, 3, 7].contains(&long(v)),
            "a = {} was never a true sum",
            long(v)
        );
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn log_and_continue_skips_the_bad_record_and_counts_it() {
    let (input, output, app) = (unique("lac-in"), unique("lac-out"), unique("lac"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    produce(&input, &[good("a", 1), bad("a"), good("a", 4)]);
    let state = tempfile::tempdir().expect("tempdir");
    let cfg =
        config(&app, 2, state.path()).set("deserialization.error.handler", "log_and_continue");
    let runtime =
        Runtime::new(sum_topology(&input, &output), cfg.build().expect("config")).expect("runtime");
    let running = runtime.start().expect("start");
    let (latest, _) = read_until(&output, Duration::from_secs(60), |l| {
        l.get(b"a".as_slice()).is_some_and(|v| long(v) == 5)
    });
    assert_eq!(running.discarded("deserialization"), 1);
    running.shutdown().expect("clean shutdown");
    assert_eq!(latest.get(b"a".as_slice()).map(|v| long(v)), Some(5));
    assert_eq!(
        committed(&app, &input),
        Some(3),
        "the committed offset passes the skipped record"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn dead_letter_handler_writes_the_raw_record_with_error_headers() {
    let (input, output, dlq, app) = (
        unique("dl-in"),
        unique("dl-out"),
        unique("dlq"),
        unique("dl"),
    );
    create_topic(&input, 1);
    create_topic(&output, 1);
    create_topic(&dlq, 1);
    produce(&input, &[good("a", 1), bad("b"), good("a", 4)]);
    let state = tempfile::tempdir().expect("tempdir");
    let cfg = config(&app, 2, state.path()).set(
        "deserialization.error.handler",
        format!("dead_letter:{dlq}"),
    );
    let runtime =
        Runtime::new(sum_topology(&input, &output), cfg.build().expect("config")).expect("runtime");
    let running = runtime.start().expect("start");
    let (dead, all) = read_until(&dlq, Duration::from_secs(60), |l| !l.is_empty());
    let (latest, _) = read_until(&output, Duration::from_secs(60), |l| {
        l.get(b"a".as_slice()).is_some_and(|v| long(v) == 5)
    });
    running.shutdown().expect("clean shutdown");
    assert_eq!(all.len(), 1);
    assert_eq!(
        dead.get(b"b".as_slice()).map(Vec::as_slice),
        Some(b"not a long".as_slice())
    );
    assert_eq!(latest.get(b"a".as_slice()).map(|v| long(v)), Some(5));
    let headers = first_header_names(&dlq);
    for h in [
        "rill.error",
        "rill.source.topic",
        "rill.source.partition",
        "rill.source.offset",
    ] {
        assert!(
            headers.iter().any(|n| n == h),
            "missing header {h} in {headers:?}"
        );
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_missing_source_topic_is_a_clear_error() {
    let state = tempfile::tempdir().expect("tempdir");
    let missing = unique("missing");
    let runtime = Runtime::new(
        sum_topology(&missing, "out"),
        config(&unique("m"), 1, state.path())
            .build()
            .expect("config"),
    )
    .expect("runtime");
    let err = runtime.start().err().expect("start must fail");
    assert!(
        matches!(&err, RuntimeError::MissingSourceTopic(t) if *t == missing),
        "{err}"
    );
}

/// With more ranges than fit in the broker's 4096-byte metadata limit, the low watermark is still
/// committed, alone, and processing goes on.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn too_many_ranges_for_the_metadata_commit_one_range_at_the_low_watermark() {
    let (input, output, app) = (unique("wide-in"), unique("wide-out"), unique("wide"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    let records: Vec<common::Input> = (0..1000).map(|i| good(&format!("k{i}"), i)).collect();
    produce(&input, &records);
    let builder = StreamsBuilder::new();
    builder
        .stream(&input, StringSerde, I64Serde)
        .map_values(|v: i64| v * 2)
        .to_with(&output, Produced::with(StringSerde, I64Serde));
    let state = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::new(
        builder.build().expect("topology"),
        config(&app, 400, state.path()).build().expect("config"),
    )
    .expect("runtime");
    let running = runtime.start().expect("start");
    let (latest, _) = read_until(&output, Duration::from_secs(60), |l| l.len() == 1000);
    running.shutdown().expect("clean shutdown");
    assert_eq!(latest.len(), 1000);
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &app)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&input, 0);
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed");
    let e = &got.elements()[0];
    assert_eq!(e.offset(), Offset::Offset(1000));
    let ranges = rill::runtime::kafka::metadata::decode(e.metadata(), 1000).map(|m| m.ranges);
    assert_eq!(
        ranges,
        Ok(vec![(rill::topology::KeyRange::FULL, 1000)]),
        "400 ranges do not fit in 4096 bytes: one range at the low watermark instead"
    );
}
