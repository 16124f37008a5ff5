//! rill: Kafka-Streams-style stream processing in Rust whose parallelism is not capped by the
//! number of input partitions.
//!
//! An application reads Kafka topics, transforms, aggregates and joins their records, keeps
//! state in RocksDB and writes results to other topics, with Kafka Streams' model and names
//! ([`StreamsBuilder`](prelude::StreamsBuilder), [`KStream`](prelude::KStream),
//! [`KTable`](prelude::KTable), windows, joins, the Processor API). Unlike Kafka Streams, rill
//! splits each input partition's task into *sub-tasks by key-hash range* (the *parallelising
//! factor*): the ranges of one partition run at the same time on a worker pool, records of one
//! key stay in one range in offset order, and each range commits its state together with its
//! progress, so state is applied exactly once across restarts.
//!
//! # A tour
//!
//! The tour follows one application: a shop's `orders` topic, keyed by customer, whose values
//! are order amounts in cents. The application keeps each customer's revenue and writes every
//! new total to the `revenue` topic.
//!
//! ## Describe the topology
//!
//! A [`StreamsBuilder`](prelude::StreamsBuilder) describes what happens to records: each
//! topic is read with a [`Serde`](prelude::Serde) for its keys and one for its values, and every
//! step returns the next stream or table. Nothing runs yet: [`build`](prelude::StreamsBuilder::build)
//! checks the description and returns a [`Topology`](prelude::Topology).
//!
//! ```
//! use rill::prelude::*;
//!
//! fn revenue() -> Result<Topology, TopologyError> {
//!     let builder = StreamsBuilder::new();
//!     builder
//!         .stream("orders", StringSerde, I64Serde) // KStream<String, i64>
//!         .filter(|_customer, cents| *cents > 0) // refunds are another topology's business
//!         .group_by_key() // all orders of a customer meet in one place...
//!         .reduce(|total, cents| total + cents, "revenue-per-customer") // ...a KTable in RocksDB
//!         .to_stream() // every change of the table
//!         .to("revenue");
//!     builder.build()
//! }
//!
//! let topology = revenue()?;
//! assert_eq!(topology.sub_topologies().len(), 1); // no repartition: the key did not change
//! # Ok::<(), TopologyError>(())
//! ```
//!
//! ## Test it without a broker
//!
//! The [`TestDriver`](prelude::TestDriver) (feature `test-util`, for dev-dependencies) runs a
//! topology on the real engine and real state, without Kafka: records piped into input topics
//! are processed at once, output topics and stores can be read back.
//!
//! ```
//! # #[cfg(feature = "test-util")] {
//! use rill::prelude::*;
//! # fn revenue() -> Result<Topology, TopologyError> {
//! #     let builder = StreamsBuilder::new();
//! #     builder
//! #         .stream("orders", StringSerde, I64Serde)
//! #         .filter(|_customer, cents| *cents > 0)
//! #         .group_by_key()
//! #         .reduce(|total, cents| total + cents, "revenue-per-customer")
//! #         .to_stream()
//! #         .to("revenue");
//! #     builder.build()
//! # }
//!
//! let driver = TestDriver::new(revenue()?)?;
//! let orders = driver.input_topic("orders", StringSerde, I64Serde);
//! orders.pipe_input("alice".to_string(), 1_000);
//! orders.pipe_input("bob".to_string(), 250);
//! orders.pipe_input("alice".to_string(), -300); // filtered out
//! orders.pipe_input("alice".to_string(), 500);
//!
//! let revenue = driver.output_topic("revenue", StringSerde, I64Serde);
//! assert_eq!(
//!     revenue.read_key_values(),
//!     vec![("alice".into(), 1_000), ("bob".into(), 250), ("alice".into(), 1_500)]
//! );
//! let store = driver.key_value_store("revenue-per-customer", StringSerde, I64Serde);
//! assert_eq!(store.get(&"alice".to_string()), Some(1_500));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Parallelism beyond partitions
//!
//! With a parallelising factor of 8, each partition of `orders` is split into 8 key ranges that
//! run at the same time: alice's orders are summed in order in one range while bob's are summed
//! in another. The factor is a setting (`parallelising.factor`), not a property of the topics;
//! it changes at a restart, live, or by itself following the load (`parallelising.auto`).
//!
//! ```
//! # #[cfg(feature = "test-util")] {
//! use rill::prelude::*;
//! # fn revenue() -> Result<Topology, TopologyError> {
//! #     let builder = StreamsBuilder::new();
//! #     builder
//! #         .stream("orders", StringSerde, I64Serde)
//! #         .filter(|_customer, cents| *cents > 0)
//! #         .group_by_key()
//! #         .reduce(|total, cents| total + cents, "revenue-per-customer")
//! #         .to_stream()
//! #         .to("revenue");
//! #     builder.build()
//! # }
//!
//! let driver = TestDriver::builder(revenue()?).parallelising_factor(8).build()?;
//! let orders = driver.input_topic("orders", StringSerde, I64Serde);
//! for (customer, cents) in [("alice", 100), ("bob", 7), ("alice", 20), ("bob", 3)] {
//!     orders.pipe_input(customer.to_string(), cents);
//! }
//! let store = driver.key_value_store("revenue-per-customer", StringSerde, I64Serde);
//! assert_eq!(store.get(&"alice".to_string()), Some(120));
//! assert_eq!(store.get(&"bob".to_string()), Some(10));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Run it against Kafka
//!
//! A [`Runtime`](runtime::Runtime) runs a topology as a long-lived service: a member of the
//! consumer group named by `application.id`, with its state directory, internal topics
//! (repartition topics, changelogs), Prometheus metrics, health and readiness endpoints and
//! graceful shutdown. Configuration comes from code, a TOML file and `RILL_*` environment
//! variables ([`ConfigBuilder`](runtime::ConfigBuilder)); unknown keys and bad values fail at
//! `build`.
//!
//! ```no_run
//! use rill::prelude::*;
//! use rill::runtime::{ConfigBuilder, Runtime};
//! # fn revenue() -> Result<Topology, TopologyError> {
//! #     let builder = StreamsBuilder::new();
//! #     builder
//! #         .stream("orders", StringSerde, I64Serde)
//! #         .group_by_key()
//! #         .reduce(|total, cents| total + cents, "revenue-per-customer")
//! #         .to_stream()
//! #         .to("revenue");
//! #     builder.build()
//! # }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let config = ConfigBuilder::new()
//!         .set("application.id", "revenue")
//!         .set("bootstrap.servers", "kafka-1:9092")
//!         .set("parallelising.factor", 8)
//!         .with_config_file_and_env(None) // RILL_CONFIG's TOML file, then RILL_* variables
//!         .build()?;
//!     // Until SIGTERM or SIGINT: then drain, commit and exit.
//!     Runtime::new(revenue()?, config)?.run_until_signal()?;
//!     Ok(())
//! }
//! ```
//!
//! Start more processes with the same `application.id` to scale out: the group spreads the
//! partitions, and a partition that moves is restored from its changelog topics.
//!
//! ## And then
//!
//! - Windows (tumbling, hopping, sliding, session) and event time: `group_by_key().windowed_by(..)`.
//! - Joins: stream-table, stream-stream, table-table, global tables, foreign-key joins.
//! - The Processor API ([`Processor`](prelude::Processor)) with stores and punctuation, for
//!   logic the DSL does not have.
//! - Async stages, which await I/O per record without holding a thread.
//! - Interactive queries: reading stores of a running service, from code or over HTTP
//!   ([`runtime::query`]).
//! - Schema Registry serdes: Avro, Protobuf and JSON Schema ([`registry`]).
//!
//! # The guide
//!
//! The user guide lives in the repository's `docs/` directory (`docs/README.md` is its table of
//! contents), in short chapters whose examples run as tests: writing topologies
//! (`docs/topologies.md`), windows and time (`windows-and-time.md`), tables and joins
//! (`tables-and-joins.md`), async stages (`async-stages.md`), guarantees and exactly-once
//! (`guarantees.md`), parallelism (`parallelism.md`), operating: configuration and metrics
//! references, health, signals, failures (`operating.md`), interactive queries
//! (`interactive-queries.md`), coming from Kafka Streams (`kafka-streams.md`) and the
//! architecture (`architecture.md`).
//!
//! # Crates and features
//!
//! This crate is a facade: [`prelude`] holds the names most applications need, and the
//! workspace's crates are re-exported whole:
//!
//! - [`topology`] (`rill-topology`): the DSL, the Processor API, serdes, records, key ranges;
//!   no I/O;
//! - [`state`] (`rill-state`): the shared RocksDB, its column families and range commits;
//! - [`runtime`] (`rill-runtime`): the engine, Kafka I/O, the service, configuration, metrics,
//!   interactive queries, the reset tool, the `TestDriver`; [`registry`] is its Schema Registry
//!   module.
//!
//! Features:
//!
//! - `mimalloc` (default): mimalloc as the process's allocator, for Rust and for the C/C++ of
//!   RocksDB and librdkafka, with a short purge delay (`PURGE_DELAY_MS`); turn it off to
//!   choose your own allocator.
//! - `test-util`: the broker-free [`TestDriver`](prelude::TestDriver) and its topics and stores
//!   in the prelude.
//!
//! Building needs a C/C++ toolchain and libclang (RocksDB and librdkafka are compiled from
//! source), and OpenSSL's headers for librdkafka's TLS and SASL.

#![warn(missing_docs)]
// The links to the TestDriver resolve with `test-util`, which docs.rs and CI's `cargo doc
// --all-features` document with.
#![cfg_attr(not(feature = "test-util"), allow(rustdoc::broken_intra_doc_links))]

/// The process's allocator (feature `mimalloc`, on by default; a binary that sets its own turns
/// the feature off): the per-record path allocates keys, values and records, and with glibc's
/// malloc a count by key took ~1.5x the CPU per record (`scripts/bench`, S2). mimalloc also
/// replaces `malloc` for RocksDB and librdkafka (its `override` feature): glibc kept their freed
/// memory in per-thread arenas (peak RSS of the memory benchmark 611-675 MiB with glibc for
/// them, 433-452 MiB without, alternating runs).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's purge delay in ms: how long freed memory stays resident before it goes back to
/// the system. mimalloc 3's default (1 s, times 10 for whole arenas) kept ~100 MiB more after
/// bursts in the memory benchmark (peak 426-463 MiB and 364-374 after the run at 100 ms,
/// against 500-539 and 422-474); 10 ms (mimalloc 2's default) saves a little more but cost
/// ~4 % of S2's records/s, 100 ms ~2 %. `MIMALLOC_PURGE_DELAY` still overrides it.
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
pub const PURGE_DELAY_MS: i64 = 100;

/// Sets [`PURGE_DELAY_MS`] as mimalloc's default before `main` (an ELF constructor), so that
/// it holds from the first allocation of every binary that links the crate.
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
#[used]
#[link_section = ".init_array"]
static SET_PURGE_DELAY: extern "C" fn() = set_purge_delay;

/// mimalloc's option number of the purge delay (`mi_option_purge_delay` of mimalloc 3's
/// `mimalloc.h`, between the bindings' `eager_commit_delay` 14 and `use_numa_nodes` 16, which
/// do not name it).
///
/// Public only for the crate's tests (`tests/allocator.rs`): not a stable API.
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
#[doc(hidden)]
pub const MI_OPTION_PURGE_DELAY: i32 = 15;

#[cfg(all(feature = "mimalloc", target_os = "linux"))]
extern "C" fn set_purge_delay() {
    // SAFETY: sets a default in mimalloc's option table; an environment variable read later
    // still wins.
    unsafe {
        libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY as _, PURGE_DELAY_MS as _)
    }
}

/// The Rust snippets of the README and of the user guide under `docs/`, compiled and run as doc
/// tests (`cargo test --doc`), so that every example there stays true.
#[cfg(doctest)]
mod docs {
    macro_rules! doc_file {
        ($name:ident, $path:literal) => {
            #[doc = include_str!($path)]
            pub struct $name;
        };
    }
    doc_file!(Readme, "../README.md");
    doc_file!(Guide, "../docs/README.md");
    doc_file!(Topologies, "../docs/topologies.md");
    doc_file!(WindowsAndTime, "../docs/windows-and-time.md");
    doc_file!(TablesAndJoins, "../docs/tables-and-joins.md");
    doc_file!(AsyncStages, "../docs/async-stages.md");
    doc_file!(Guarantees, "../docs/guarantees.md");
    doc_file!(Parallelism, "../docs/parallelism.md");
    doc_file!(Operating, "../docs/operating.md");
    doc_file!(InteractiveQueries, "../docs/interactive-queries.md");
    doc_file!(KafkaStreams, "../docs/kafka-streams.md");
    doc_file!(Architecture, "../docs/architecture.md");
}

pub use rill_runtime as runtime;
/// Schema Registry serdes: Avro, Protobuf and JSON Schema in the Confluent wire format.
pub use rill_runtime::registry;
pub use rill_state as state;
pub use rill_topology as topology;

/// The names most applications need.
pub mod prelude {
    #[cfg(feature = "test-util")]
    pub use rill_runtime::driver::{
        TestDriver, TestInputTopic, TestOutputTopic, TestSessionStore, TestStore,
        TestVersionedStore, TestWindowStore,
    };
    pub use rill_runtime::RecordErrorHandler;
    pub use rill_topology::prelude::*;
}
