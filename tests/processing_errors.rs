//! `processing.exception.handler` (Kafka Streams' KIP-1033): an error or a panic in user code
//! stops the application by default, naming the record and the node; `log_and_continue` skips
//! the record; `dead_letter:<topic>` also sends the raw input there with error headers.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

/// Passes values through; fails (returns an error) on negative values.
struct RejectNegative;

impl Processor<String, i64, String, i64> for RejectNegative {
    fn process(
        &mut self,
        record: Record<String, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        if record.value < 0 {
            return Err(ProcessError::User(
                format!("negative value {}", record.value).into(),
            ));
        }
        ctx.forward(record);
        Ok(())
    }
}

/// `in` -> reject negatives -> panic on 13 -> sum by key (store `sums`) -> `out`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .process("reject-negative", || RejectNegative, &[])
        .map_values(|v: i64| {
            assert!(v != 13, "thirteen is unlucky");
            v
        })
        .group_by_key_with(Grouped::with(StringSerde, I64Serde))
        .reduce(|a, b| a + b, "sums")
        .to_stream()
        .to_with("out", Produced::with(StringSerde, I64Serde));
    builder.build().unwrap()
}

fn driver(handler: RecordErrorHandler, p: usize) -> TestDriver {
    TestDriver::builder(topology())
        .parallelising_factor(p)
        .processing_handler(handler)
        .build()
        .unwrap()
}

#[test]
fn an_error_stops_by_default_naming_record_node_and_cause() {
    let driver = TestDriver::new(topology()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input("k".into(), 1);
    let msg = input
        .try_pipe_input("k".into(), -5)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("in-0 offset 1"), "{msg}");
    assert!(msg.contains("reject-negative"), "{msg}");
    assert!(msg.contains("negative value -5"), "{msg}");
}

#[test]
fn a_panic_in_a_closure_is_an_error_not_a_crash() {
    let driver = TestDriver::new(topology()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let msg = input
        .try_pipe_input("k".into(), 13)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("map-values"), "{msg}");
    assert!(msg.contains("panicked: thirteen is unlucky"), "{msg}");
}

#[test]
fn log_and_continue_skips_errors_and_panics_and_counts_them() {
    let driver = driver(RecordErrorHandler::LogAndContinue, 1);
    let input = driver.input_topic("in", StringSerde, I64Serde);
    for v in [1, -1, 2, 13, 4] {
        input.pipe_input("k".into(), v);
    }
    let out = driver.output_topic("out", StringSerde, I64Serde);
    assert_eq!(out.read_values(), vec![1, 3, 7]);
    assert_eq!(driver.with_stats(|s| s.discarded("processing_error")), 2);
    assert_eq!(
        driver
            .key_value_store("sums", StringSerde, I64Serde)
            .get(&"k".into()),
        Some(7)
    );
}

#[test]
fn dead_letter_gets_the_raw_input_with_what_failed_where() {
    let driver = driver(RecordErrorHandler::DeadLetter("errors".into()), 2);
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input("a".into(), 5);
    input.pipe_input("b".into(), -7);
    input.pipe_input("a".into(), 13);
    let dlq = driver.output_topic("errors", BytesSerde, BytesSerde);
    let header = |r: &RawRecord, name: &str| {
        String::from_utf8(r.headers.last(name).flatten().unwrap().to_vec()).unwrap()
    };
    let first = dlq
        .read_raw_record()
        .expect("the negative value is dead-lettered");
    assert_eq!(first.key.as_deref(), Some(&b"b"[..]));
    assert_eq!(first.value, Some((-7i64).to_be_bytes().to_vec()));
    assert_eq!(header(&first, "rill.error.node"), "reject-negative");
    assert!(header(&first, "rill.error").contains("negative value -7"));
    assert_eq!(header(&first, "rill.source.topic"), "in");
    assert_eq!(header(&first, "rill.source.offset"), "1");
    let second = dlq.read_raw_record().expect("the panic is dead-lettered");
    assert!(header(&second, "rill.error.node").contains("map-values"));
    assert!(header(&second, "rill.error").contains("thirteen is unlucky"));
    assert!(dlq.read_raw_record().is_none());
    assert_eq!(driver.with_stats(|s| s.discarded("processing_error")), 2);
    assert_eq!(
        driver
            .output_topic("out", StringSerde, I64Serde)
            .read_key_values(),
        vec![("a".to_string(), 5)]
    );
}

#[test]
fn a_store_error_stops_even_under_log_and_continue() {
    struct Sneaky;
    impl Processor<String, i64, String, i64> for Sneaky {
        fn process(
            &mut self,
            _r: Record<String, i64>,
            ctx: &mut ProcessorContext<'_, String, i64>,
        ) -> Result<(), ProcessError> {
            ctx.store("not-connected")?;
            Ok(())
        }
    }
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .process("sneaky", || Sneaky, &[])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::builder(builder.build().unwrap())
        .processing_handler(RecordErrorHandler::LogAndContinue)
        .build()
        .unwrap();
    let err = driver
        .input_topic("in", StringSerde, I64Serde)
        .try_pipe_input("k".into(), 1)
        .unwrap_err();
    assert!(err.to_string().contains("not-connected"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Against an oracle that drops failing records: sums and outputs per key are the same at
    /// any factor, and every failing record is counted once.
    #[test]
    fn skipped_records_leave_exactly_the_others(
        records in proptest::collection::vec((0u8..6, -3i64..20), 1..60),
        p in 1usize..5,
    ) {
        let driver = driver(RecordErrorHandler::LogAndContinue, p);
        let input = driver.input_topic("in", StringSerde, I64Serde);
        let mut sums: BTreeMap<String, i64> = BTreeMap::new();
        let mut outputs: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut failed = 0u64;
        for (k, v) in &records {
            let key = format!("k{k}");
            input.pipe_input(key.clone(), *v);
            if *v < 0 || *v == 13 {
                failed += 1;
            } else {
                let sum = sums.entry(key.clone()).or_default();
                *sum += v;
                outputs.entry(key).or_default().push(*sum);
            }
        }
        let mut got: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (k, v) in driver.output_topic("out", StringSerde, I64Serde).read_key_values() {
            got.entry(k).or_default().push(v);
        }
        prop_assert_eq!(got, outputs);
        prop_assert_eq!(driver.key_value_store("sums", StringSerde, I64Serde).all(), sums);
        prop_assert_eq!(driver.with_stats(|s| s.discarded("processing_error")), failed);
    }
}
