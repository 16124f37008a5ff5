//! [`KStream`], a record stream, and [`Split`], its branches.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use super::{
    decoder, encoder, FnProcessor, Grouped, KGroupedStream, KTable, Materialized, Named, Pred,
    Produced, Repartitioned, StreamsBuilder,
};
use crate::graph::{Encoder, NodeKind, Supplier, Topic};
use crate::processor::{
    erase, unerase, Datum, ErasedRecord, FixedKeyProcessor, FixedKeyTyped, ProcessError, Processor,
    ProcessorHost, Typed,
};
use crate::record::Record;
use crate::serdes::Serde;
use crate::time::OnInvalidTimestamp;

/// A key serde and a value serde.
type SerdePair<K, V> = (Arc<dyn Serde<K>>, Arc<dyn Serde<V>>);

/// A record stream; the counterpart of Kafka Streams' `KStream`.
///
/// Stateless operations (`filter`, `map_values`, `flat_map_values`, `select_key`, `peek`,
/// `split`, `merge`) return another stream; `group_by_key` and `group_by` lead to aggregations
/// ([`KGroupedStream`]); `join` and `left_join` enrich from a table, `process` and
/// `process_values` run a [`Processor`], and `to` writes to a topic. An operation that changes
/// the key marks the stream: the next grouping or join reads it back from a repartition topic,
/// so that each key meets its state in one place.
///
/// ```
/// use rill_topology::prelude::*;
///
/// let builder = StreamsBuilder::new();
/// builder
///     .stream("page-views", StringSerde, StringSerde) // key: user, value: page
///     .filter(|_user, page| !page.starts_with("/static/"))
///     .select_key(|_user, page| page.clone()) // now keyed by page: repartition
///     .group_by_key_with(Grouped::with(StringSerde, StringSerde)) // the new key's serde
///     .count("views-per-page")
///     .to_stream()
///     .to("page-view-counts");
/// let topology = builder.build()?;
/// assert_eq!(topology.sub_topologies().len(), 2); // before and after the repartition topic
/// assert_eq!(topology.internal_topics().len(), 1);
/// # Ok::<(), TopologyError>(())
/// ```
pub struct KStream<K, V> {
    pub(super) builder: StreamsBuilder,
    /// The node whose outputs this stream carries.
    pub(super) node: usize,
    pub(super) key_serde: Option<Arc<dyn Serde<K>>>,
    pub(super) value_serde: Option<Arc<dyn Serde<V>>>,
    /// An upstream operation changed the key: grouping must repartition.
    pub(super) key_changed: bool,
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
    pub(super) fn stateless<K2: Datum + Clone, V2: Datum + Clone>(
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
    pub(super) fn add_processor<K2, V2>(
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
            let name = g.name_or_generated(name, op);
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

    pub(super) fn values_op<V2: Datum + Clone, I: IntoIterator<Item = V2>>(
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

    /// Writes the stream to `topic` with the stream's serdes (see [`KStream::to_with`]).
    pub fn to(&self, topic: &str) {
        self.to_with(topic, Produced::default());
    }

    /// Writes the stream to `topic` as `produced` says (Kafka Streams' `to(topic, Produced)`);
    /// serdes it leaves unset are the stream's.
    pub fn to_with(&self, topic: &str, produced: impl Into<Produced<K, V>>) {
        let Produced {
            name,
            key_serde,
            value_serde,
        } = produced.into();
        let Some((k, v)) = self.serdes_or_error(key_serde, value_serde, "KStream::to_with") else {
            return;
        };
        self.add_sink(name.as_deref(), Topic::External(topic.to_string()), k, v);
    }

    /// Adds a sink node writing this stream to `topic`.
    pub(super) fn add_sink(
        &self,
        name: Option<&str>,
        topic: Topic,
        k: Arc<dyn Serde<K>>,
        v: Arc<dyn Serde<V>>,
    ) -> usize {
        self.add_encoded_sink(name, topic, encoder(k, v))
    }

    /// Adds a sink node writing this stream to `topic` through `encode`.
    pub(super) fn add_encoded_sink(
        &self,
        name: Option<&str>,
        topic: Topic,
        encode: Encoder,
    ) -> usize {
        let mut g = self.builder.inner.borrow_mut();
        let name = g.name_or_generated(name, "sink");
        g.add(name, NodeKind::Sink { topic, encode }, vec![self.node])
    }

    /// The given serdes, else the stream's; records a [`super::TopologyError::MissingSerde`]
    /// naming `hint` when one is unknown.
    pub(super) fn serdes_or_error(
        &self,
        key: Option<Arc<dyn Serde<K>>>,
        value: Option<Arc<dyn Serde<V>>>,
        hint: &'static str,
    ) -> Option<SerdePair<K, V>> {
        let key = key.or_else(|| self.key_serde.clone());
        let value = value.or_else(|| self.value_serde.clone());
        match (key, value) {
            (Some(k), Some(v)) => Some((k, v)),
            (k, _) => {
                let what = if k.is_none() { "key" } else { "value" };
                self.builder
                    .inner
                    .borrow_mut()
                    .missing_serde(self.node, what, hint);
                None
            }
        }
    }

    /// Writes this stream to the internal topic `<name>-repartition` and returns the source node
    /// that reads it back.
    pub(super) fn through_repartition_topic(
        &self,
        name: &str,
        k: Arc<dyn Serde<K>>,
        v: Arc<dyn Serde<V>>,
    ) -> usize {
        let topic = Topic::Internal(format!("{name}-repartition"));
        self.add_sink(None, topic.clone(), k.clone(), v.clone());
        let mut g = self.builder.inner.borrow_mut();
        g.add(
            format!("{name}-repartition-source"),
            NodeKind::Source {
                topic,
                decode: decoder(k, v),
                // Repartitioned records carry the event time their upstream settled.
                extract: None,
                on_invalid: OnInvalidTimestamp::default(),
            },
            vec![],
        )
    }

    /// Runs a user [`Processor`] made by `supplier` for each sub-task, with access to `stores`.
    pub fn process<K2, V2, P>(
        &self,
        name: impl Into<Named>,
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
            Some(name.into().name()),
            "process",
            supplier,
            stores,
            vec![self.node],
            true,
        )
    }

    /// Runs a user [`FixedKeyProcessor`] made by `supplier` for each sub-task, with access to
    /// `stores` (Kafka Streams' `processValues`): it may change values, never keys, so a
    /// grouping or join after it needs no repartition topic.
    pub fn process_values<V2, P>(
        &self,
        name: impl Into<Named>,
        supplier: impl Fn() -> P + Send + Sync + 'static,
        stores: &[&str],
    ) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        P: FixedKeyProcessor<K, V, V2> + 'static,
    {
        let supplier: Supplier =
            Arc::new(move || Box::new(FixedKeyTyped::<P, K, V, V2>::new(supplier())));
        let stores = stores.iter().map(|s| s.to_string()).collect();
        let next = self.add_processor(
            Some(name.into().name()),
            "process-values",
            supplier,
            stores,
            vec![self.node],
            self.key_changed,
        );
        Self::with_serdes(next, self.key_serde.clone(), None)
    }

    /// Writes the stream through the internal topic `<application.id>-<name>-repartition` and
    /// reads it back, so that records are partitioned by their current key (Kafka Streams'
    /// `repartition(Repartitioned.as(name))`); `repartition("by-user")` is the short form.
    pub fn repartition(&self, repartitioned: impl Into<Repartitioned<K, V>>) -> KStream<K, V> {
        let Repartitioned {
            name,
            key_serde,
            value_serde,
        } = repartitioned.into();
        let hint = "Repartitioned::with, or KStream::group_by_key_with before repartition";
        let Some((k, v)) = self.serdes_or_error(key_serde, value_serde, hint) else {
            return self.clone();
        };
        let name = {
            let mut g = self.builder.inner.borrow_mut();
            let name = g.name_or_generated(name.as_deref(), "repartition");
            g.claim_name(&name);
            name
        };
        let node = self.through_repartition_topic(&name, k.clone(), v.clone());
        KStream {
            builder: self.builder.clone(),
            node,
            key_serde: Some(k),
            value_serde: Some(v),
            key_changed: false,
        }
    }

    /// The table of the latest value of each key of this stream (Kafka Streams'
    /// `toTable(Materialized)`): each record upserts its key in the store `materialized` names
    /// (with its serdes, default the stream's), as [`StreamsBuilder::table`] does for a topic.
    /// After a key change upstream the records go through `<application.id>-<store>-repartition`
    /// first, so each key lands in one task.
    pub fn to_table(&self, materialized: impl Into<Materialized<K, V>>) -> KTable<K, V> {
        let materialized = materialized.into();
        let hint = "Materialized::with(key_serde, value_serde), or KStream::group_by_key_with";
        let store = self
            .builder
            .inner
            .borrow_mut()
            .materialized_store(&materialized, "to-table-store");
        let Some((k, v)) = self.serdes_or_error(
            materialized.key_serde.clone(),
            materialized.value_serde.clone(),
            hint,
        ) else {
            return self.builder.table_of(
                self.node,
                store,
                Arc::new(super::NoSerde),
                Arc::new(super::NoSerde),
                None,
            );
        };
        let upstream = if self.key_changed {
            KStream {
                builder: self.builder.clone(),
                node: self.through_repartition_topic(&store, k.clone(), v.clone()),
                key_serde: Some(k.clone()),
                value_serde: Some(v.clone()),
                key_changed: false,
            }
        } else {
            self.clone()
        };
        let upserts = upstream.values_op("to-table", |v: V| Some(Some(v)));
        self.builder
            .table_of(upserts.node, store, k, v, materialized.history_ms)
    }

    /// Groups by the current key; repartitions first if an upstream operation changed the key.
    pub fn group_by_key(&self) -> KGroupedStream<K, V> {
        self.group_by_key_with(Grouped::default())
    }

    /// Groups by the current key as `grouped` says: serdes (needed after a key or value type
    /// change) and the name of the repartition topic (Kafka Streams' `groupByKey(Grouped)`).
    pub fn group_by_key_with(&self, grouped: impl Into<Grouped<K, V>>) -> KGroupedStream<K, V> {
        let repartition = self.key_changed;
        self.grouped(self.clone(), grouped.into(), repartition)
    }

    /// Groups by a new key `key(key, value)`: records are repartitioned by the new key; `grouped`
    /// gives the new key's serde (Kafka Streams' `groupBy(selector, Grouped.with(..))`).
    pub fn group_by<K2: Datum + Clone>(
        &self,
        key: impl Fn(Option<&K>, &V) -> K2 + Send + Sync + 'static,
        grouped: impl Into<Grouped<K2, V>>,
    ) -> KGroupedStream<K2, V> {
        self.grouped(self.select_key(key), grouped.into(), true)
    }

    fn grouped<K2: Datum + Clone>(
        &self,
        mut stream: KStream<K2, V>,
        grouped: Grouped<K2, V>,
        repartition: bool,
    ) -> KGroupedStream<K2, V> {
        let Grouped {
            name,
            key_serde,
            value_serde,
        } = grouped;
        stream.key_serde = key_serde.or(stream.key_serde);
        stream.value_serde = value_serde.or(stream.value_serde);
        KGroupedStream {
            stream,
            repartition,
            name,
            repartitioned: Rc::new(Cell::new(None)),
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
        let preds = Arc::new(preds);
        names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let preds = preds.clone();
                let branch = self
                    .stream
                    .filter(move |k, v| preds.iter().position(|p| p(k, v)) == Some(i));
                (name, branch)
            })
            .collect()
    }
}
