//! Where the engine's output goes: the sink trait the Kafka producer and the TestDriver implement.

use std::collections::HashMap;

use parking_lot::Mutex;
use rill_topology::RawRecord;

/// Why an output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not write to topic `{topic}`: {message}")]
pub struct SinkError {
    /// The topic.
    pub topic: String,
    /// What went wrong.
    pub message: String,
}

/// Takes the engine's output records (sinks, repartition topics, dead letters).
pub trait RecordSink: Send + Sync {
    /// Queues `record` for `topic`; `partition: None` lets the sink's partitioner choose.
    fn send(&self, topic: &str, partition: Option<u32>, record: RawRecord)
        -> Result<(), SinkError>;
    /// Returns once every record sent so far is durably written.
    fn flush(&self) -> Result<(), SinkError>;
}

/// Records sent to one topic, each with the partition asked for.
pub type Sent = Vec<(Option<u32>, RawRecord)>;

/// An in-memory sink: records per topic, in send order (the TestDriver's output topics).
#[derive(Default)]
pub struct MemorySink {
    /// Invariant: appends under the lock keep each topic's records in send order.
    topics: Mutex<HashMap<String, Sent>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes and returns every record sent to `topic` so far.
    pub fn take(&self, topic: &str) -> Sent {
        self.topics.lock().remove(topic).unwrap_or_default()
    }

    /// Topics that have records waiting.
    pub fn topics(&self) -> Vec<String> {
        self.topics
            .lock()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

impl RecordSink for MemorySink {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
    ) -> Result<(), SinkError> {
        self.topics
            .lock()
            .entry(topic.to_string())
            .or_default()
            .push((partition, record));
        Ok(())
    }

    fn flush(&self) -> Result<(), SinkError> {
        Ok(())
    }
}
