//! Helpers the `enrich` and `orders` examples share: writing input to the embedded cluster and
//! reading the output topic. Not part of the examples' lesson: the topology is.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Message;

/// An error of an example's helper.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The value of `--name VALUE` in this process's arguments.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// The whole number of `--name N`, or `default`.
pub fn number_arg(name: &str, default: u64) -> Result<u64, String> {
    match arg(name) {
        None => Ok(default),
        Some(s) => s
            .parse()
            .map_err(|_| format!("{name} takes a whole number, got `{s}`")),
    }
}

/// A producer to `bootstrap`.
pub fn producer(bootstrap: &str) -> Result<ThreadedProducer<DefaultProducerContext>, Error> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()?)
}

/// Sends (key, value) to `topic`, waiting while librdkafka's queue is full.
pub fn send(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    key: &[u8],
    value: &[u8],
) -> Result<(), Error> {
    let mut record = BaseRecord::to(topic).key(key).payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((rdkafka::error::KafkaError::MessageProduction(_), back)) => {
                record = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Waits until everything sent is written.
pub fn flush(producer: &ThreadedProducer<DefaultProducerContext>) -> Result<(), Error> {
    Ok(producer.flush(Duration::from_secs(30))?)
}

/// Calls `each(key, value)` for every record of `topic` from the start, until `stop`.
pub fn read(
    bootstrap: &str,
    topic: &str,
    stop: &AtomicBool,
    mut each: impl FnMut(&[u8], &[u8]),
) -> Result<(), Error> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-example-reader"))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()?;
    consumer.subscribe(&[topic])?;
    while !stop.load(Ordering::SeqCst) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            each(m.key().unwrap_or_default(), m.payload().unwrap_or_default());
        }
    }
    Ok(())
}
