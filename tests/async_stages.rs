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
        .reduce(|a, b| a + b, "sums")
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

/// `clicks` (value: the call's delay in ms) -> an async call -> count per key in 10 ms tumbling
/// windows with `grace_ms` -> emit-final -> `counts` as `key@start` = count; with `sync`, a
/// plain `map_values` in place of the call (the oracle: records in input order).
fn windowed_after_call(sync: bool, grace_ms: u64) -> Topology {
    let builder = StreamsBuilder::new();
    let clicks = builder.stream("clicks", StringSerde, I64Serde);
    let enriched = if sync {
        clicks.map_values(|_delay: i64| 1i64)
    } else {
        clicks.map_values_async(|delay: i64| async move {
            tokio::time::sleep(std::time::Duration::from_millis(delay.unsigned_abs())).await;
            Ok(1i64)
        })
    };
    enriched
        .group_by_key_with(Grouped::with(StringSerde, I64Serde))
        .windowed_by(TimeWindows::of_size_and_grace(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_millis(grace_ms),
        ))
        .count("clicks-per-window")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
        })
        .to_with("counts", Produced::with(StringSerde, I64Serde));
    builder.build().unwrap()
}

/// The sorted `key@start = count` outputs and the late drops of `records` (key, delay, time)
/// piped as one backlog (or one by one when `sync`), then `closing` one by one.
fn windows_of(
    sync: bool,
    grace_ms: u64,
    factor: usize,
    records: &[(String, i64, i64)],
    closing: &[(String, i64, i64)],
) -> (Vec<(String, i64)>, u64) {
    let driver = TestDriver::builder(windowed_after_call(sync, grace_ms))
        .parallelising_factor(factor)
        .build()
        .unwrap();
    let clicks = driver.input_topic("clicks", StringSerde, I64Serde);
    if sync {
        for (k, d, ts) in records {
            clicks.pipe_input_at(k.clone(), *d, *ts);
        }
    } else {
        clicks.pipe_backlog_at(records.iter().cloned());
    }
    for (k, d, ts) in closing {
        clicks.pipe_input_at(k.clone(), *d, *ts);
    }
    let mut got = driver
        .output_topic("counts", StringSerde, I64Serde)
        .read_key_values();
    got.sort();
    (got, driver.with_stats(|s| s.late_dropped()))
}

/// Issue 42, item 1: a fast key's later record completes first; the slow key's earlier record,
/// on time in input order, must still count (it was dropped as late: stream time had passed
/// its window by the time its call answered).
#[test]
fn a_backlog_before_an_async_stage_and_a_window_drops_no_on_time_record() {
    let backlog = [
        ("slow".to_string(), 40, 1),
        ("fast".to_string(), 0, 2),
        ("fast".to_string(), 0, 25),
    ];
    let closing = [("fast".to_string(), 0, 50)];
    let (got, late) = windows_of(false, 0, 1, &backlog, &closing);
    assert_eq!(late, 0, "no record was late in input order");
    let want: Vec<(String, i64)> = vec![
        ("fast@0".into(), 1),
        ("fast@20".into(), 1),
        ("slow@0".into(), 1),
    ];
    assert_eq!(got, want);
}

/// A record late in input order is still dropped once every record before it has settled.
#[test]
fn a_record_late_in_input_order_after_settled_records_is_dropped() {
    let backlog = [("a".to_string(), 0, 30), ("a".to_string(), 0, 1)];
    let (got, late) = windows_of(false, 0, 1, &backlog, &[("a".to_string(), 0, 60)]);
    assert_eq!(late, 1);
    assert_eq!(got, vec![("a@30".to_string(), 1)]);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24)
    ))]

    /// Random keys with random call delays, timestamps out of order within grace, as one
    /// backlog: the emit-final windows behind the async stage equal those of the same records
    /// in input order without it, at P = 1 and P = 3, and nothing is dropped as late.
    #[test]
    fn windows_behind_an_async_stage_match_input_order(
        steps in proptest::collection::vec((0usize..5, 0i64..4, 0i64..6, 0i64..6), 1..40),
        factor in proptest::sample::select(vec![1usize, 3]),
    ) {
        const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];
        const GRACE: i64 = 5;
        let mut max = 0i64;
        let mut records = Vec::new();
        for (k, delay, step, back) in steps {
            // Never below the largest time so far minus grace: on time in input order.
            let ts = (max + step - back).max(max - GRACE).max(0);
            max = max.max(ts);
            records.push((KEYS[k].to_string(), delay, ts));
        }
        // A far-future record of every key closes the windows of every range.
        let closing: Vec<(String, i64, i64)> =
            KEYS.iter().map(|k| (k.to_string(), 0, max + 1000)).collect();
        let (want, want_late) = windows_of(true, GRACE as u64, 1, &records, &closing);
        proptest::prop_assert_eq!(want_late, 0);
        let (got, late) = windows_of(false, GRACE as u64, factor, &records, &closing);
        proptest::prop_assert_eq!(late, 0);
        proptest::prop_assert_eq!(got, want);
    }
}
