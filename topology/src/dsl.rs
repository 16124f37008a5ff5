//! The streams DSL: `StreamsBuilder`, `KStream`, `KGroupedStream` and `KTable`, with the names
//! Kafka Streams users know.
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
//!     .group_by(|_key, word: &String| word.clone(), StringSerde, StringSerde)
//!     .count("counts-store")
//!     .to_stream()
//!     .to("streams-wordcount-output");
//! let topology = builder.build().unwrap();
//! assert_eq!(topology.sub_topologies().len(), 2);
//! ```
//!
//! Operations that change the key (`map`, `select_key`, `flat_map`) mark the stream; a following
//! `group_by_key` then writes to a repartition topic first, exactly like `group_by`, so that every
//! record of a key meets the same store.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use crate::graph::{Decoder, Encoder, Node, NodeKind, SubTopology, Supplier, Topic, Topology};
use crate::processor::{
    erase, unerase, Datum, ErasedProcessor, ErasedRecord, ProcessError, Processor, ProcessorHost,
    PunctuationType, Typed,
};
use crate::record::{RawRecord, Record};
use crate::serdes::{I64Serde, Serde, SerdeError};

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

type Pred<K, V> = Arc<dyn Fn(Option<&K>, &V) -> bool + Send + Sync>;

struct Draft {
    name: String,
    kind: NodeKind,
    parents: Vec<usize>,
}

#[derive(Default)]
struct GraphBuilder {
    nodes: Vec<Draft>,
    stores: BTreeSet<String>,
    names: BTreeSet<String>,
    counter: usize,
    errors: Vec<TopologyError>,
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

    fn add(&mut self, name: String, kind: NodeKind, parents: Vec<usize>) -> usize {
        self.claim_name(&name);
        self.nodes.push(Draft {
            name,
            kind,
            parents,
        });
        self.nodes.len() - 1
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Builds a topology with the DSL; the counterpart of Kafka Streams' `StreamsBuilder`.
#[derive(Clone, Default)]
pub struct StreamsBuilder {
    inner: Rc<RefCell<GraphBuilder>>,
}

impl StreamsBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream of the records of `topic`, read with the given serdes.
    pub fn stream<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> KStream<K, V>
    where
        K: Datum + Clone,
        V: Datum + Clone,
    {
        let key_serde: Arc<dyn Serde<K>> = Arc::new(key_serde);
        let value_serde: Arc<dyn Serde<V>> = Arc::new(value_serde);
        let node = {
            let mut g = self.inner.borrow_mut();
            let name = g.generated_name("source");
            g.add(
                name,
                NodeKind::Source {
                    topic: Topic::External(topic.to_string()),
                    decode: decoder(key_serde.clone(), value_serde.clone()),
                },
                vec![],
            )
        };
        KStream {
            builder: self.clone(),
            node,
            key_serde: Some(key_serde),
            value_serde: Some(value_serde),
            key_changed: false,
        }
    }

    /// Declares a key-value store for processors added with [`KStream::process`].
    pub fn add_state_store(&self, name: &str) -> &Self {
        let mut g = self.inner.borrow_mut();
        g.claim_name(name);
        g.stores.insert(name.to_string());
        self
    }

    /// Validates the graph and returns the runnable topology.
    pub fn build(&self) -> Result<Topology, TopologyError> {
        let g = self.inner.borrow();
        if let Some(e) = g.errors.first() {
            return Err(e.clone());
        }
        let mut nodes: Vec<Node> = g
            .nodes
            .iter()
            .map(|d| Node {
                name: d.name.clone(),
                kind: d.kind.clone(),
                children: Vec::new(),
            })
            .collect();
        for (i, d) in g.nodes.iter().enumerate() {
            for &p in &d.parents {
                nodes[p].children.push(i);
            }
        }
        let mut source_topics: BTreeMap<Topic, String> = BTreeMap::new();
        for n in &nodes {
            match &n.kind {
                NodeKind::Source { topic, .. } => {
                    if let Some(existing) = source_topics.insert(topic.clone(), n.name.clone()) {
                        return Err(TopologyError::DuplicateSourceTopic {
                            topic: topic.to_string(),
                            existing,
                        });
                    }
                }
                NodeKind::Processor { stores, .. } => {
                    if let Some(s) = stores.iter().find(|s| !g.stores.contains(*s)) {
                        return Err(TopologyError::UnknownStore {
                            node: n.name.clone(),
                            store: s.clone(),
                        });
                    }
                }
                NodeKind::Sink { .. } => {}
            }
        }
        if source_topics.is_empty() {
            return Err(TopologyError::NoSource);
        }
        let sub_topologies = split_sub_topologies(&g.nodes, &nodes);
        Ok(Topology {
            nodes,
            sub_topologies,
        })
    }
}

/// Groups nodes into connected components (edges and shared stores join them).
fn split_sub_topologies(drafts: &[Draft], nodes: &[Node]) -> Vec<SubTopology> {
    let mut parent: Vec<usize> = (0..nodes.len()).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let union = |parent: &mut Vec<usize>, a: usize, b: usize| {
        let (ra, rb) = (find(parent, a), find(parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    };
    for (i, d) in drafts.iter().enumerate() {
        for &p in &d.parents {
            union(&mut parent, p, i);
        }
    }
    let mut store_owner: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if let NodeKind::Processor { stores, .. } = &n.kind {
            for s in stores {
                match store_owner.get(s.as_str()) {
                    Some(&o) => union(&mut parent, o, i),
                    None => {
                        store_owner.insert(s, i);
                    }
                }
            }
        }
    }
    let mut by_root: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..nodes.len() {
        let r = find(&mut parent, i);
        by_root.entry(r).or_default().push(i);
    }
    by_root
        .into_values()
        .enumerate()
        .map(|(id, members)| {
            let mut sub = SubTopology {
                id,
                sources: Vec::new(),
                sinks: Vec::new(),
                stores: Vec::new(),
                nodes: members.clone(),
            };
            for &n in &members {
                match &nodes[n].kind {
                    NodeKind::Source { topic, .. } => sub.sources.push((topic.clone(), n)),
                    NodeKind::Sink { topic, .. } => sub.sinks.push(topic.clone()),
                    NodeKind::Processor { stores, .. } => {
                        for s in stores {
                            if !sub.stores.contains(s) {
                                sub.stores.push(s.clone());
                            }
                        }
                    }
                }
            }
            sub
        })
        .collect()
}

fn decoder<K: Datum, V: Datum>(key: Arc<dyn Serde<K>>, value: Arc<dyn Serde<V>>) -> Decoder {
    Arc::new(move |raw: &RawRecord| {
        let k = match &raw.key {
            Some(bytes) => Some(key.deserialize(bytes)?),
            None => None,
        };
        let v = match &raw.value {
            Some(bytes) => value.deserialize(bytes)?,
            None => {
                return Err(SerdeError::new(
                    "source",
                    "null value (tombstone) in a stream",
                ))
            }
        };
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
            value: Some(value.serialize(v)?),
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

/// A record stream; the counterpart of Kafka Streams' `KStream`.
pub struct KStream<K, V> {
    builder: StreamsBuilder,
    node: usize,
    key_serde: Option<Arc<dyn Serde<K>>>,
    value_serde: Option<Arc<dyn Serde<V>>>,
    key_changed: bool,
}

impl<K, V> Clone for KStream<K, V> {
    fn clone(&self) -> Self {
        KStream {
            builder: self.builder.clone(),
            node: self.node,
            key_serde: self.key_serde.clone(),
            value_serde: self.value_serde.clone(),
            key_changed: self.key_changed,
        }
    }
}

impl<K, V> KStream<K, V>
where
    K: Datum + Clone,
    V: Datum + Clone,
{
    fn stateless<K2: Datum + Clone, V2: Datum + Clone>(
        &self,
        op: &str,
        key_changed: bool,
        f: impl Fn(Record<K, V>, &mut dyn FnMut(Record<K2, V2>)) + Send + Sync + 'static,
    ) -> KStream<K2, V2> {
        let f = Arc::new(
            move |rec: ErasedRecord, host: &mut dyn ProcessorHost| -> Result<(), ProcessError> {
                let rec = unerase::<K, V>(rec)?;
                f(rec, &mut |out| host.forward(erase(out)));
                Ok(())
            },
        );
        let supplier: Supplier = Arc::new(move || Box::new(FnProcessor(f.clone())));
        self.add_processor(
            None,
            op,
            supplier,
            vec![],
            vec![self.node],
            self.key_changed || key_changed,
        )
    }

    /// Adds a processor node below `parents` (named `name`, or `<op>-<n>`) and returns its
    /// output stream, whose serdes are not known yet.
    fn add_processor<K2, V2>(
        &self,
        name: Option<&str>,
        op: &str,
        supplier: Supplier,
        stores: Vec<String>,
        parents: Vec<usize>,
        key_changed: bool,
    ) -> KStream<K2, V2> {
        let node = {
            let mut g = self.builder.inner.borrow_mut();
            let name = name.map_or_else(|| g.generated_name(op), str::to_string);
            g.add(name, NodeKind::Processor { supplier, stores }, parents)
        };
        KStream {
            builder: self.builder.clone(),
            node,
            key_serde: None,
            value_serde: None,
            key_changed,
        }
    }

    fn with_serdes<K2, V2>(
        mut next: KStream<K2, V2>,
        key: Option<Arc<dyn Serde<K2>>>,
        value: Option<Arc<dyn Serde<V2>>>,
    ) -> KStream<K2, V2> {
        next.key_serde = key;
        next.value_serde = value;
        next
    }

    /// Keeps records for which `predicate(key, value)` holds.
    pub fn filter(
        &self,
        predicate: impl Fn(Option<&K>, &V) -> bool + Send + Sync + 'static,
    ) -> KStream<K, V> {
        let next = self.stateless("filter", false, move |r, out| {
            if predicate(r.key.as_ref(), &r.value) {
                out(r)
            }
        });
        Self::with_serdes(next, self.key_serde.clone(), self.value_serde.clone())
    }

    /// Drops records for which `predicate(key, value)` holds.
    pub fn filter_not(
        &self,
        predicate: impl Fn(Option<&K>, &V) -> bool + Send + Sync + 'static,
    ) -> KStream<K, V> {
        self.filter(move |k, v| !predicate(k, v))
    }

    /// Replaces each value by `f(value)`; the key is unchanged (no repartition needed).
    pub fn map_values<V2: Datum + Clone>(
        &self,
        f: impl Fn(V) -> V2 + Send + Sync + 'static,
    ) -> KStream<K, V2> {
        self.values_op("map-values", move |v| std::iter::once(f(v)))
    }

    /// Replaces each value by zero or more values; the key is unchanged.
    pub fn flat_map_values<V2: Datum + Clone, I: IntoIterator<Item = V2>>(
        &self,
        f: impl Fn(V) -> I + Send + Sync + 'static,
    ) -> KStream<K, V2> {
        self.values_op("flat-map-values", f)
    }

    fn values_op<V2: Datum + Clone, I: IntoIterator<Item = V2>>(
        &self,
        op: &str,
        f: impl Fn(V) -> I + Send + Sync + 'static,
    ) -> KStream<K, V2> {
        let next = self.stateless(op, false, move |r, out| {
            let Record {
                key,
                value,
                timestamp,
                headers,
            } = r;
            let r = Record {
                key,
                value: (),
                timestamp,
                headers,
            };
            for v in f(value) {
                out(Record {
                    key: r.key.clone(),
                    value: v,
                    timestamp: r.timestamp,
                    headers: r.headers.clone(),
                })
            }
        });
        Self::with_serdes(next, self.key_serde.clone(), None)
    }

    /// Replaces key and value by `f(key, value)`; marks the stream for repartitioning.
    pub fn map<K2: Datum + Clone, V2: Datum + Clone>(
        &self,
        f: impl Fn(Option<K>, V) -> (K2, V2) + Send + Sync + 'static,
    ) -> KStream<K2, V2> {
        self.pairs_op("map", move |k, v| std::iter::once(f(k, v)))
    }

    /// Replaces each record by zero or more (key, value) pairs; marks the stream for repartitioning.
    pub fn flat_map<K2: Datum + Clone, V2: Datum + Clone, I: IntoIterator<Item = (K2, V2)>>(
        &self,
        f: impl Fn(Option<K>, V) -> I + Send + Sync + 'static,
    ) -> KStream<K2, V2> {
        self.pairs_op("flat-map", f)
    }

    fn pairs_op<K2: Datum + Clone, V2: Datum + Clone, I: IntoIterator<Item = (K2, V2)>>(
        &self,
        op: &str,
        f: impl Fn(Option<K>, V) -> I + Send + Sync + 'static,
    ) -> KStream<K2, V2> {
        self.stateless(op, true, move |r, out| {
            let Record {
                key,
                value,
                timestamp,
                headers,
            } = r;
            for (k, v) in f(key, value) {
                out(Record {
                    key: Some(k),
                    value: v,
                    timestamp,
                    headers: headers.clone(),
                })
            }
        })
    }

    /// Sets the key to `f(key, value)`; marks the stream for repartitioning.
    pub fn select_key<K2: Datum + Clone>(
        &self,
        f: impl Fn(Option<&K>, &V) -> K2 + Send + Sync + 'static,
    ) -> KStream<K2, V> {
        let next = self.stateless("select-key", true, move |r, out| {
            let k = f(r.key.as_ref(), &r.value);
            out(Record {
                key: Some(k),
                value: r.value,
                timestamp: r.timestamp,
                headers: r.headers,
            })
        });
        Self::with_serdes(next, None, self.value_serde.clone())
    }

    /// Calls `action(key, value)` for each record and passes it on unchanged.
    pub fn peek(&self, action: impl Fn(Option<&K>, &V) + Send + Sync + 'static) -> KStream<K, V> {
        let next = self.stateless("peek", false, move |r, out| {
            action(r.key.as_ref(), &r.value);
            out(r)
        });
        Self::with_serdes(next, self.key_serde.clone(), self.value_serde.clone())
    }

    /// Splits the stream: each record goes to the first branch whose predicate holds, or is
    /// dropped when none does (Kafka Streams' `split().branch(..)`).
    pub fn branch(&self, predicates: Vec<Pred<K, V>>) -> Vec<KStream<K, V>> {
        let predicates = Arc::new(predicates);
        (0..predicates.len())
            .map(|i| {
                let preds = predicates.clone();
                self.filter(move |k, v| preds.iter().position(|p| p(k, v)) == Some(i))
            })
            .collect()
    }

    /// Starts a `split`: add branches with [`Split::branch`], finish with [`Split::default_branch`]
    /// or [`Split::no_default_branch`].
    pub fn split(&self) -> Split<K, V> {
        Split {
            stream: self.clone(),
            branches: Vec::new(),
        }
    }

    /// Merges this stream with `other` (no order between the two is implied).
    pub fn merge(&self, other: &KStream<K, V>) -> KStream<K, V> {
        let f = Arc::new(|rec: ErasedRecord, host: &mut dyn ProcessorHost| {
            host.forward(rec);
            Ok(())
        });
        let supplier: Supplier = Arc::new(move || Box::new(FnProcessor(f.clone())));
        let merged = self.add_processor(
            None,
            "merge",
            supplier,
            vec![],
            vec![self.node, other.node],
            self.key_changed || other.key_changed,
        );
        Self::with_serdes(
            merged,
            self.key_serde.clone().or_else(|| other.key_serde.clone()),
            self.value_serde
                .clone()
                .or_else(|| other.value_serde.clone()),
        )
    }

    /// The stream's key and value serdes; records a build error naming `hint` when one is
    /// unknown (a type change upstream).
    fn serdes_or_error(&self, hint: &'static str) -> Option<SerdePair<K, V>> {
        if let (Some(k), Some(v)) = (self.key_serde.clone(), self.value_serde.clone()) {
            return Some((k, v));
        }
        let mut g = self.builder.inner.borrow_mut();
        let node = g.nodes[self.node].name.clone();
        let what = if self.key_serde.is_none() {
            "key"
        } else {
            "value"
        };
        g.errors
            .push(TopologyError::MissingSerde { node, what, hint });
        None
    }

    /// Writes the stream to `topic` with the stream's serdes (see [`KStream::to_with`]).
    pub fn to(&self, topic: &str) {
        let Some((k, v)) = self.serdes_or_error("KStream::to_with") else {
            return;
        };
        self.add_sink(Topic::External(topic.to_string()), k, v);
    }

    /// Writes the stream to `topic` with the given serdes.
    pub fn to_with(&self, topic: &str, key_serde: impl Serde<K>, value_serde: impl Serde<V>) {
        self.add_sink(
            Topic::External(topic.to_string()),
            Arc::new(key_serde),
            Arc::new(value_serde),
        );
    }

    fn add_sink(&self, topic: Topic, k: Arc<dyn Serde<K>>, v: Arc<dyn Serde<V>>) -> usize {
        let mut g = self.builder.inner.borrow_mut();
        let name = g.generated_name("sink");
        g.add(
            name,
            NodeKind::Sink {
                topic,
                encode: encoder(k, v),
            },
            vec![self.node],
        )
    }

    /// Runs a user [`Processor`] made by `supplier` for each sub-task, with access to `stores`.
    pub fn process<K2, V2, P>(
        &self,
        name: &str,
        supplier: impl Fn() -> P + Send + Sync + 'static,
        stores: &[&str],
    ) -> KStream<K2, V2>
    where
        K2: Datum + Clone,
        V2: Datum + Clone,
        P: Processor<K, V, K2, V2> + 'static,
    {
        let supplier: Supplier =
            Arc::new(move || Box::new(Typed::<P, K, V, K2, V2>::new(supplier())));
        let stores = stores.iter().map(|s| s.to_string()).collect();
        self.add_processor(
            Some(name),
            "process",
            supplier,
            stores,
            vec![self.node],
            true,
        )
    }

    /// Writes the stream through the internal topic `<application.id>-<name>-repartition` and
    /// reads it back, so that records are partitioned by their current key (Kafka Streams'
    /// `repartition(Repartitioned.as(name))`); needs the stream's serdes.
    pub fn repartition(&self, name: &str) -> KStream<K, V> {
        let Some((k, v)) = self.serdes_or_error("KStream::repartition_with") else {
            return self.clone();
        };
        let topic = Topic::Internal(format!("{name}-repartition"));
        self.add_sink(topic.clone(), k.clone(), v.clone());
        let node = {
            let mut g = self.builder.inner.borrow_mut();
            g.claim_name(name);
            g.add(
                format!("{name}-repartition-source"),
                NodeKind::Source {
                    topic,
                    decode: decoder(k.clone(), v.clone()),
                },
                vec![],
            )
        };
        KStream {
            builder: self.builder.clone(),
            node,
            key_serde: Some(k),
            value_serde: Some(v),
            key_changed: false,
        }
    }

    /// [`KStream::repartition`] with explicit serdes (needed after a key or value type change).
    pub fn repartition_with(
        &self,
        name: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> KStream<K, V> {
        let mut stream = self.clone();
        stream.key_serde = Some(Arc::new(key_serde));
        stream.value_serde = Some(Arc::new(value_serde));
        stream.repartition(name)
    }

    /// Groups by the current key; repartitions first if an upstream operation changed the key.
    pub fn group_by_key(&self) -> KGroupedStream<K, V> {
        KGroupedStream {
            stream: self.clone(),
            repartition: self.key_changed,
        }
    }

    /// Groups by the current key with explicit serdes (needed after a key or value type change).
    pub fn group_by_key_with(
        &self,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> KGroupedStream<K, V> {
        let mut stream = self.clone();
        stream.key_serde = Some(Arc::new(key_serde));
        stream.value_serde = Some(Arc::new(value_serde));
        KGroupedStream {
            repartition: stream.key_changed,
            stream,
        }
    }

    /// Groups by a new key `f(key, value)`: records are repartitioned by the new key.
    pub fn group_by<K2: Datum + Clone>(
        &self,
        f: impl Fn(Option<&K>, &V) -> K2 + Send + Sync + 'static,
        key_serde: impl Serde<K2>,
        value_serde: impl Serde<V>,
    ) -> KGroupedStream<K2, V> {
        let mut stream = self.select_key(f);
        stream.key_serde = Some(Arc::new(key_serde));
        stream.value_serde = Some(Arc::new(value_serde));
        KGroupedStream {
            stream,
            repartition: true,
        }
    }
}

/// Branches being added to a split stream; the counterpart of Kafka Streams' `BranchedKStream`.
pub struct Split<K, V> {
    stream: KStream<K, V>,
    branches: Vec<(String, Pred<K, V>)>,
}

impl<K: Datum + Clone, V: Datum + Clone> Split<K, V> {
    /// Adds a branch called `name` for records where `predicate` holds (first match wins).
    pub fn branch(
        mut self,
        name: &str,
        predicate: impl Fn(Option<&K>, &V) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.branches.push((name.to_string(), Arc::new(predicate)));
        self
    }

    /// Finishes with a branch called `name` for records no predicate matched.
    pub fn default_branch(mut self, name: &str) -> BTreeMap<String, KStream<K, V>> {
        self.branches
            .push((name.to_string(), Arc::new(|_: Option<&K>, _: &V| true)));
        self.no_default_branch()
    }

    /// Finishes; records no predicate matched are dropped.
    pub fn no_default_branch(self) -> BTreeMap<String, KStream<K, V>> {
        let (names, preds): (Vec<String>, Vec<Pred<K, V>>) = self.branches.into_iter().unzip();
        names.into_iter().zip(self.stream.branch(preds)).collect()
    }
}

/// A stream grouped by key, ready for an aggregation; the counterpart of `KGroupedStream`.
pub struct KGroupedStream<K, V> {
    stream: KStream<K, V>,
    repartition: bool,
}

/// The aggregation step of a `count`, `reduce` or `aggregate`.
type AggregateFn<K, V, A> = Arc<dyn Fn(&K, V, Option<A>) -> A + Send + Sync>;

struct AggregateProcessor<K, V, A> {
    store: String,
    key_serde: Arc<dyn Serde<K>>,
    agg_serde: Arc<dyn Serde<A>>,
    step: AggregateFn<K, V, A>,
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> Processor<K, V, K, A>
    for AggregateProcessor<K, V, A>
{
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut crate::processor::ProcessorContext<'_, K, A>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            // As in Kafka Streams: an aggregation cannot place a record without a key.
            ctx.record_dropped("null_key");
            return Ok(());
        };
        let key_bytes = self.key_serde.serialize(&key)?;
        let store = ctx.store(&self.store)?;
        let old = match store.get(&key_bytes)? {
            Some(bytes) => Some(self.agg_serde.deserialize(&bytes)?),
            None => None,
        };
        let new = (self.step)(&key, record.value, old);
        let bytes = self.agg_serde.serialize(&new)?;
        ctx.store(&self.store)?.put(&key_bytes, &bytes)?;
        ctx.forward(Record {
            key: Some(key),
            value: new,
            timestamp: record.timestamp,
            headers: record.headers,
        });
        Ok(())
    }
}

impl<K: Datum + Clone, V: Datum + Clone> KGroupedStream<K, V> {
    /// Counts records per key in the store `store`.
    pub fn count(&self, store: &str) -> KTable<K, i64> {
        self.aggregate_with(store, I64Serde, |_k, _v, old: Option<i64>| {
            old.unwrap_or(0) + 1
        })
    }

    /// Combines the values of each key with `reducer(aggregate, value)` in the store `store`.
    pub fn reduce(
        &self,
        store: &str,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
    ) -> KTable<K, V> {
        let Some(serde) = self.stream.value_serde.clone() else {
            self.missing_serde("value", "KStream::group_by_key_with");
            return self.aggregate_with(store, NoSerde, move |_k, v, old| match old {
                Some(a) => reducer(a, v),
                None => v,
            });
        };
        self.aggregate_with(store, ArcSerde(serde), move |_k, v, old| match old {
            Some(a) => reducer(a, v),
            None => v,
        })
    }

    /// Folds the values of each key into an aggregate: `initializer()` for a new key, then
    /// `aggregator(key, value, aggregate)`, kept in the store `store` with `agg_serde`.
    pub fn aggregate<A: Datum + Clone>(
        &self,
        store: &str,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        agg_serde: impl Serde<A>,
    ) -> KTable<K, A> {
        self.aggregate_with(store, agg_serde, move |k, v, old| {
            aggregator(k, v, old.unwrap_or_else(&initializer))
        })
    }

    fn missing_serde(&self, what: &'static str, hint: &'static str) {
        let mut g = self.stream.builder.inner.borrow_mut();
        let node = g.nodes[self.stream.node].name.clone();
        g.errors
            .push(TopologyError::MissingSerde { node, what, hint });
    }

    fn aggregate_with<A: Datum + Clone>(
        &self,
        store: &str,
        agg_serde: impl Serde<A>,
        step: impl Fn(&K, V, Option<A>) -> A + Send + Sync + 'static,
    ) -> KTable<K, A> {
        let agg_serde: Arc<dyn Serde<A>> = Arc::new(agg_serde);
        let Some(key_serde) = self.stream.key_serde.clone() else {
            self.missing_serde("key", "KStream::group_by_key_with or group_by");
            return self.dangling_table(store, agg_serde);
        };
        let mut parent = self.stream.node;
        if self.repartition {
            let Some(value_serde) = self.stream.value_serde.clone() else {
                self.missing_serde("value", "KStream::group_by_key_with or group_by");
                return self.dangling_table(store, agg_serde);
            };
            let topic = Topic::Internal(format!("{store}-repartition"));
            self.stream
                .add_sink(topic.clone(), key_serde.clone(), value_serde.clone());
            let mut g = self.stream.builder.inner.borrow_mut();
            let name = format!("{store}-repartition-source");
            parent = g.add(
                name,
                NodeKind::Source {
                    topic,
                    decode: decoder(key_serde.clone(), value_serde),
                },
                vec![],
            );
        }
        let step: AggregateFn<K, V, A> = Arc::new(step);
        let (store_name, ks, aserde) = (store.to_string(), key_serde.clone(), agg_serde.clone());
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, K, A>::new(AggregateProcessor {
                store: store_name.clone(),
                key_serde: ks.clone(),
                agg_serde: aserde.clone(),
                step: step.clone(),
            }))
        });
        let node = {
            let mut g = self.stream.builder.inner.borrow_mut();
            g.claim_name(store);
            g.stores.insert(store.to_string());
            let name = g.generated_name("aggregate");
            g.add(
                name,
                NodeKind::Processor {
                    supplier,
                    stores: vec![store.to_string()],
                },
                vec![parent],
            )
        };
        KTable {
            stream: KStream {
                builder: self.stream.builder.clone(),
                node,
                key_serde: Some(key_serde),
                value_serde: Some(agg_serde),
                key_changed: false,
            },
            store: store.to_string(),
        }
    }

    /// A table that build() will reject (an error was recorded), so chaining can go on.
    fn dangling_table<A: Datum + Clone>(
        &self,
        store: &str,
        agg: Arc<dyn Serde<A>>,
    ) -> KTable<K, A> {
        KTable {
            stream: KStream {
                builder: self.stream.builder.clone(),
                node: self.stream.node,
                key_serde: None,
                value_serde: Some(agg),
                key_changed: false,
            },
            store: store.to_string(),
        }
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

/// A stream's key and value serdes.
type SerdePair<K, V> = (Arc<dyn Serde<K>>, Arc<dyn Serde<V>>);

/// A shared serde used as an owned one.
struct ArcSerde<T>(Arc<dyn Serde<T>>);
impl<T: 'static> Serde<T> for ArcSerde<T> {
    fn serialize(&self, v: &T) -> Result<Vec<u8>, SerdeError> {
        self.0.serialize(v)
    }
    fn deserialize(&self, b: &[u8]) -> Result<T, SerdeError> {
        self.0.deserialize(b)
    }
}

/// The changelog of an aggregation, keyed like its store; the counterpart of `KTable`.
pub struct KTable<K, V> {
    stream: KStream<K, V>,
    store: String,
}

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// The stream of updates: one record per change, carrying the new value.
    pub fn to_stream(&self) -> KStream<K, V> {
        self.stream.clone()
    }

    /// The name of the store that materializes the table.
    pub fn store_name(&self) -> &str {
        &self.store
    }
}
