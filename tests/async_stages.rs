//! Async stages under the TestDriver: each piped record's calls are awaited before
//! `pipe_input` returns, so a test of an async topology reads its outputs as it would a
//! blocking one's; failed calls go to the processing handler.

use rill::prelude::*;

/// `in` -> an async "lookup" (fails for negative values, panics on 13) -> sum by key -> `out`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .map_values_async(|v: i64| async move {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            if v < 0 {
                return Err(ProcessError::User(format!("negative value {v}").into()));
            }
            assert!(v != 13, "thirteen is unlucky");
            Ok(v * 10)
        })
        .group_by_key_with(Grouped::with(StringSerde, I64Serde))
        .reduce("sums", |a, b| a + b)
        .to_stream()
        .to_with("out", Produced::with(StringSerde, I64Serde));
    builder.build().unwrap()
}

#[test]
fn outputs_and_state_are_there_when_pipe_input_returns() {
    let driver = TestDriver::builder(topology())
        .parallelising_factor(3)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let output = driver.output_topic("out", StringSerde, I64Serde);
    input.pipe_input("a".into(), 1);
    input.pipe_input("b".into(), 2);
    input.pipe_input("a".into(), 3);
    let got = output.read_key_values();
    let want: Vec<(String, i64)> = vec![("a".into(), 10), ("b".into(), 20), ("a".into(), 40)];
    assert_eq!(got, want);
    let sums = driver.key_value_store("sums", StringSerde, I64Serde);
    assert_eq!(sums.get(&"a".to_string()), Some(40));
}

#[test]
fn a_failed_or_panicking_call_goes_to_the_processing_handler() {
    let driver = TestDriver::builder(topology())
        .processing_handler(RecordErrorHandler::LogAndContinue)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let output = driver.output_topic("out", StringSerde, I64Serde);
    for v in [1, -5, 13, 2] {
        input.pipe_input("k".into(), v);
    }
    let values = output.read_values();
    assert_eq!(
        values,
        [10, 30],
        "the failing and the panicking record are skipped"
    );
    assert_eq!(driver.with_stats(|s| s.discarded("processing_error")), 2);
}

#[test]
fn a_failed_call_stops_the_driver_by_default() {
    let driver = TestDriver::new(topology()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let err = input
        .try_pipe_input("k".into(), -1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("negative value -1"), "{err}");
}
