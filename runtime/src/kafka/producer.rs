//! The Kafka sink: an idempotent librdkafka producer behind [`RecordSink`].
//!
//! Each record carries its sub-task's delivery [`Ticket`]; the delivery callback settles it, so a
//! range commits its progress only over outputs the broker acknowledged.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::Message;
use rill_topology::RawRecord;

use crate::sink::{RecordSink, SinkError, Ticket};

/// Settles each record's delivery ticket.
#[derive(Default)]
pub struct DeliveryContext;

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Ticket>;
    fn delivery(&self, result: &DeliveryResult<'_>, ticket: Box<Ticket>) {
        let result = match result {
            Ok(m) => Ok(m.offset().max(0) as u64),
            Err((e, _)) => Err(e.to_string()),
        };
        ticket.delivered(result);
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
            producer: cfg.create_with_context(DeliveryContext)?,
        })
    }
}

impl RecordSink for KafkaSink {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: Ticket,
    ) -> Result<(), SinkError> {
        let mut r: BaseRecord<'_, [u8], [u8], Box<Ticket>> =
            BaseRecord::with_opaque_to(topic, Box::new(ticket)).timestamp(record.timestamp);
        // librdkafka allocates a header list even for none: only build one when needed.
        if !record.headers.is_empty() {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
            for (name, value) in record.headers.iter() {
                headers = headers.insert(Header { key: name, value });
            }
            r = r.headers(headers);
        }
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
}
