//! Why the engine stopped or refused a call.

use std::sync::Arc;

use rill_state::StateError;
use rill_topology::exec::TaskError;

use crate::sink::SinkError;

/// Why the engine stopped or refused a call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A store changelog could not be read for restore.
    #[error("restoring from changelog `{topic}` partition {partition}: {message}; check that the brokers are reachable and the topic exists")]
    Restore {
        /// Changelog topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// What went wrong.
        message: String,
    },
    /// A bad engine setting.
    #[error("invalid setting `{key}`: {message}")]
    Config {
        /// The setting.
        key: &'static str,
        /// What is expected.
        message: String,
    },
    /// A record did not deserialize under the `fail` handler.
    #[error("record at {topic}-{partition} offset {offset} does not deserialize: {message} (deserialization.error.handler=fail; use log_and_continue or dead_letter:<topic> to skip such records)")]
    Deserialization {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Offset.
        offset: u64,
        /// The serde error.
        message: String,
    },
    /// A processor or sink failed.
    #[error("{what}: {source}")]
    Task {
        /// Where.
        what: String,
        /// What failed.
        #[source]
        source: TaskError,
    },
    /// State could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// Output could not be written.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// A store read failed.
    #[error(transparent)]
    Store(#[from] rill_topology::store::StoreError),
    /// A record came for a topic no source reads.
    #[error("no source reads topic `{0}`")]
    UnknownTopic(String),
    /// A record came for a partition not assigned to this engine.
    #[error("partition {partition} of `{topic}` is not assigned")]
    NotAssigned {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
    },
    /// The worker pool could not start.
    #[error("worker pool: {0}")]
    Pool(String),
    /// A live change of the parallelising factor could not complete.
    #[error("changing the parallelising factor: {0}")]
    FactorChange(String),
    /// A task was fenced (its partition lost) while the instance's transaction was open: the
    /// transaction must be aborted.
    #[error("a task was fenced (its partition was lost) during the transaction: it is aborted")]
    Fenced,
    /// Processing stopped earlier on this error; the engine takes no more work.
    #[error("processing stopped: {0}")]
    Stopped(Arc<EngineError>),
}
