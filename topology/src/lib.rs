//! rill-topology: what a rill application is made of, with no I/O.
//!
//! Most applications depend on the `rill` crate instead, which re-exports this crate as
//! `rill::topology`, its common names in `rill::prelude`, and adds the engine, state and Kafka
//! I/O that run a topology (and the `TestDriver` that runs it in tests). This crate is the
//! part of rill that describes: a [`StreamsBuilder`] builds a [`Topology`] from streams, tables
//! and processors, and the engine of `rill-runtime` runs it.
//!
//! ```
//! use rill_topology::prelude::*;
//!
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("orders", StringSerde, I64Serde)
//!     .filter(|_customer, cents| *cents > 0)
//!     .group_by_key()
//!     .reduce(|total, cents| total + cents, "revenue-per-customer")
//!     .to_stream()
//!     .to("revenue");
//! let topology: Topology = builder.build()?;
//! assert_eq!(topology.sub_topologies().len(), 1);
//! # Ok::<(), TopologyError>(())
//! ```
//!
//! The modules:
//!
//! - [`keyrange`]: the stable key hash and the split of the hash space into key ranges, which
//!   decides the sub-task of every record;
//! - [`serdes`]: how keys and values become bytes (Kafka-compatible layouts);
//! - [`dsl`]: `StreamsBuilder`, `KStream`, `KGroupedStream`, `KTable` and the option objects
//!   (`Materialized`, `Grouped`, `Produced`, `Consumed`, `Repartitioned`, `Named`), named as in
//!   Kafka Streams;
//! - [`processor`]: the Processor API for custom logic, state access and punctuation;
//! - [`stores`]: declaring Processor-API stores with their serdes (`Stores`, `StoreBuilder`);
//! - [`time`]: event time (timestamp extractors, invalid timestamps, the partition's stream time at each key range);
//! - [`window`]: windows, windowed aggregations, window and session stores, emit-final;
//! - [`graph`] and [`exec`]: the processor graph and how one sub-task runs it;
//! - [`cache`]: the record cache that collapses an aggregation's updates per key between commits.
//!
//! The engine that feeds records and owns state lives in `rill-runtime`; stores live in
//! `rill-state`.

#![warn(missing_docs)]
#![warn(unnameable_types)]

pub mod cache;
pub mod describe;
pub mod dsl;
pub mod exec;
pub mod global;
pub mod graph;
pub mod keyrange;
pub mod processor;
pub mod record;
pub mod serdes;
pub mod store;
pub mod stores;
#[cfg(test)]
mod test_host;
pub mod time;
pub mod versioned;
pub mod window;

pub use describe::DescribeFormat;
pub use dsl::{
    CogroupedKStream, Consumed, Grouped, KGroupedStream, KStream, KTable, Materialized, Named,
    Produced, Repartitioned, SessionWindowedKStream, Split, StreamsBuilder, TimeWindowedKStream,
    TopologyError,
};
pub use graph::{OrderSensitive, Topic, Topology};
pub use keyrange::{
    kafka_partition, key_hash, range_of, ranges, KeyRange, HASH_ID, OFFSET_HASH_ID,
};
pub use processor::{
    Cancellable, FixedKeyContext, FixedKeyProcessor, FixedKeyRecord, Processor, ProcessorContext,
    PunctuationType, TaskContext,
};
pub use record::{Headers, RawRecord, Record, PARTITION_HEADER};

/// The names most applications need.
pub mod prelude {
    pub use crate::dsl::{
        CogroupedKStream, Consumed, GlobalKTable, Grouped, JoinWindows, Joined, KGroupedStream,
        KStream, KTable, Materialized, Named, Produced, Repartitioned, SessionWindowedKStream,
        StreamJoined, StreamsBuilder, TimeWindowedKStream, TopologyError,
    };
    pub use crate::graph::Topology;
    pub use crate::processor::{
        Cancellable, FixedKeyContext, FixedKeyProcessor, FixedKeyRecord, ProcessError, Processor,
        ProcessorContext, PunctuationType,
    };
    pub use crate::record::{Headers, Record};
    pub use crate::serdes::{
        BytesSerde, I32Serde, I64Serde, JsonSerde, Nullable, ProtobufSerde, Serde, SerdeError,
        StringSerde, U64Serde,
    };
    pub use crate::store::{
        KeyValueBytes, KeyValueIterator, KeyValueStore, StoreError, WindowStoreIterator,
    };
    pub use crate::stores::{StoreBuilder, Stores};
    pub use crate::time::{
        FailOnInvalidTimestamp, LogAndSkipOnInvalidTimestamp, OnInvalidTimestamp,
        UsePartitionTimeOnInvalidTimestamp, UseWallclockTimeOnInvalidTimestamp,
        WallclockTimestampExtractor,
    };
    pub use crate::versioned::{PutOutcome, VersionedRecord, VersionedStore};
    pub use crate::window::{
        BufferConfig, EmitStrategy, SessionStore, SessionWindowedSerde, SessionWindows,
        SlidingWindows, Suppressed, TimeWindowedSerde, TimeWindows, ValueAndTimestamp, Window,
        WindowStore, Windowed,
    };
}
