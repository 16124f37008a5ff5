//! [`StreamsBuilder`]: sources and stores, and `build`, which validates the graph and splits it
//! into sub-topologies.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use std::sync::Arc;

use super::change::{Change, ChangeSerde};
use super::table::TableSource;
use super::{
    decoder, table_decoder, Consumed, Draft, GraphBuilder, KStream, KTable, Materialized,
    TopologyError,
};
use crate::graph::{Extractor, Node, NodeKind, SubTopology, Supplier, Topic, Topology};
use crate::processor::{Datum, ErasedRecord, Typed};
use crate::serdes::Serde;
use crate::store::{StoreKind, VersionedStoreSpec};
use crate::stores::{StoreBuilder, StoreDeclaration};

/// Builds a topology with the DSL; the counterpart of Kafka Streams' `StreamsBuilder`.
///
/// The sources ([`stream`](Self::stream), [`table`](Self::table), `global_table`) return the
/// [`KStream`]s and [`KTable`]s that operations chain on; each operation adds nodes to the
/// builder, which clones share. [`build`](Self::build) checks the whole (a missing serde, a store
/// declared twice, a topic both read and written...) and splits it into sub-topologies at
/// repartition topics.
///
/// ```
/// use rill_topology::prelude::*;
///
/// let builder = StreamsBuilder::new();
/// let customers = builder.table("customers", StringSerde, StringSerde, "customers-by-id");
/// builder
///     .stream("orders", StringSerde, I64Serde)
///     .join(&customers, |cents, name| format!("{name}: {cents} cents"))
///     .to_with("named-orders", Produced::with(StringSerde, StringSerde));
/// let topology = builder.build()?;
/// assert_eq!(topology.stores(), vec!["customers-by-id".to_string()]);
/// # Ok::<(), TopologyError>(())
/// ```
#[derive(Clone, Default)]
pub struct StreamsBuilder {
    pub(super) inner: Rc<RefCell<GraphBuilder>>,
    /// What `add_state_store` declared beside each store's kind (serdes, changelog configs).
    declarations: Rc<RefCell<BTreeMap<String, StoreDeclaration>>>,
}

impl StreamsBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream of the records of `topic`, read with the given serdes (the short form of
    /// [`StreamsBuilder::stream_with`]).
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
        self.stream_with(topic, Consumed::with(key_serde, value_serde))
    }

    /// A stream of the records of `topic`, read as `consumed` says (Kafka Streams'
    /// `stream(topic, Consumed)`).
    pub fn stream_with<K, V>(&self, topic: &str, consumed: Consumed<K, V>) -> KStream<K, V>
    where
        K: Datum + Clone,
        V: Datum + Clone,
    {
        let Consumed {
            name,
            key_serde,
            value_serde,
            extractor,
            on_invalid,
        } = consumed;
        let extract = extractor.map(|f| -> Extractor {
            Arc::new(move |r: &ErasedRecord| {
                // `**k`: the boxed value, not the box (see `processor::Datum`).
                let key = r
                    .key
                    .as_ref()
                    .and_then(|k| (**k).as_any().downcast_ref::<K>());
                match (*r.value).as_any().downcast_ref::<V>() {
                    Some(value) => f(key, value, r.timestamp),
                    None => r.timestamp,
                }
            })
        });
        let node = {
            let mut g = self.inner.borrow_mut();
            let name = g.name_or_generated(name.as_deref(), "source");
            g.add(
                name,
                NodeKind::Source {
                    topic: Topic::External(topic.to_string()),
                    decode: decoder(key_serde.clone(), value_serde.clone()),
                    extract,
                    on_invalid,
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

    /// A table of the latest value of each key of `topic` (the short form of
    /// [`StreamsBuilder::table_with`]), kept in the store `materialized` names.
    pub fn table<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        materialized: impl Into<Materialized<K, V>>,
    ) -> KTable<K, V>
    where
        K: Datum + Clone,
        V: Datum + Clone,
    {
        self.table_with(topic, Consumed::with(key_serde, value_serde), materialized)
    }

    /// A table of the latest value of each key of `topic`, read as `consumed` says (Kafka
    /// Streams' `table(topic, Consumed, Materialized)`): each record upserts its key in the
    /// store `materialized` names, a record with a null value (a tombstone) deletes it, a record
    /// without a key is dropped and counted (`null_key`). The store restores from its own
    /// changelog (`<application.id>-<store>-changelog`), not from `topic`. The table's
    /// `to_stream` carries the upserts; deletions are not forwarded yet. With
    /// [`Materialized::versioned`] the store keeps each key's history: a record older than the
    /// key's latest version is stored as history and not forwarded, and one older than the
    /// history retention is dropped (`rill_discarded_records_total{reason="expired_version"}`).
    pub fn table_with<K, V>(
        &self,
        topic: &str,
        consumed: Consumed<K, V>,
        materialized: impl Into<Materialized<K, V>>,
    ) -> KTable<K, V>
    where
        K: Datum + Clone,
        V: Datum + Clone,
    {
        let Consumed {
            name,
            key_serde,
            value_serde,
            extractor,
            on_invalid,
        } = consumed;
        let materialized = materialized.into();
        // Read with `consumed`'s serdes; store (and join) with `materialized`'s when it has any.
        let decode = table_decoder(key_serde.clone(), value_serde.clone());
        let key_serde = materialized.key_serde.clone().unwrap_or(key_serde);
        let value_serde = materialized.value_serde.clone().unwrap_or(value_serde);
        let extract = extractor.map(|f| -> Extractor {
            Arc::new(move |r: &ErasedRecord| {
                let key = r
                    .key
                    .as_ref()
                    .and_then(|k| (**k).as_any().downcast_ref::<K>());
                match (*r.value).as_any().downcast_ref::<Option<V>>() {
                    Some(Some(value)) => f(key, value, r.timestamp),
                    _ => r.timestamp,
                }
            })
        });
        let mut g = self.inner.borrow_mut();
        let store = g.materialized_store(&materialized, "table-store");
        g.table_topics.insert(store.clone(), topic.to_string());
        let source_name = g.name_or_generated(name.as_deref(), "table-source");
        let source = g.add(
            source_name,
            NodeKind::Source {
                topic: Topic::External(topic.to_string()),
                decode,
                extract,
                on_invalid,
            },
            vec![],
        );
        drop(g);
        self.table_of(
            source,
            store,
            key_serde,
            value_serde,
            materialized.history_ms,
        )
    }

    /// The table kept in `store` of the `(K, Option<V>)` records of node `parent`: each upserts
    /// its key, a `None` deletes it (versioned with `history_ms`).
    pub(super) fn table_of<K, V>(
        &self,
        parent: usize,
        store: String,
        key_serde: Arc<dyn Serde<K>>,
        value_serde: Arc<dyn Serde<V>>,
        history_ms: Option<i64>,
    ) -> KTable<K, V>
    where
        K: Datum + Clone,
        V: Datum + Clone,
    {
        let (ks, vs) = (key_serde.clone(), value_serde.clone());
        let versioned = history_ms.map(|h| VersionedStoreSpec {
            history_retention_ms: h,
        });
        let mut g = self.inner.borrow_mut();
        let st = store.clone();
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, Option<V>, K, Change<V>>::new(TableSource {
                store: st.clone(),
                key_serde: ks.clone(),
                value_serde: vs.clone(),
                versioned: versioned.is_some(),
            }))
        });
        g.add_store(
            &store,
            versioned.map_or(StoreKind::KeyValue, StoreKind::Versioned),
        );
        let name = g.generated_name("table");
        let node = g.add(
            name,
            NodeKind::Processor {
                supplier,
                stores: vec![store.clone()],
            },
            vec![parent],
        );
        drop(g);
        let changes = KStream {
            builder: self.clone(),
            node,
            key_serde: Some(key_serde.clone()),
            value_serde: Some(
                Arc::new(ChangeSerde(value_serde.clone())) as Arc<dyn Serde<Change<V>>>
            ),
            key_changed: false,
        };
        let mut stream = changes.values_op("table-updates", |c: Change<V>| c.new);
        stream.value_serde = Some(value_serde);
        KTable {
            stream,
            store,
            window: None,
            versioned: versioned.is_some(),
            view: None,
            changes: Some(changes),
        }
    }

    /// Declares a store for processors added with [`KStream::process`] (Kafka Streams'
    /// `addStateStore`), built with [`crate::stores::Stores`]: its serdes stay with the
    /// declaration, so processors open it typed without them (`ctx.get_state_store::<K, V>`,
    /// `get_window_store`, `get_session_store`).
    pub fn add_state_store<K: 'static, V: 'static>(&self, builder: StoreBuilder<K, V>) -> &Self {
        let (name, kind, declaration) = builder.into_declaration();
        self.inner.borrow_mut().add_store(&name, kind);
        self.declarations.borrow_mut().insert(name, declaration);
        self
    }

    /// Validates the graph and returns the runnable topology.
    pub fn build(&self) -> Result<Topology, TopologyError> {
        let g = self.inner.borrow();
        if let Some(e) = g.errors.first() {
            return Err(e.clone());
        }
        // State beside an async stage: internal topics split them (see `async_stage`).
        let drafts = super::async_stage::split(g.nodes.clone(), &g)?;
        let nodes = link(&drafts);
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
                    if let Some(s) = stores.iter().find(|s| !g.stores.contains_key(*s)) {
                        return Err(TopologyError::UnknownStore {
                            node: n.name.clone(),
                            store: s.clone(),
                        });
                    }
                }
                NodeKind::Sink { .. } | NodeKind::Async { .. } => {}
            }
        }
        if source_topics.is_empty() {
            return Err(TopologyError::NoSource);
        }
        let declarations = self.declarations.borrow().clone();
        let mut sub_topologies = split_sub_topologies(&drafts, &nodes);
        for sub in &mut sub_topologies {
            sub.logged = sub
                .stores
                .iter()
                .filter(|s| {
                    !g.unlogged.contains(*s)
                        && declarations.get(*s).is_none_or(|d| d.logging_enabled())
                })
                .cloned()
                .collect();
        }
        Ok(Topology {
            nodes,
            sub_topologies,
            store_kinds: g.stores.clone(),
            in_memory: declarations
                .iter()
                .filter(|(_, d)| d.in_memory())
                .map(|(name, _)| name.clone())
                .chain(g.in_memory.iter().cloned())
                .collect(),
            changelog_configs: declarations
                .iter()
                .map(|(name, d)| (name.clone(), d.changelog_configs().clone()))
                .chain(g.changelog_configs.clone())
                .filter(|(_, configs)| !configs.is_empty())
                .collect(),
            store_declarations: declarations,
            global_tables: g.global_tables.clone(),
        })
    }
}

/// The nodes of `drafts`, each with its children.
pub(super) fn link(drafts: &[Draft]) -> Vec<Node> {
    let mut nodes: Vec<Node> = drafts
        .iter()
        .map(|d| Node {
            name: d.name.clone(),
            kind: d.kind.clone(),
            children: Vec::new(),
        })
        .collect();
    for (i, d) in drafts.iter().enumerate() {
        for &p in &d.parents {
            nodes[p].children.push(i);
        }
    }
    nodes
}

/// Groups nodes into connected components (edges and shared stores join them).
pub(super) fn split_sub_topologies(drafts: &[Draft], nodes: &[Node]) -> Vec<SubTopology> {
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
                logged: Vec::new(),
                nodes: members.clone(),
            };
            for &n in &members {
                match &nodes[n].kind {
                    NodeKind::Source { topic, .. } => sub.sources.push((topic.clone(), n)),
                    NodeKind::Sink { topic, .. } => sub.sinks.push(topic.clone()),
                    NodeKind::Async { .. } => {}
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
