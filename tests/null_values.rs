//! Null values (tombstones) in streams (issue 46, item 4). Kafka Streams passes a null value to
//! its processors; in rill a stream's value type has no null unless the stream is read with
//! `Nullable(serde)`:
//! - read with a plain serde, a record with a null value is a deserialization error: the
//!   application stops under `fail` (the default), and `log_and_continue` skips and counts it;
//! - read with `Nullable(serde)`, the value is an `Option` and a null is `None`, through the DSL
//!   and the Processor API; written with `Nullable`, `None` is a tombstone again.

use rill::prelude::*;
use rill::topology::{Headers, RawRecord};

fn raw(key: &str, value: Option<&str>) -> RawRecord {
    RawRecord {
        key: Some(key.as_bytes().to_vec()),
        value: value.map(|v| v.as_bytes().to_vec()),
        timestamp: 0,
        headers: Headers::default(),
    }
}

fn upper(b: &StreamsBuilder) {
    b.stream("in", StringSerde, StringSerde)
        .map_values(|v: String| v.to_uppercase())
        .to_with("out", Produced::with(StringSerde, StringSerde));
}

#[test]
fn a_null_value_in_a_plain_stream_stops_by_default_and_is_skipped_when_asked() {
    let b = StreamsBuilder::new();
    upper(&b);
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let err = driver.pipe_raw("in", None, raw("k", None)).unwrap_err();
    assert!(err.to_string().contains("null value"), "{err}");
    assert!(
        err.to_string().contains("Nullable"),
        "names the way out: {err}"
    );

    let b = StreamsBuilder::new();
    upper(&b);
    let driver = TestDriver::builder(b.build().unwrap())
        .deserialization_handler(RecordErrorHandler::LogAndContinue)
        .build()
        .unwrap();
    driver.pipe_raw("in", None, raw("k", Some("a"))).unwrap();
    driver.pipe_raw("in", None, raw("k", None)).unwrap();
    driver.pipe_raw("in", None, raw("k", Some("b"))).unwrap();
    let out = driver.output_topic("out", StringSerde, StringSerde);
    assert_eq!(out.read_values(), ["A", "B"]);
}

#[test]
fn a_nullable_stream_sees_none_and_writes_tombstones() {
    let b = StreamsBuilder::new();
    let s = b.stream("in", StringSerde, Nullable(StringSerde));
    s.map_values(|v: Option<String>| v.map_or("deleted".to_string(), |s| s.to_uppercase()))
        .to_with("described", Produced::with(StringSerde, StringSerde));
    s.to_with("copied", Produced::with(StringSerde, Nullable(StringSerde)));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    driver.pipe_raw("in", None, raw("k", Some("a"))).unwrap();
    driver.pipe_raw("in", None, raw("k", None)).unwrap();
    let described = driver.output_topic("described", StringSerde, StringSerde);
    assert_eq!(described.read_values(), ["A", "deleted"]);
    let copied = driver.output_topic("copied", StringSerde, StringSerde);
    let values: Vec<Option<Vec<u8>>> = std::iter::from_fn(|| copied.read_raw_record())
        .map(|r| r.value)
        .collect();
    assert_eq!(
        values,
        [Some(b"a".to_vec()), None],
        "None is a tombstone again"
    );
}

/// Counts the nulls per key, the Processor-API way.
struct CountNulls;

impl Processor<String, Option<String>, String, String> for CountNulls {
    fn process(
        &mut self,
        record: Record<String, Option<String>>,
        ctx: &mut ProcessorContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        let what = match &record.value {
            Some(v) => format!("value {v}"),
            None => "null".to_string(),
        };
        ctx.forward(Record {
            key: record.key,
            value: what,
            timestamp: record.timestamp,
            headers: record.headers,
        });
        Ok(())
    }
}

#[test]
fn a_processor_sees_a_null_value_as_none() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, Nullable(StringSerde))
        .process("nulls", || CountNulls, &[])
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    driver.pipe_raw("in", None, raw("k", None)).unwrap();
    driver.pipe_raw("in", None, raw("k", Some("x"))).unwrap();
    let out = driver.output_topic("out", StringSerde, StringSerde);
    assert_eq!(out.read_values(), ["null", "value x"]);
}
