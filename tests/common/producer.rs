//! The one producer that tests, examples and benchmarks use to write input to Kafka.
//!
//! Tests include it as `common::producer`; examples and benches include this same file with
//! `#[path = "../../tests/common/producer.rs"]` from their own `common` module, so the settings
//! and the send loop exist once. (It is not library API: writing input is the application's
//! business.)

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

/// A producer of input records.
pub type InputProducer = ThreadedProducer<DefaultProducerContext>;

/// How long [`flush`] waits for the broker to acknowledge everything sent.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// An idempotent producer to `bootstrap` (no duplicates from retries, which would change exact
/// counts) that batches for `linger_ms` with lz4 and queues up to a million records.
pub fn input_producer(bootstrap: &str, linger_ms: u32) -> Result<InputProducer, KafkaError> {
    input_producer_config(bootstrap, linger_ms).create()
}

/// The settings of [`input_producer`], for a caller that adds its own (security) before
/// `create()`.
pub fn input_producer_config(bootstrap: &str, linger_ms: u32) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms.to_string())
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        // As the runtime's clients: bootstrap again soon after a broker list went empty.
        .set(
            "metadata.recovery.rebootstrap.trigger.ms",
            rill::runtime::kafka::admin::REBOOTSTRAP_TRIGGER_MS.to_string(),
        )
        // Latency scenarios send one record at a time: do not wait for more to fill a packet.
        .set("socket.nagle.disable", "true");
    cfg
}

/// Sends (key, value) to `topic`, waiting while librdkafka's queue is full.
pub fn send(
    producer: &InputProducer,
    topic: &str,
    key: Option<&[u8]>,
    value: &[u8],
) -> Result<(), KafkaError> {
    let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(value);
    if let Some(k) = key {
        record = record.key(k);
    }
    send_record(producer, record)
}

/// Sends `record` (any partition, timestamp or headers set on it), waiting while librdkafka's
/// queue is full.
pub fn send_record(
    producer: &InputProducer,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Waits until everything sent is acknowledged.
pub fn flush(producer: &InputProducer) -> Result<(), KafkaError> {
    producer.flush(FLUSH_TIMEOUT)
}
