//! Helpers the examples share: the `--config` option, writing input to the embedded cluster and
//! reading the output topic. Not part of the examples' lesson: the topology is.
#![allow(dead_code)]

#[path = "../../tests/common/producer.rs"]
pub mod producer;

#[allow(unused_imports)] // not every example uses every helper
pub use producer::{flush, input_producer, send};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;

/// An error of an example's helper.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The option every example service takes; flatten it into the example's arguments.
#[derive(clap::Args, Debug)]
pub struct ServiceArgs {
    /// TOML config file (keys as in docs/operating.md); RILL_CONFIG names one too, RILL_*
    /// variables override it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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

/// Waits for the demo's helper threads, reporting one that failed or panicked.
pub fn join_helpers(helpers: Vec<std::thread::JoinHandle<Result<(), Error>>>) {
    for h in helpers {
        match h.join() {
            Ok(Err(e)) => eprintln!("demo helper failed: {e}"),
            Err(_) => eprintln!("demo helper panicked"),
            Ok(Ok(())) => {}
        }
    }
}
