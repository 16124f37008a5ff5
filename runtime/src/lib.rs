//! rill-runtime: runs rill topologies.
//!
//! - [`engine`]: dispatch by key range, sub-tasks on a worker pool, the range commit protocol;
//! - [`driver`]: the broker-free `TestDriver` for unit tests of topologies;
//! - [`sink`]: where outputs go (the Kafka producer, or memory in tests);
//! - [`service`]: the long-lived `Runtime` with [`config`], [`metrics`], [`http`] and [`health`],
//!   HTTP and signals served by the [`control`] runtime.

#![warn(missing_docs)]

pub mod config;
pub mod control;
pub mod driver;
pub mod engine;
pub mod health;
pub mod http;
pub mod kafka;
pub mod metrics;
pub mod service;
pub mod sink;

pub use config::{Config, ConfigBuilder, ConfigError};
pub use driver::{TestDriver, TestDriverBuilder, TestInputTopic, TestOutputTopic, TestStore};
pub use engine::{DeserializationHandler, Engine, EngineConfig, EngineError};
pub use health::Health;
pub use service::{RunningRuntime, Runtime, RuntimeError};
