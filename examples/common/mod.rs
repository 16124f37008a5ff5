//! Helpers the examples share: the `--config` option, writing input to the embedded cluster and
//! reading the output topic. Not part of the examples' lesson: the topology is.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Message;

/// An error of an example's helper.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The option every example service takes; flatten it into the example's arguments.
#[derive(clap::Args, Debug)]
pub struct ServiceArgs {
    /// TOML config file (keys as in the README); RILL_CONFIG names one too, RILL_* variables
    /// override it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
