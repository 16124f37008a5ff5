//! The streams DSL: `StreamsBuilder`, `KStream`, `KGroupedStream` and `KTable`, with the names
//! Kafka Streams users know, and the option objects that name and configure each step
//! ([`Materialized`], [`Grouped`], [`Produced`], [`Consumed`], [`Repartitioned`], [`Named`]).
//!
//! ```
//! use rill_topology::prelude::*;
//!
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("streams-plaintext-input", StringSerde, StringSerde)
//!     .flat_map_values(|line: String| {
//!         line.to_lowercase()
//!             .split(|c: char| !c.is_alphanumeric())
//!             .filter(|w| !w.is_empty())
//!             .map(str::to_string)
//!             .collect::<Vec<_>>()
//!     })
//!     .group_by(|_key, word: &String| word.clone(), Grouped::with(StringSerde, StringSerde))
//!     .count("counts-store")
//!     .to_stream()
//!     .to("streams-wordcount-output");
//! let topology = builder.build().unwrap();
//! assert_eq!(topology.sub_topologies().len(), 2);
//! ```
//!
//! Every option object has a short form: a `&str` is a [`Materialized`] store name, a
//! [`Repartitioned`] or a [`Named`] name (`count("counts")`, `repartition("by-user")`).
//!
//! Operations that change the key (`map`, `select_key`, `flat_map`) mark the stream; a following
//! `group_by_key` then writes to a repartition topic first, exactly like `group_by`, so that every
//! record of a key meets the same store.
//!
//! Files: [`builder`] (the builder and the split into sub-topologies), [`stream`] (`KStream`,
//! `Split`), [`grouped`] (`KGroupedStream` and the aggregations), [`table`] (`KTable` and tables
//! read from topics), [`join`] (stream-table joins), [`options`] (the option objects).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::graph::{Decoder, Encoder, NodeKind};
use crate::processor::{
    erase, Datum, ErasedProcessor, ErasedRecord, ProcessError, ProcessorHost, PunctuationType,
};
use crate::record::{RawRecord, Record};
use crate::serdes::{Serde, SerdeError};
use crate::store::StoreKind;
use crate::window::WindowError;

pub mod async_stage;
pub mod builder;
pub mod change;
pub mod cogroup;
pub mod fk_join;
pub mod global_table;
pub mod grouped;
pub mod grouped_table;
pub mod join;
pub mod options;
pub mod stream;
pub mod stream_join;
pub mod table;
pub mod table_join;
pub mod table_view;
pub mod windowed;

pub use builder::StreamsBuilder;
pub use change::{Change, ChangeSerde};
pub use cogroup::CogroupedKStream;
pub use global_table::GlobalKTable;
pub use grouped::KGroupedStream;
pub use grouped_table::KGroupedTable;
pub use options::{Consumed, Grouped, Joined, Materialized, Named, Produced, Repartitioned};
pub use stream::{KStream, Split};
pub use stream_join::{JoinWindows, StreamJoined};
pub use table::KTable;
pub(crate) use table::WindowedTable;
pub use windowed::{SessionWindowedKStream, TimeWindowedKStream, WindowedBy};

/// Why a topology could not be built; each names the node or store at fault.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    /// The topology has no source.
    #[error("the topology has no source: add one with StreamsBuilder::stream")]
    NoSource,
    /// A node or store name is used twice.
    #[error("duplicate name `{0}`: node and store names must be unique")]
    DuplicateName(String),
    /// Two sources read the same topic.
    #[error("topic `{topic}` is already read by source `{existing}`; merge the streams instead")]
    DuplicateSourceTopic {
        /// The topic.
        topic: String,
        /// The source that reads it first.
        existing: String,
    },
    /// A processor names a store nobody added.
    #[error("node `{node}` uses store `{store}`, which was never added (StreamsBuilder::add_state_store)")]
    UnknownStore {
        /// The processor.
        node: String,
        /// The missing store.
        store: String,
    },
    /// A name contains characters that cannot be part of a topic or store name.
    #[error("name `{0}` is invalid: use letters, digits, `-` and `_` only")]
    InvalidName(String),
    /// A window definition or a window store's retention is invalid.
    #[error("windowed aggregation into `{store}`: {source}")]
    InvalidWindows {
        /// The aggregation's store.
        store: String,
        /// What is wrong.
        #[source]
        source: WindowError,
    },
    /// `suppress(until_window_closes)` on a table that is not the result of a windowed
    /// aggregation.
    #[error("suppress `{name}`: until_window_closes needs a windowed table (from windowed_by(..).count/reduce/aggregate); use until_time_limit for other tables")]
    SuppressNotWindowed {
        /// The suppression's node.
        name: String,
    },
    /// `Materialized::versioned` on a store other than a table's read from a topic.
    #[error("store `{store}`: only a table read from a topic (StreamsBuilder::table) can be versioned; aggregations keep the latest value per key")]
    VersionedNotSupported {
        /// The store.
        store: String,
    },
    /// `suppress(until_window_closes)` with a buffer that may emit early.
    #[error("suppress `{name}`: until_window_closes needs a strict buffer (BufferConfig::unbounded() or shutdown_when_full()): an early result would not be final")]
    SuppressBufferNotStrict {
        /// The suppression's node.
        name: String,
    },
    /// Two async stages on one path from a source.
    #[error("async stage `{node}` (on the records of {topics}) follows another async stage: await both calls in one future (async move {{ let a = first(v).await?; second(a).await }})")]
    AsyncChained {
        /// The second stage.
        node: String,
        /// The user topics whose records reach it.
        topics: String,
    },
    /// A stateful node beside an async stage that `build` could not move to a sub-topology of
    /// its own (it splits them with an internal topic where it can).
    #[error("{state} shares a sub-topology with async stage `{stage}` (on the records of {topics}) and build() could not separate them: put the stateful step after the stage, or write the stage's output to a topic of your own and read it in another step")]
    AsyncBesideState {
        /// The stateful node's store(s), as the user named them.
        state: String,
        /// The async stage.
        stage: String,
        /// The user topics whose records reach the stage.
        topics: String,
    },
    /// `build` must put an internal topic before or after an async stage (state beside it) and
    /// does not know a serde for it.
    #[error(transparent)]
    AsyncSplitSerde(Box<AsyncSplitSerde>),
    /// A stream-table join with a grace period on a table that is not versioned.
    #[error("join `{node}` with the table of store `{store}` has a grace period, which needs a versioned table: read the table with Materialized::versioned(history_retention), or drop Joined::with_grace_period")]
    GraceNeedsVersionedTable {
        /// The join node.
        node: String,
        /// The table's store.
        store: String,
    },
    /// `KTable::group_by` or a table-table join on a table that does not carry its replaced
    /// values.
    #[error("table `{store}` cannot be regrouped or joined with another table: group_by and table-table joins need a table read from a topic (StreamsBuilder::table), a filter / map_values view of one, or a table-table join's result; an aggregation's table does not carry the values its updates replace yet")]
    NoTableChanges {
        /// The table's store.
        store: String,
    },
    /// A serde needed by a node is not known.
    #[error("node `{node}` needs a {what} serde: the key or value type changed upstream; pass serdes explicitly ({hint})")]
    MissingSerde {
        /// The node.
        node: String,
        /// "key" or "value".
        what: &'static str,
        /// The method that takes them.
        hint: &'static str,
    },
}

/// The details of [`TopologyError::AsyncSplitSerde`].
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{state} shares a sub-topology with async stage `{stage}` (on the records of {topics}), so build() must put the internal topic {topic} {side} the stage, and the {what} serde of the stage's {data} is not known: {hint}")]
pub struct AsyncSplitSerde {
    /// The stateful node's store(s), as the user named them.
    pub state: String,
    /// The async stage.
    pub stage: String,
    /// The user topics whose records reach the stage.
    pub topics: String,
    /// The internal topic it would insert.
    pub topic: String,
    /// "before" or "after".
    pub side: &'static str,
    /// "key" or "value".
    pub what: &'static str,
    /// "input" or "output".
    pub data: &'static str,
    /// The exact call that gives the serdes.
    pub hint: String,
}

/// A branch predicate of [`KStream::split`].
type Pred<K, V> = Arc<dyn Fn(Option<&K>, &V) -> bool + Send + Sync>;

/// A node being added, before `build` links children to parents.
#[derive(Clone)]
struct Draft {
    name: String,
    kind: NodeKind,
    parents: Vec<usize>,
}

/// The graph under construction, shared by every stream of one builder.
#[derive(Default)]
struct GraphBuilder {
    nodes: Vec<Draft>,
    /// Every store, with what it holds.
    stores: BTreeMap<String, StoreKind>,
    names: BTreeSet<String>,
    counter: usize,
    /// Errors found while chaining; `build` reports the first.
    errors: Vec<TopologyError>,
    /// Global tables: store name -> topic.
    global_tables: BTreeMap<String, String>,
    /// Per async stage (by node name): what `build` needs to put an internal topic beside it.
    async_splits: BTreeMap<String, async_stage::AsyncSplit>,
    /// Tables read from topics: store name -> topic (errors name both).
    table_topics: BTreeMap<String, String>,
    /// DSL stores materialized `with_logging_disabled`.
    unlogged: BTreeSet<String>,
    /// DSL stores materialized `in_memory`.
    in_memory: BTreeSet<String>,
    /// Changelog topic configs of DSL stores materialized `with_logging_enabled(configs)`.
    changelog_configs: BTreeMap<String, BTreeMap<String, String>>,
}

impl GraphBuilder {
    fn claim_name(&mut self, name: &str) {
        if !valid_name(name) {
            self.errors
                .push(TopologyError::InvalidName(name.to_string()));
        }
        if !self.names.insert(name.to_string()) {
            self.errors
                .push(TopologyError::DuplicateName(name.to_string()));
        }
    }

    fn generated_name(&mut self, op: &str) -> String {
        self.counter += 1;
        format!("{op}-{:04}", self.counter)
    }

    /// `name` when given, else a generated `<op>-<n>`.
    fn name_or_generated(&mut self, name: Option<&str>, op: &str) -> String {
        name.map_or_else(|| self.generated_name(op), str::to_string)
    }

    /// The name of the store `materialized` describes (generated `<op>-<n>` without one), with
    /// its logging and in-memory options noted.
    fn materialized_store<K, V>(&mut self, materialized: &Materialized<K, V>, op: &str) -> String {
        let store = self.name_or_generated(materialized.name.as_deref(), op);
        if materialized.logging_disabled {
            self.unlogged.insert(store.clone());
        }
        if materialized.in_memory {
            self.in_memory.insert(store.clone());
        }
        if !materialized.changelog_configs.is_empty() {
            self.changelog_configs
                .insert(store.clone(), materialized.changelog_configs.clone());
        }
        store
    }

    fn add(&mut self, name: String, kind: NodeKind, parents: Vec<usize>) -> usize {
        self.claim_name(&name);
        self.nodes.push(Draft {
            name,
            kind,
            parents,
        });
        self.nodes.len() - 1
    }

    /// Declares store `name` (claiming the name).
    fn add_store(&mut self, name: &str, kind: StoreKind) {
        self.claim_name(name);
        self.stores.insert(name.to_string(), kind);
    }

    /// Records an error `build` will report.
    fn error(&mut self, e: TopologyError) {
        self.errors.push(e);
    }

    /// Records that `node` lacks a `what` serde; `build` will fail with it.
    fn missing_serde(&mut self, node: usize, what: &'static str, hint: &'static str) {
        let node = self.nodes[node].name.clone();
        self.errors
            .push(TopologyError::MissingSerde { node, what, hint });
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn decoder<K: Datum, V: Datum>(key: Arc<dyn Serde<K>>, value: Arc<dyn Serde<V>>) -> Decoder {
    Arc::new(move |raw: &RawRecord| {
        let k = match &raw.key {
            Some(bytes) => Some(key.deserialize(bytes)?),
            None => None,
        };
        let v = match &raw.value {
            Some(bytes) => value.deserialize(bytes)?,
            None => value.null_value().ok_or_else(|| {
                SerdeError::new(
                    "source",
                    "null value (tombstone) in a stream: read the stream with Nullable(value serde) to see nulls as None, or let the deserialization handler skip them",
                )
            })?,
        };
        Ok(erase(Record {
            key: k,
            value: v,
            timestamp: raw.timestamp,
            headers: raw.headers.clone(),
        }))
    })
}

/// Decodes the records of a table's topic: a null value (a tombstone) is `None`, a deletion.
fn table_decoder<K: Datum, V: Datum + Clone>(
    key: Arc<dyn Serde<K>>,
    value: Arc<dyn Serde<V>>,
) -> Decoder {
    Arc::new(move |raw: &RawRecord| {
        let k = raw.key.as_ref().map(|b| key.deserialize(b)).transpose()?;
        let v = raw
            .value
            .as_ref()
            .map(|b| value.deserialize(b))
            .transpose()?;
        Ok(erase(Record {
            key: k,
            value: v,
            timestamp: raw.timestamp,
            headers: raw.headers.clone(),
        }))
    })
}

fn encoder<K: Datum, V: Datum + Clone>(
    key: Arc<dyn Serde<K>>,
    value: Arc<dyn Serde<V>>,
) -> Encoder {
    encoder_with(key, move |v: &V| match value.is_null(v) {
        true => Ok(None),
        false => value.serialize(v).map(Some),
    })
}

/// A sink's encoder whose value bytes come from `value` (`None`: a tombstone).
fn encoder_with<K: Datum, V: Datum + Clone>(
    key: Arc<dyn Serde<K>>,
    value: impl Fn(&V) -> Result<Option<Vec<u8>>, SerdeError> + Send + Sync + 'static,
) -> Encoder {
    Arc::new(move |rec: &ErasedRecord| {
        let k = match &rec.key {
            Some(k) => Some(key.serialize((**k).as_any().downcast_ref::<K>().ok_or_else(
                || {
                    SerdeError::new(
                        "sink",
                        format!("key is not a {}", std::any::type_name::<K>()),
                    )
                },
            )?)?),
            None => None,
        };
        let v = (*rec.value).as_any().downcast_ref::<V>().ok_or_else(|| {
            SerdeError::new(
                "sink",
                format!("value is not a {}", std::any::type_name::<V>()),
            )
        })?;
        Ok(RawRecord {
            key: k,
            value: value(v)?,
            timestamp: rec.timestamp,
            headers: rec.headers.clone(),
        })
    })
}

type StatelessFn =
    dyn Fn(ErasedRecord, &mut dyn ProcessorHost) -> Result<(), ProcessError> + Send + Sync;

/// A processor made of one shared closure: stateless operations.
struct FnProcessor(Arc<StatelessFn>);

impl ErasedProcessor for FnProcessor {
    fn init(&mut self, _host: &mut dyn ProcessorHost) -> Result<(), ProcessError> {
        Ok(())
    }
    fn process(
        &mut self,
        record: ErasedRecord,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError> {
        (self.0)(record, host)
    }
    fn punctuate(
        &mut self,
        _kind: PunctuationType,
        _timestamp: i64,
        _host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// A serde that always fails: stands in where build() will report a missing serde anyway.
struct NoSerde;
impl<T> Serde<T> for NoSerde {
    fn serialize(&self, _: &T) -> Result<Vec<u8>, SerdeError> {
        Err(SerdeError::new("missing serde", "no serde was given"))
    }
    fn deserialize(&self, _: &[u8]) -> Result<T, SerdeError> {
        Err(SerdeError::new("missing serde", "no serde was given"))
    }
}

#[cfg(test)]
mod tests;
