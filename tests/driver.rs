//! TestDriver scenarios: the DSL, the Processor API, bad input and state across reopen.

use std::time::Duration;

use rill::prelude::*;
use rill::runtime::driver::DriverError;
use rill::topology::processor::RecordMeta;
use rill::topology::RawRecord;

mod common;

fn wordcount() -> Topology {
    common::wordcount("lines", "counts")
}

#[test]
fn wordcount_counts_every_word_through_the_repartition_topic() {
    let driver = TestDriver::builder(wordcount())
        .parallelising_factor(4)
        .partitions("lines", 2)
        .build()
        .unwrap();
    let lines = driver.input_topic("lines", StringSerde, StringSerde);
    lines.pipe_value("Hello rill, hello Kafka".to_string());
    lines.pipe_value("all streams lead to kafka".to_string());
    let counts = driver.key_value_store("counts-store", StringSerde, I64Serde);
    assert_eq!(counts.get(&"hello".to_string()), Some(2));
    assert_eq!(counts.get(&"kafka".to_string()), Some(2));
    assert_eq!(counts.get(&"rill".to_string()), Some(1));
    assert_eq!(counts.all().len(), 7);
    let out = driver
        .output_topic("counts", StringSerde, I64Serde)
        .read_key_values();
    assert_eq!(out.len(), 9, "one update per word occurrence: {out:?}");
    assert_eq!(
        out.iter()
            .filter(|(k, _)| k == "hello")
            .map(|(_, v)| *v)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn state_survives_closing_and_reopening_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=3i64 {
        let driver = TestDriver::builder(wordcount())
            .parallelising_factor(3)
            .state_dir(dir.path())
            .build()
            .unwrap();
        driver
            .input_topic("lines", StringSerde, StringSerde)
            .pipe_value("alpha beta alpha".to_string());
        let counts = driver.key_value_store("counts-store", StringSerde, I64Serde);
        assert_eq!(counts.get(&"alpha".to_string()), Some(2 * round));
        assert_eq!(counts.get(&"beta".to_string()), Some(round));
        driver.close().unwrap();
    }
}

#[test]
fn reopening_with_another_factor_moves_the_state_and_keeps_counting() {
    // Splits (2 -> 4), factors that do not divide each other (4 -> 3) and a merge (3 -> 1).
    let dir = tempfile::tempdir().unwrap();
    for (round, p) in [2, 4, 3, 1].into_iter().enumerate() {
        let driver = TestDriver::builder(wordcount())
            .parallelising_factor(p)
            .state_dir(dir.path())
            .build()
            .unwrap();
        driver
            .input_topic("lines", StringSerde, StringSerde)
            .pipe_value("x y z x".to_string());
        let counts = driver.key_value_store("counts-store", StringSerde, I64Serde);
        let round = round as i64 + 1;
        assert_eq!(counts.get(&"x".to_string()), Some(2 * round), "P = {p}");
        assert_eq!(counts.get(&"y".to_string()), Some(round), "P = {p}");
        assert_eq!(counts.all().len(), 3, "P = {p}");
        driver.close().unwrap();
    }
}

#[test]
fn live_factor_changes_move_state_and_progress_without_replays() {
    // Live, without closing: splits, factors that do not divide each other, a merge, and back.
    let dir = tempfile::tempdir().unwrap();
    let driver = TestDriver::builder(wordcount())
        .parallelising_factor(2)
        .partitions("lines", 2)
        .state_dir(dir.path())
        .build()
        .unwrap();
    let lines = driver.input_topic("lines", StringSerde, StringSerde);
    let counts = driver.key_value_store("counts-store", StringSerde, I64Serde);
    let out = driver.output_topic("counts", StringSerde, I64Serde);
    let words: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let mut updates = 0;
    for (round, p) in [4, 3, 1, 2, 5].into_iter().enumerate() {
        lines.pipe_value(words.join(" "));
        let change = driver.set_parallelising_factor(p).unwrap();
        // Both sub-topologies (the source and the count after the repartition) on 2 partitions.
        assert_eq!(change.changed.len(), 4, "P = {p}: {change:?}");
        assert!(change.changed.iter().all(|c| c.to == p), "{change:?}");
        lines.pipe_value(words.join(" "));
        let round = round as i64 + 1;
        for w in &words {
            assert_eq!(
                counts.get(w),
                Some(2 * round),
                "`{w}` after the change to P = {p}"
            );
        }
        assert_eq!(counts.all().len(), words.len());
        let read = out.read_key_values();
        updates += read.len();
        assert_eq!(
            read.len(),
            2 * words.len(),
            "one update per occurrence at P = {p}"
        );
    }
    assert_eq!(updates, 10 * words.len());
    // The moved state and progress are durable: a reopen at yet another factor goes on from them.
    drop((lines, counts, out));
    driver.close().unwrap();
    let driver = TestDriver::builder(wordcount())
        .parallelising_factor(3)
        .partitions("lines", 2)
        .state_dir(dir.path())
        .build()
        .unwrap();
    driver
        .input_topic("lines", StringSerde, StringSerde)
        .pipe_value(words.join(" "));
    let counts = driver.key_value_store("counts-store", StringSerde, I64Serde);
    for w in &words {
        assert_eq!(counts.get(w), Some(11), "`{w}` after the reopen");
    }
    assert!(
        driver.set_parallelising_factor(0).is_err(),
        "factor 0 is refused"
    );
}

#[test]
fn split_routes_each_record_to_the_first_matching_branch() {
    let builder = StreamsBuilder::new();
    let branches = builder
        .stream("numbers", StringSerde, I64Serde)
        .split()
        .branch("negative", |_k, v: &i64| *v < 0)
        .branch("small", |_k, v: &i64| *v < 10)
        .default_branch("large");
    for (name, stream) in &branches {
        stream.to(&format!("out-{name}"));
    }
    let driver = TestDriver::new(builder.build().unwrap()).unwrap();
    let input = driver.input_topic("numbers", StringSerde, I64Serde);
    for v in [-5, 3, 50, -1, 9, 10] {
        input.pipe_input("k".to_string(), v);
    }
    let read = |t: &str| driver.output_topic(t, StringSerde, I64Serde).read_values();
    assert_eq!(read("out-negative"), vec![-5, -1]);
    assert_eq!(read("out-small"), vec![3, 9]);
    assert_eq!(read("out-large"), vec![50, 10]);
}

/// Two aggregations of one named grouping read one repartition topic; `Materialized` serdes
/// decide how a store keeps its values, and `Produced` serdes how a sink writes them.
#[test]
fn option_objects_name_stores_and_choose_serdes() {
    let builder = StreamsBuilder::new();
    let by_word = builder
        .stream("lines", StringSerde, StringSerde)
        .flat_map_values(|l: String| l.split(' ').map(str::to_string).collect::<Vec<_>>())
        .group_by(
            |_k, w: &String| w.clone(),
            Grouped::with(StringSerde, StringSerde).with_name("by-word"),
        );
    by_word.count("counts").to_stream().to("counts-out");
    by_word
        .reduce(
            |a: String, b: String| if b.len() > a.len() { b } else { a },
            Materialized::named("longest").with_value_serde(JsonSerde::<String>::new()),
        )
        .to_stream()
        .to_with(
            "longest-out",
            Produced::default().with_value_serde(StringSerde),
        );
    let topology = builder.build().unwrap();
    assert_eq!(topology.internal_topics().len(), 1, "{topology:?}");
    let driver = TestDriver::builder(topology)
        .parallelising_factor(4)
        .build()
        .unwrap();
    let input = driver.input_topic("lines", StringSerde, StringSerde);
    input.pipe_value("a bb a".to_string());
    input.pipe_value("bb a".to_string());
    let counts = driver.key_value_store("counts", StringSerde, I64Serde);
    assert_eq!(counts.get(&"a".to_string()), Some(3));
    assert_eq!(counts.get(&"bb".to_string()), Some(2));
    // The store holds JSON (the Materialized serde), the sink plain UTF-8 (the Produced serde).
    let longest = driver.key_value_store("longest", StringSerde, JsonSerde::<String>::new());
    assert_eq!(longest.get(&"bb".to_string()), Some("bb".to_string()));
    let mut out = driver
        .output_topic("longest-out", StringSerde, StringSerde)
        .read_values();
    out.sort();
    assert_eq!(out, vec!["a", "a", "a", "bb", "bb"]);
}

#[test]
fn stateless_operations_compose() {
    let builder = StreamsBuilder::new();
    let s = builder.stream("in", StringSerde, I64Serde);
    let doubled = s
        .filter(|_k, v: &i64| *v % 2 == 0)
        .map_values(|v: i64| v * 10);
    let odd = s.filter_not(|_k, v: &i64| *v % 2 == 0);
    doubled
        .merge(&odd)
        .select_key(|_k, v: &i64| format!("v{v}"))
        .map(|k: Option<String>, v: i64| (k.unwrap_or_default(), v.to_string()))
        .flat_map(|k: Option<String>, v: String| {
            vec![
                (k.clone().unwrap_or_default(), v.clone()),
                (format!("{}!", k.unwrap_or_default()), v),
            ]
        })
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let driver = TestDriver::new(builder.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input("a".into(), 2);
    input.pipe_input("a".into(), 3);
    let out = driver
        .output_topic("out", StringSerde, StringSerde)
        .read_key_values();
    assert_eq!(
        out,
        vec![
            ("v20".to_string(), "20".to_string()),
            ("v20!".to_string(), "20".to_string()),
            ("v3".to_string(), "3".to_string()),
            ("v3!".to_string(), "3".to_string()),
        ]
    );
}

/// Sums values per key in a store, and on punctuation emits every sum.
struct SumAndReport;

impl Processor<String, i64, String, i64> for SumAndReport {
    fn init(&mut self, ctx: &mut ProcessorContext<'_, String, i64>) -> Result<(), ProcessError> {
        ctx.schedule(Duration::from_secs(1), PunctuationType::WallClockTime);
        ctx.schedule(Duration::from_millis(100), PunctuationType::StreamTime);
        Ok(())
    }

    fn process(
        &mut self,
        record: Record<String, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let key = record
            .key
            .clone()
            .ok_or_else(|| ProcessError::User("no key".into()))?;
        let store = ctx.get_state_store::<String, i64>("sums")?;
        let sum = store.get(ctx, &key)?.unwrap_or(0) + record.value;
        store.put(ctx, &key, &sum)?;
        Ok(())
    }

    fn punctuate(
        &mut self,
        kind: PunctuationType,
        timestamp: i64,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let tag = match kind {
            PunctuationType::WallClockTime => "wall",
            PunctuationType::StreamTime => "stream",
        };
        // The iterator owns its entries: the store is not borrowed while forwarding.
        let all = ctx.get_state_store::<String, i64>("sums")?.all(ctx)?;
        for entry in all {
            let (k, v) = entry?;
            ctx.forward(Record::new(format!("{tag}:{k}"), v).with_timestamp(timestamp));
        }
        Ok(())
    }
}

#[test]
fn processor_api_reads_its_store_and_punctuates_on_both_clocks() {
    let builder = StreamsBuilder::new();
    builder.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("sums"),
        StringSerde,
        I64Serde,
    ));
    builder
        .stream("in", StringSerde, I64Serde)
        .process("sum-and-report", || SumAndReport, &["sums"])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::builder(builder.build().unwrap())
        .parallelising_factor(2)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let output = driver.output_topic("out", StringSerde, I64Serde);
    input.pipe_input_at("a".into(), 5, 0);
    input.pipe_input_at("a".into(), 7, 50);
    assert!(
        output.is_empty(),
        "no punctuation is due before stream time 100"
    );
    input.pipe_input_at("a".into(), 1, 150);
    assert_eq!(output.read_key_values(), vec![("stream:a".to_string(), 13)]);
    driver
        .advance_wall_clock_time(Duration::from_millis(999))
        .unwrap();
    assert!(output.is_empty());
    driver
        .advance_wall_clock_time(Duration::from_millis(1001))
        .unwrap();
    assert_eq!(output.read_key_values(), vec![("wall:a".to_string(), 13)]);
}

#[test]
fn a_processor_asking_for_an_unconnected_store_gets_a_clear_error() {
    struct Sneaky;
    impl Processor<String, i64, String, i64> for Sneaky {
        fn process(
            &mut self,
            _r: Record<String, i64>,
            ctx: &mut ProcessorContext<'_, String, i64>,
        ) -> Result<(), ProcessError> {
            ctx.store("elsewhere")?;
            Ok(())
        }
    }
    let builder = StreamsBuilder::new();
    builder.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("mine"),
        StringSerde,
        I64Serde,
    ));
    builder.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("elsewhere"),
        StringSerde,
        I64Serde,
    ));
    let s = builder.stream("in", StringSerde, I64Serde);
    s.process("sneaky", || Sneaky, &["mine"])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    s.process("other", || Sneaky, &["elsewhere"])
        .to_with("out2", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::new(builder.build().unwrap()).unwrap();
    let err = driver
        .input_topic("in", StringSerde, I64Serde)
        .try_pipe_input("k".into(), 1)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("store `elsewhere` is not connected"),
        "{err}"
    );
}

fn bad_record() -> RawRecord {
    RawRecord {
        key: Some(b"k".to_vec()),
        value: Some(vec![1, 2, 3]),
        timestamp: 0,
        headers: Headers::new(),
    }
}

fn long_sum_topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .group_by_key()
        .reduce(|a, b| a + b, "sums")
        .to_stream()
        .to("out");
    builder.build().unwrap()
}

#[test]
fn fail_handler_stops_with_topic_partition_and_offset() {
    let driver = TestDriver::new(long_sum_topology()).unwrap();
    driver
        .input_topic("in", StringSerde, I64Serde)
        .pipe_input("k".into(), 1);
    let err = driver.pipe_raw("in", Some(0), bad_record()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("in-0 offset 1"), "{msg}");
    assert!(msg.contains("expected 8 bytes, got 3"), "{msg}");
    assert!(matches!(err, DriverError::Engine(_)));
}

#[test]
fn log_and_continue_skips_and_counts() {
    let driver = TestDriver::builder(long_sum_topology())
        .deserialization_handler(RecordErrorHandler::LogAndContinue)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input("k".into(), 1);
    driver.pipe_raw("in", None, bad_record()).unwrap();
    input.pipe_input("k".into(), 2);
    assert_eq!(
        driver
            .output_topic("out", StringSerde, I64Serde)
            .read_values(),
        vec![1, 3]
    );
    assert_eq!(driver.with_stats(|s| s.discarded("deserialization")), 1);
}

#[test]
fn dead_letter_handler_forwards_the_raw_record_with_error_headers() {
    let driver = TestDriver::builder(long_sum_topology())
        .deserialization_handler(RecordErrorHandler::DeadLetter("dlq".into()))
        .build()
        .unwrap();
    driver.pipe_raw("in", None, bad_record()).unwrap();
    let dlq = driver.output_topic("dlq", BytesSerde, BytesSerde);
    assert_eq!(dlq.read_key_values(), vec![(b"k".to_vec(), vec![1, 2, 3])]);
    assert_eq!(driver.with_stats(|s| s.discarded("deserialization")), 1);
}

#[test]
fn null_keys_are_dropped_by_aggregations_and_counted() {
    let driver = TestDriver::new(long_sum_topology()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_value(5);
    input.pipe_input("k".into(), 1);
    assert_eq!(
        driver
            .output_topic("out", StringSerde, I64Serde)
            .read_values(),
        vec![1]
    );
    assert_eq!(driver.with_stats(|s| s.discarded("null_key")), 1);
}

#[test]
fn build_rejects_invalid_topologies_naming_the_culprit() {
    let b = StreamsBuilder::new();
    assert_eq!(b.build().unwrap_err(), TopologyError::NoSource);

    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde)
        .process("p", || SumAndReport, &["missing"])
        .to_with("o", Produced::with(StringSerde, I64Serde));
    assert!(
        matches!(b.build().unwrap_err(), TopologyError::UnknownStore { node, store } if node == "p" && store == "missing")
    );

    let b = StreamsBuilder::new();
    let s = b.stream("in", StringSerde, I64Serde);
    s.group_by_key().count("dup");
    s.group_by_key().count("dup");
    assert_eq!(
        b.build().unwrap_err(),
        TopologyError::DuplicateName("dup".into())
    );

    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde);
    b.stream("in", StringSerde, I64Serde);
    assert!(matches!(
        b.build().unwrap_err(),
        TopologyError::DuplicateSourceTopic { .. }
    ));

    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde)
        .map(|_k, v: i64| (v, v))
        .group_by_key()
        .count("c");
    assert!(matches!(
        b.build().unwrap_err(),
        TopologyError::MissingSerde { what: "key", .. }
    ));

    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde)
        .group_by_key()
        .count("bad name!");
    assert_eq!(
        b.build().unwrap_err(),
        TopologyError::InvalidName("bad name!".into())
    );
}

#[test]
fn records_carry_their_source_metadata() {
    struct Meta;
    impl Processor<String, i64, String, String> for Meta {
        fn process(
            &mut self,
            r: Record<String, i64>,
            ctx: &mut ProcessorContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            let RecordMeta {
                topic,
                partition,
                offset,
            } = ctx.record_meta().clone();
            ctx.forward(Record::new(
                r.key.unwrap_or_default(),
                format!("{topic}/{partition}/{offset}"),
            ));
            Ok(())
        }
    }
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde)
        .process("meta", || Meta, &[])
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input("a".into(), 1);
    input.pipe_input("b".into(), 1);
    assert_eq!(
        driver
            .output_topic("out", StringSerde, StringSerde)
            .read_values(),
        vec!["in/0/0", "in/0/1"]
    );
}
