//! rill: Kafka-Streams-style stream processing whose parallelism is not capped by the number of
//! input partitions.
//!
//! Each input-partition task is split into sub-tasks by key-hash range (the *parallelising
//! factor*); sub-tasks run on a thread pool over one shared RocksDB with a column family per key
//! range, and each sub-task commits its own progress, so per-key order holds and state is applied
//! exactly once across restarts.
//!
//! With the `test-util` feature, the `TestDriver` runs a topology without a broker:
//!
//! ```
//! # #[cfg(feature = "test-util")] {
//! use rill::prelude::*;
//!
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("orders", StringSerde, I64Serde)
//!     .group_by_key()
//!     .count("orders-per-customer")
//!     .to_stream()
//!     .to("order-counts");
//! let driver = TestDriver::builder(builder.build()?).parallelising_factor(8).build()?;
//! let input = driver.input_topic("orders", StringSerde, I64Serde);
//! input.pipe_input("alice".to_string(), 10);
//! input.pipe_input("alice".to_string(), 20);
//! let output = driver.output_topic("order-counts", StringSerde, I64Serde);
//! assert_eq!(output.read_key_values(), vec![("alice".into(), 1), ("alice".into(), 2)]);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

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
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
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
