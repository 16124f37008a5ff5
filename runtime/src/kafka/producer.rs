//! The Kafka sink: an idempotent librdkafka producer behind [`RecordSink`].
//!
//! Delivery failures are collected by the producer context and reported by the next `flush`, so a
//! range never commits progress over an output that was not written.

use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rill_topology::RawRecord;

use crate::sink::{RecordSink, SinkError};

/// How long a flush may take before the commit that asked for it fails.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// Collects delivery failures for the next flush.
#[derive(Default)]
pub struct DeliveryContext {
    /// Invariant: every failed delivery is recorded here before `flush` returns.
    failed: Mutex<Option<String>>,
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut f = self.failed.lock();
            if f.is_none() {
                *f = Some(e.to_string());
            }
        }
    }
}

/// The producer that writes sink, repartition and dead-letter records.
pub struct KafkaSink {
    producer: ThreadedProducer<DeliveryContext>,
}

impl KafkaSink {
    /// An idempotent producer for `bootstrap` with extra librdkafka settings.
    pub fn new(bootstrap: &str, extra: &BTreeMap<String, String>) -> Result<Self, KafkaError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            // The Java client's partitioner, so keyed outputs land where Kafka Streams puts them.
            .set("partitioner", "murmur2_random");
        for (k, v) in extra {
            cfg.set(k, v);
        }
        Ok(KafkaSink {
            producer: cfg.create_with_context(DeliveryContext::default())?,
        })
    }
}

impl RecordSink for KafkaSink {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
    ) -> Result<(), SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in record.headers.iter() {
            headers = headers.insert(Header { key: name, value });
        }
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
            .timestamp(record.timestamp)
            .headers(headers);
        if let Some(k) = record.key.as_deref() {
            r = r.key(k);
        }
        if let Some(v) = record.value.as_deref() {
            r = r.payload(v);
        }
        if let Some(p) = partition {
            r = r.partition(p as i32);
        }
        loop {
            match self.producer.send(r) {
                Ok(()) => return Ok(()),
                // Backpressure from librdkafka's queue: wait for deliveries, then retry.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    r = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    return Err(SinkError {
                        topic: topic.to_string(),
                        message: e.to_string(),
                    })
                }
            }
        }
    }

    fn flush(&self) -> Result<(), SinkError> {
        self.producer.flush(FLUSH_TIMEOUT).map_err(|e| SinkError {
            topic: "*".into(),
            message: format!("flush: {e}"),
        })?;
        match self.producer.context().failed.lock().take() {
            None => Ok(()),
            Some(message) => Err(SinkError {
                topic: "*".into(),
                message: format!("a delivery failed: {message}"),
            }),
        }
    }
}
