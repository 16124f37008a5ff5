//! rill-runtime: runs rill topologies.
//!
//! Most applications depend on the `rill` crate instead, which re-exports this crate as
//! `rill::runtime` and whose crate documentation has a tour. A topology built with
//! `rill-topology` runs here either as a long-lived service against Kafka, or broker-free in a
//! test with the `TestDriver`:
//!
//! ```no_run
//! use rill_runtime::{ConfigBuilder, Runtime};
//! use rill_topology::prelude::*;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let builder = StreamsBuilder::new();
//!     builder
//!         .stream("orders", StringSerde, I64Serde)
//!         .group_by_key()
//!         .count("orders-per-customer")
//!         .to_stream()
//!         .to("order-counts");
//!     let config = ConfigBuilder::new()
//!         .set("application.id", "order-counts")
//!         .set("bootstrap.servers", "kafka-1:9092")
//!         .set("parallelising.factor", 8)
//!         .build()?;
//!     Runtime::new(builder.build()?, config)?.run_until_signal()?;
//!     Ok(())
//! }
//! ```
//!
//! The modules:
//!
//! - [`service`]: the long-lived [`Runtime`], configured by [`config`], observed through
//!   [`metrics`] and [`health`];
//! - `driver` (feature `test-util`): the broker-free `TestDriver` for unit tests of topologies
//!   (on the real engine and state; as Kafka Streams' `TopologyTestDriver`);
//! - [`elastic`]: live changes of the parallelising factor of a running service (by hand, or
//!   following the load with `parallelising.auto`);
//! - [`query`]: interactive queries, reads of a running service's stores from code and over
//!   HTTP;
//! - [`reset`]: the application reset tool (`rill reset`), to process the input again from a
//!   point in time;
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
pub(crate) mod priority;
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
