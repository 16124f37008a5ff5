//! rill-runtime: runs rill topologies.
//!
//! - [`service`]: the long-lived [`Runtime`], configured by [`config`], observed through
//!   [`metrics`] and [`health`];
//! - `driver` (feature `test-util`): the broker-free `TestDriver` for unit tests of topologies;
//! - [`elastic`]: live changes of the parallelising factor of a running service (by hand, or
//!   following the load with `parallelising.auto`);
//! - [`registry`]: Schema Registry serdes (Avro, Protobuf, JSON Schema in the Confluent wire
//!   format);
//! - [`kafka`]: what the Kafka edge offers besides the runtime: the commit metadata codec, topic
//!   administration and the embedded cluster.
//!
//! The engine (dispatch by key range, sub-tasks on a worker pool, the range commit protocol) is
//! internal; [`internals`] exposes it to rill's own benchmarks and protocol tests, without any
//! stability promise.

#![warn(missing_docs)]
#![warn(unnameable_types)]

pub(crate) mod auto_factor;
pub mod config;
pub(crate) mod control;
#[cfg(feature = "test-util")]
pub mod driver;
pub mod elastic;
pub(crate) mod engine;
pub mod health;
pub(crate) mod http;
pub mod kafka;
pub mod metrics;
pub mod query;
pub(crate) mod queue_time;
pub mod registry;
pub mod reset;
pub mod service;
pub(crate) mod sink;

pub use config::{Config, ConfigBuilder, ConfigError};
#[cfg(feature = "test-util")]
pub use driver::{
    TestDriver, TestDriverBuilder, TestInputTopic, TestOutputTopic, TestSessionStore, TestStore,
    TestVersionedStore, TestWindowStore,
};
pub use engine::{EngineError, RecordErrorHandler};
pub use health::{Health, StateListener, StreamsState};
pub use http::HttpError;
pub use kafka::global::GlobalError;
pub use kafka::producer::ProducerError;
pub use kafka::source::SourceError;
pub use kafka::transaction::TransactionError;
pub use service::uncaught::UncaughtErrorResponse;
pub use service::{RunningRuntime, Runtime, RuntimeError};
pub use sink::SinkError;

/// The engine's internals, for rill's own benchmarks and protocol tests: not a stable API.
#[doc(hidden)]
pub mod internals {
    pub use crate::engine::changelog::{changelog_topic, ChangelogReader, MemoryChangelog};
    pub use crate::engine::{
        Dispatch, Engine, EngineConfig, EngineStats, FactorChange, FactorChanged, FactorDrain,
        PartitionProgress, PriorClaim, RangeLoad, Resume, Revoked, SyncedInput, TaskId,
        TopicPartition,
    };
    pub use crate::sink::{MemorySink, RecordSink, Ticket};
}
