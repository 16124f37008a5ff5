//! An output record that does not serialize at a sink goes through `production.exception.handler`
//! (Kafka Streams' `handleSerializationException`): `fail` (default) stops naming the topic;
//! `log_and_continue` drops that one output, counts it, and the record's other outputs are
//! written. A repartition topic's record is never dropped (it carries state).

use rill::prelude::*;
use rill::runtime::config::ProductionHandler;
use rill::topology::serdes::SerdeError;

/// Big-endian i64 that refuses to serialize odd values.
#[derive(Clone, Copy)]
struct EvenOnly;

impl Serde<i64> for EvenOnly {
    fn serialize(&self, v: &i64) -> Result<Vec<u8>, SerdeError> {
        if v % 2 != 0 {
            return Err(SerdeError::new("even-only", format!("{v} is odd")));
        }
        I64Serde.serialize(v)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<i64, SerdeError> {
        I64Serde.deserialize(bytes)
    }
}

/// `in` -> `even` (through [`EvenOnly`]) and `all` (every value).
fn two_sinks() -> Topology {
    let builder = StreamsBuilder::new();
    let stream = builder.stream("in", StringSerde, I64Serde);
    stream.to_with("even", Produced::with(StringSerde, EvenOnly));
    stream.to_with("all", Produced::with(StringSerde, I64Serde));
    builder.build().unwrap()
}

fn driver(topology: Topology, handler: ProductionHandler) -> TestDriver {
    TestDriver::builder(topology)
        .parallelising_factor(2)
        .production_handler(handler)
        .build()
        .unwrap()
}

#[test]
fn an_unserializable_output_stops_by_default_naming_the_topic() {
    let driver = driver(two_sinks(), ProductionHandler::Fail);
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input("a".into(), 2);
    let msg = input.try_pipe_input("b".into(), 3).unwrap_err().to_string();
    assert!(msg.contains("in-0 offset 1"), "{msg}");
    assert!(msg.contains("sink to even could not serialize"), "{msg}");
    assert!(msg.contains("3 is odd"), "{msg}");
}

#[test]
fn log_and_continue_drops_only_that_output_and_counts_it() {
    let driver = driver(two_sinks(), ProductionHandler::LogAndContinue);
    let input = driver.input_topic("in", StringSerde, I64Serde);
    for (i, v) in (1..=6).enumerate() {
        input.pipe_input(format!("k{i}"), v);
    }
    let even = driver.output_topic("even", StringSerde, I64Serde);
    let all = driver.output_topic("all", StringSerde, I64Serde);
    let mut got_even = even.read_values();
    let mut got_all = all.read_values();
    got_even.sort();
    got_all.sort();
    assert_eq!(got_even, vec![2, 4, 6]);
    assert_eq!(got_all, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(driver.with_stats(|s| s.discarded("serialization_error")), 3);
}

#[test]
fn a_repartition_record_that_does_not_serialize_still_stops() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .repartition(Repartitioned::with(StringSerde, EvenOnly).with_name("by-key"))
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = driver(builder.build().unwrap(), ProductionHandler::LogAndContinue);
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let msg = input.try_pipe_input("a".into(), 1).unwrap_err().to_string();
    assert!(msg.contains("could not serialize"), "{msg}");
    assert_eq!(driver.with_stats(|s| s.discarded("serialization_error")), 0);
}
