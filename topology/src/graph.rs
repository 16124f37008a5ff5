//! The processor graph a [`crate::StreamsBuilder`] builds: nodes, sub-topologies and stores.
//!
//! A *sub-topology* is a connected part of the graph that starts at source topics; a key-changing
//! `group_by` ends one sub-topology in a sink to a repartition topic and starts the next one from
//! it, as in Kafka Streams. The engine runs one task per (sub-topology, input partition).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::processor::{ErasedProcessor, ErasedRecord, ProcessError};
use crate::record::RawRecord;
use crate::serdes::SerdeError;
use crate::store::StoreKind;
use crate::stores::StoreDeclaration;
use crate::time::OnInvalidTimestamp;

/// A topic a node reads or writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// A user topic, named as given.
    External(String),
    /// A topic owned by the application (repartition): the runtime prefixes it with
    /// `<application.id>-`.
    Internal(String),
}

impl Topic {
    /// The topic's name on the broker for `application_id`.
    pub fn resolve(&self, application_id: &str) -> String {
        match self {
            Topic::External(name) => name.clone(),
            Topic::Internal(suffix) => format!("{application_id}-{suffix}"),
        }
    }

    /// Whether the application owns (and creates) the topic.
    pub fn is_internal(&self) -> bool {
        matches!(self, Topic::Internal(_))
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topic::External(name) => f.write_str(name),
            Topic::Internal(suffix) => write!(f, "<application.id>-{suffix}"),
        }
    }
}

/// Deserializes a raw input record into an erased one.
pub type Decoder = Arc<dyn Fn(&RawRecord) -> Result<ErasedRecord, SerdeError> + Send + Sync>;
/// Serializes an erased record for a sink topic.
pub type Encoder = Arc<dyn Fn(&ErasedRecord) -> Result<RawRecord, SerdeError> + Send + Sync>;
/// Reads the event time of a decoded record (a source's timestamp extractor).
pub type Extractor = Arc<dyn Fn(&ErasedRecord) -> i64 + Send + Sync>;
/// Creates one processor instance per sub-task.
pub type Supplier = Arc<dyn Fn() -> Box<dyn ErasedProcessor> + Send + Sync>;

/// What one call of an async stage resolves to: the records the stage forwards.
pub type AsyncOutput =
    Pin<Box<dyn Future<Output = Result<Vec<ErasedRecord>, ProcessError>> + Send>>;
/// Starts an async stage's call for one record (again for each retry).
pub type AsyncFn = Arc<dyn Fn(ErasedRecord) -> AsyncOutput + Send + Sync>;

/// What a node does.
#[derive(Clone)]
pub enum NodeKind {
    /// Reads and deserializes records of a topic.
    Source {
        /// The topic read.
        topic: Topic,
        /// Deserializer for key and value.
        decode: Decoder,
        /// The timestamp extractor; `None` keeps the record timestamp.
        extract: Option<Extractor>,
        /// What a negative timestamp does.
        on_invalid: OnInvalidTimestamp,
    },
    /// Runs a processor.
    Processor {
        /// Creates the processor of each sub-task.
        supplier: Supplier,
        /// Stores the processor uses.
        stores: Vec<String>,
    },
    /// An async stage: a call per record that the engine runs on its async runtime; the
    /// records it resolves to go on to the node's children (see `exec::AsyncCall`).
    Async {
        /// Starts the call for a record.
        call: AsyncFn,
    },
    /// Serializes and writes records to a topic.
    Sink {
        /// The topic written.
        topic: Topic,
        /// Serializer for key and value.
        encode: Encoder,
    },
}

/// A node of the processor graph.
#[derive(Clone)]
pub struct Node {
    /// Unique name (generated as `<operation>-<n>` unless given).
    pub name: String,
    /// What the node does.
    pub kind: NodeKind,
    /// Nodes that receive this node's output, in order.
    pub children: Vec<usize>,
}

/// A connected part of the graph with its own source topics and stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubTopology {
    /// Position in [`Topology::sub_topologies`].
    pub id: usize,
    /// Source topics and the node that reads each.
    pub sources: Vec<(Topic, usize)>,
    /// Topics written by this sub-topology's sinks.
    pub sinks: Vec<Topic>,
    /// Names of the stores its processors use.
    pub stores: Vec<String>,
    /// The stores of `stores` that have a changelog topic, in the same order (all but those
    /// built `with_logging_disabled`); the last one decides a restore.
    pub logged: Vec<String>,
    /// Its nodes, by index into [`Topology::nodes`].
    pub nodes: Vec<usize>,
}

impl SubTopology {
    /// Whether any processor keeps state (its sub-tasks then commit a WriteBatch).
    pub fn is_stateful(&self) -> bool {
        !self.stores.is_empty()
    }
}

/// A sub-topology whose outputs to internal topics depend on the order it takes its inputs in
/// (see [`Topology::order_sensitive`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderSensitive {
    /// Its position in [`Topology::sub_topologies`].
    pub sub_topology: usize,
    /// The source topics whose records reach one internal topic.
    pub sources: Vec<Topic>,
    /// The internal topics records of several sources reach.
    pub internal_topics: Vec<Topic>,
}

impl fmt::Display for OrderSensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |topics: &[Topic]| {
            topics
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "sub-topology {} reads {} and writes what depends on their order to {}",
            self.sub_topology,
            list(&self.sources),
            list(&self.internal_topics)
        )
    }
}

/// A validated topology, ready to run.
#[derive(Clone)]
pub struct Topology {
    pub(crate) nodes: Vec<Node>,
    pub(crate) sub_topologies: Vec<SubTopology>,
    /// What each store holds (key-value, windows, sessions, a suppression buffer).
    pub(crate) store_kinds: BTreeMap<String, StoreKind>,
    /// The stores declared with a `Stores` builder: their serdes and changelog configs.
    pub(crate) store_declarations: BTreeMap<String, StoreDeclaration>,
    /// Global tables: store name -> the topic that fills it (see [`crate::global`]).
    pub(crate) global_tables: BTreeMap<String, String>,
    /// The stores kept on the heap.
    pub(crate) in_memory: BTreeSet<String>,
    /// Changelog topic configs asked for by a store's builder or `Materialized`.
    pub(crate) changelog_configs: BTreeMap<String, BTreeMap<String, String>>,
}

impl Topology {
    /// All nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Global tables: store name -> the topic that fills it.
    pub fn global_tables(&self) -> &BTreeMap<String, String> {
        &self.global_tables
    }

    /// The sub-topologies, in the order their first source was declared.
    pub fn sub_topologies(&self) -> &[SubTopology] {
        &self.sub_topologies
    }

    /// The sub-topology that reads `topic`, if any.
    pub fn sub_topology_of(&self, topic: &Topic) -> Option<&SubTopology> {
        self.sub_topologies
            .iter()
            .find(|s| s.sources.iter().any(|(t, _)| t == topic))
    }

    /// A raw record's event time as `topic`'s source settles it before the invalid-timestamp
    /// handler: its extractor's on the decoded record, else (or when it does not decode) the
    /// record timestamp.
    pub fn event_time(&self, topic: &Topic, raw: &RawRecord) -> i64 {
        let node = self
            .sub_topology_of(topic)
            .and_then(|s| s.sources.iter().find(|(t, _)| t == topic))
            .map(|(_, n)| &self.nodes[*n].kind);
        match node {
            Some(NodeKind::Source {
                decode,
                extract: Some(extract),
                ..
            }) => decode(raw).map_or(raw.timestamp, |r| extract(&r)),
            _ => raw.timestamp,
        }
    }

    /// Every topic a source reads.
    pub fn source_topics(&self) -> Vec<Topic> {
        self.sub_topologies
            .iter()
            .flat_map(|s| s.sources.iter().map(|(t, _)| t.clone()))
            .collect()
    }

    /// Adds the partition counts of the internal topics to `partitions` (the user topics' counts
    /// by name; internal topics are named for `application_id`). An internal topic read beside
    /// user topics (a re-keyed stream joining a table, a foreign-key join's topics) takes their
    /// count, so the sub-topology reading it is co-partitioned as in Kafka Streams; others take
    /// the largest count of the inputs of the sub-topology writing them. One may feed another,
    /// so this resolves until nothing changes.
    pub fn resolve_internal_partitions(
        &self,
        application_id: &str,
        partitions: &mut BTreeMap<String, u32>,
    ) {
        let internal = self.internal_topics();
        for _ in 0..=internal.len() {
            for (t, writer) in &internal {
                let max_of = |sources: &[(Topic, usize)], external: bool| {
                    sources
                        .iter()
                        .filter(|(s, _)| !external || !s.is_internal())
                        .filter_map(|(s, _)| partitions.get(&s.resolve(application_id)).copied())
                        .max()
                };
                let beside = self
                    .sub_topology_of(t)
                    .and_then(|reader| max_of(&reader.sources, true));
                let n = beside
                    .or_else(|| max_of(&self.sub_topologies[*writer].sources, false))
                    .unwrap_or(1);
                partitions.insert(t.resolve(application_id), n);
            }
        }
    }

    /// Every internal (repartition) topic, with the sub-topology that writes it.
    pub fn internal_topics(&self) -> BTreeMap<Topic, usize> {
        self.sub_topologies
            .iter()
            .flat_map(|s| {
                s.sinks
                    .iter()
                    .filter(|t| t.is_internal())
                    .map(move |t| (t.clone(), s.id))
            })
            .collect()
    }

    /// Stateful sub-topologies in which records of several source topics reach one internal
    /// topic (a table-table or stream-stream join, the foreign-key join, before a `group_by`):
    /// what they send there depends on the order they took their inputs in, which a replay
    /// after a crash under `at_least_once` may not repeat, and repartition de-duplication
    /// downstream would then keep outputs of two different orders. A stream-table join is not
    /// one: its table side sends nothing on.
    pub fn order_sensitive(&self) -> Vec<OrderSensitive> {
        let mut found = Vec::new();
        for sub in self.sub_topologies.iter().filter(|s| s.is_stateful()) {
            // Internal topic -> the source topics whose records reach it.
            let mut reached: BTreeMap<&Topic, Vec<&Topic>> = BTreeMap::new();
            for (source, node) in &sub.sources {
                let mut seen = vec![false; self.nodes.len()];
                let mut todo = vec![*node];
                while let Some(n) = todo.pop() {
                    if std::mem::replace(&mut seen[n], true) {
                        continue;
                    }
                    if let NodeKind::Sink { topic, .. } = &self.nodes[n].kind {
                        if topic.is_internal() {
                            reached.entry(topic).or_default().push(source);
                        }
                    }
                    todo.extend(self.nodes[n].children.iter().copied());
                }
            }
            let mut sources: Vec<Topic> = Vec::new();
            let mut internal_topics = Vec::new();
            for (topic, from) in reached.into_iter().filter(|(_, from)| from.len() > 1) {
                internal_topics.push(topic.clone());
                sources.extend(from.into_iter().cloned());
            }
            sources.sort();
            sources.dedup();
            if !internal_topics.is_empty() {
                found.push(OrderSensitive {
                    sub_topology: sub.id,
                    sources,
                    internal_topics,
                });
            }
        }
        found
    }

    /// What store `name` holds, if the topology has it.
    pub fn store_kind(&self, name: &str) -> Option<StoreKind> {
        self.store_kinds.get(name).copied()
    }

    /// What a `Stores` builder declared for store `name` (`None` for the DSL's stores).
    pub fn store_declaration(&self, name: &str) -> Option<&StoreDeclaration> {
        self.store_declarations.get(name)
    }

    /// Whether sub-topology `sub` has an async stage.
    pub fn has_async(&self, sub: usize) -> bool {
        self.sub_topologies[sub]
            .nodes
            .iter()
            .any(|&n| matches!(self.nodes[n].kind, NodeKind::Async { .. }))
    }

    /// Topics that a sub-topology with an async stage writes without passing the stage, with
    /// that stage: such a record is written when it starts, before its call completes and its
    /// offset can be committed (a transaction could hold the one without the other).
    pub fn outputs_before_async(&self) -> Vec<(Topic, String)> {
        let mut found = Vec::new();
        for sub in (0..self.sub_topologies.len()).filter(|&s| self.has_async(s)) {
            let sub = &self.sub_topologies[sub];
            let Some(stage) = sub
                .nodes
                .iter()
                .find(|&&n| matches!(self.nodes[n].kind, NodeKind::Async { .. }))
            else {
                continue;
            };
            let mut seen = vec![false; self.nodes.len()];
            let mut todo: Vec<usize> = sub.sources.iter().map(|(_, n)| *n).collect();
            while let Some(n) = todo.pop() {
                if std::mem::replace(&mut seen[n], true) {
                    continue;
                }
                match &self.nodes[n].kind {
                    NodeKind::Async { .. } => {}
                    NodeKind::Sink { topic, .. } => {
                        found.push((topic.clone(), self.nodes[*stage].name.clone()));
                    }
                    _ => todo.extend(self.nodes[n].children.iter().copied()),
                }
            }
        }
        found
    }

    /// The topic configs store `store`'s changelog is created with over rill's own
    /// (`StoreBuilder::with_logging_enabled`, `Materialized::with_logging_enabled`).
    pub fn changelog_configs(&self, store: &str) -> Option<&BTreeMap<String, String>> {
        self.changelog_configs.get(store)
    }

    /// The stores kept on the heap (built with an `in_memory_*` supplier).
    pub fn in_memory_stores(&self) -> Vec<String> {
        self.in_memory.iter().cloned().collect()
    }

    /// The stores whose changelog gets every write (built `with_caching_disabled`).
    pub fn uncached_stores(&self) -> Vec<String> {
        self.store_declarations
            .iter()
            .filter(|(_, d)| !d.caching_enabled())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Every store name.
    pub fn stores(&self) -> Vec<String> {
        self.sub_topologies
            .iter()
            .flat_map(|s| s.stores.iter().cloned())
            .collect()
    }

    /// A text description in Kafka Streams' `TopologyDescription` format (sub-topologies, then
    /// their sources, processors and sinks with successors `-->` and predecessors `<--`).
    /// Internal topics show as `<application.id>-<name>` (Kafka Streams prints `<name>`); an
    /// async stage is a `Processor` marked `async`.
    pub fn describe(&self) -> String {
        let names = |nodes: &[usize]| -> String {
            if nodes.is_empty() {
                "none".to_string()
            } else {
                nodes
                    .iter()
                    .map(|&n| self.nodes[n].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let mut parents: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            for &c in &node.children {
                parents[c].push(i);
            }
        }
        let mut out = String::from("Topologies:\n ");
        for s in &self.sub_topologies {
            out.push_str(&format!("  Sub-topology: {}\n", s.id));
            for &n in &s.nodes {
                let node = &self.nodes[n];
                let (after, before) = (names(&node.children), names(&parents[n]));
                let text = match &node.kind {
                    NodeKind::Source { topic, .. } => {
                        format!(
                            "Source: {} (topics: [{topic}])\n      --> {after}",
                            node.name
                        )
                    }
                    NodeKind::Processor { stores, .. } => format!(
                        "Processor: {} (stores: [{}])\n      --> {after}\n      <-- {before}",
                        node.name,
                        stores.join(", ")
                    ),
                    NodeKind::Async { .. } => format!(
                        "Processor: {} (async, stores: [])\n      --> {after}\n      <-- {before}",
                        node.name
                    ),
                    NodeKind::Sink { topic, .. } => {
                        format!("Sink: {} (topic: {topic})\n      <-- {before}", node.name)
                    }
                };
                out.push_str(&format!("    {text}\n"));
            }
            out.push('\n');
        }
        out
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}
