//! [`KGroupedStream`] and its aggregations: `count`, `reduce`, `aggregate`, each kept in a store
//! that [`Materialized`] names.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use super::{KStream, KTable, Materialized, NoSerde, TopologyError};
use crate::graph::{NodeKind, Supplier};
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::Record;
use crate::serdes::{I64Serde, Serde};
use crate::store::StoreKind;

/// A stream grouped by key, ready for an aggregation; the counterpart of `KGroupedStream`.
///
/// Each aggregation ([`count`](Self::count), [`reduce`](Self::reduce),
/// [`aggregate`](Self::aggregate), or windowed after `windowed_by`) keeps one value per key in
/// a store, restored from its changelog topic, and returns the [`KTable`] of those values. An
/// aggregate of another type than the values needs its serde
/// ([`Materialized::with`](super::Materialized::with)).
///
/// ```
/// use rill_topology::prelude::*;
///
/// let builder = StreamsBuilder::new();
/// let orders = builder.stream("orders", StringSerde, I64Serde).group_by_key();
/// orders.count("orders-per-customer");
/// orders.reduce(|a, b| a.max(b), "largest-order");
/// orders.aggregate(
///     || (0_i64, 0_i64),
///     |_customer, cents, (n, sum)| (n + 1, sum + cents),
///     Materialized::with(StringSerde, JsonSerde::<(i64, i64)>::new()).with_name("count-and-sum"),
/// );
/// let topology = builder.build()?;
/// assert_eq!(topology.stores().len(), 3);
/// # Ok::<(), TopologyError>(())
/// ```
pub struct KGroupedStream<K, V> {
    pub(super) stream: KStream<K, V>,
    /// The key changed upstream: aggregations read the records back from a repartition topic.
    pub(super) repartition: bool,
    /// The [`super::Grouped`] name: one repartition topic shared by every aggregation.
    pub(super) name: Option<String>,
    /// The source node of that shared topic, once the first aggregation created it.
    pub(super) repartitioned: Rc<Cell<Option<usize>>>,
}

/// The aggregation step of a `count`, `reduce` or `aggregate`: the new aggregate from a value
/// and the old aggregate (`None`: the key has none any more; its entry is deleted).
pub(super) type AggregateFn<K, V, A> = Arc<dyn Fn(&K, V, Option<A>) -> Option<A> + Send + Sync>;

/// What `KGroupedStream::resolve` hands back when a serde is missing: the store name and the
/// value serde to chain on with (the error itself is recorded on the builder).
pub(super) type Unresolved<A> = (String, Arc<dyn Serde<A>>);

/// An aggregation's store, serdes and input node, resolved from its [`Materialized`].
pub(super) struct Resolved<K, A> {
    pub store: String,
    /// The grouping key's serde (the store's key serde when `Materialized` sets one).
    pub key_serde: Arc<dyn Serde<K>>,
    pub agg_serde: Arc<dyn Serde<A>>,
    /// The node the aggregation reads from.
    pub parent: usize,
    /// `Materialized::with_retention`, for window stores.
    pub retention_ms: Option<i64>,
    /// Whether updates go through the record cache (`Materialized::with_caching_disabled`).
    pub cached: bool,
}

impl<K, V> Clone for KGroupedStream<K, V> {
    fn clone(&self) -> Self {
        KGroupedStream {
            stream: self.stream.clone(),
            repartition: self.repartition,
            name: self.name.clone(),
            repartitioned: self.repartitioned.clone(),
        }
    }
}

pub(super) struct AggregateProcessor<K, V, A> {
    pub store: String,
    pub key_serde: Arc<dyn Serde<K>>,
    pub agg_serde: Arc<dyn Serde<A>>,
    pub step: AggregateFn<K, V, A>,
    /// Updates go through the record cache (not when several nodes update one store: their
    /// cached updates of a key could leave in another order than they were made).
    pub cached: bool,
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> Processor<K, V, K, A>
    for AggregateProcessor<K, V, A>
{
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut ProcessorContext<'_, K, A>,
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
        let Some(new) = (self.step)(&key, record.value, old) else {
            // Only a table aggregation's retraction of a value it never added gets here.
            ctx.store(&self.store)?.delete(&key_bytes)?;
            return Ok(());
        };
        let bytes = self.agg_serde.serialize(&new)?;
        ctx.store(&self.store)?.put(&key_bytes, &bytes)?;
        let size = key_bytes.len() + bytes.len();
        let out = Record {
            key: Some(key),
            value: new,
            timestamp: record.timestamp,
            headers: record.headers,
        };
        if self.cached {
            ctx.forward_cached(key_bytes, size, out);
        } else {
            ctx.forward(out);
        }
        Ok(())
    }
}

/// Where a `build` error points users who lack a serde for an aggregation.
pub(super) const SERDE_HINT: &str =
    "Grouped::with in group_by / group_by_key_with, or Materialized::with";

impl<K: Datum + Clone, V: Datum + Clone> KGroupedStream<K, V> {
    /// Counts records per key in the store `materialized` names (`count("counts")`).
    pub fn count(&self, materialized: impl Into<Materialized<K, i64>>) -> KTable<K, i64> {
        self.aggregate_with(
            materialized.into(),
            Some(Arc::new(I64Serde)),
            |_k, _v, old: Option<i64>| Some(old.unwrap_or(0) + 1),
        )
    }

    /// Combines the values of each key with `reducer(aggregate, value)` in the store
    /// `materialized` names (Kafka Streams' `reduce(Reducer, Materialized)`).
    pub fn reduce(
        &self,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, V>>,
    ) -> KTable<K, V> {
        let values = self.stream.value_serde.clone();
        self.aggregate_with(materialized.into(), values, move |_k, v, old| {
            Some(match old {
                Some(a) => reducer(a, v),
                None => v,
            })
        })
    }

    /// Folds the values of each key into an aggregate: `initializer()` for a new key, then
    /// `aggregator(key, value, aggregate)`, kept in the store `materialized` names with its
    /// value serde (Kafka Streams' `aggregate(Initializer, Aggregator, Materialized)`:
    /// `Materialized::with(key_serde, agg_serde).with_name("totals")`; `build` fails without
    /// the value serde).
    pub fn aggregate<A: Datum + Clone>(
        &self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, A>>,
    ) -> KTable<K, A> {
        self.aggregate_with(materialized.into(), None, move |k, v, old| {
            Some(aggregator(k, v, old.unwrap_or_else(&initializer)))
        })
    }

    pub(super) fn missing_serde(&self, what: &'static str) {
        self.stream
            .builder
            .inner
            .borrow_mut()
            .missing_serde(self.stream.node, what, SERDE_HINT);
    }

    pub(super) fn aggregate_with<A: Datum + Clone>(
        &self,
        materialized: Materialized<K, A>,
        agg_serde: Option<Arc<dyn Serde<A>>>,
        step: impl Fn(&K, V, Option<A>) -> Option<A> + Send + Sync + 'static,
    ) -> KTable<K, A> {
        let r = match self.resolve(materialized, agg_serde, "aggregate-store") {
            Ok(r) => r,
            Err((store, agg)) => return self.dangling_table(store, agg),
        };
        let step: AggregateFn<K, V, A> = Arc::new(step);
        let (store_name, ks, aserde) = (r.store.clone(), r.key_serde.clone(), r.agg_serde.clone());
        let cached = r.cached;
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, K, A>::new(AggregateProcessor {
                store: store_name.clone(),
                key_serde: ks.clone(),
                agg_serde: aserde.clone(),
                step: step.clone(),
                cached,
            }))
        });
        let node = self.add_aggregation(&r, StoreKind::KeyValue, supplier);
        KTable {
            stream: KStream {
                builder: self.stream.builder.clone(),
                node,
                key_serde: Some(r.key_serde),
                value_serde: Some(r.agg_serde),
                key_changed: false,
            },
            store: r.store,
            window: None,
            versioned: false,
            view: None,
            changes: None,
        }
    }

    /// Resolves an aggregation's store name (generated `<op>-<n>` without one), serdes and
    /// parent node (a repartition source when the key changed upstream). On a missing serde the
    /// error is recorded and `Err((store, value serde))` lets chaining go on.
    pub(super) fn resolve<A: Datum + Clone>(
        &self,
        materialized: Materialized<K, A>,
        agg_serde: Option<Arc<dyn Serde<A>>>,
        op: &str,
    ) -> Result<Resolved<K, A>, Unresolved<A>> {
        let store = {
            let mut g = self.stream.builder.inner.borrow_mut();
            let store = g.materialized_store(&materialized, op);
            if materialized.history_ms.is_some() {
                g.error(TopologyError::VersionedNotSupported {
                    store: store.clone(),
                });
            }
            store
        };
        let Materialized {
            key_serde: store_key_serde,
            value_serde,
            retention_ms,
            caching_disabled,
            ..
        } = materialized;
        let agg_serde = match value_serde.or(agg_serde) {
            Some(s) => s,
            None => {
                self.missing_serde("value");
                Arc::new(NoSerde)
            }
        };
        let Some(group_key_serde) = self.stream.key_serde.clone().or(store_key_serde.clone())
        else {
            self.missing_serde("key");
            return Err((store, agg_serde));
        };
        let key_serde = store_key_serde.unwrap_or_else(|| group_key_serde.clone());
        let parent = if self.repartition {
            match self.repartition_source(&store, group_key_serde) {
                Some(node) => node,
                None => return Err((store, agg_serde)),
            }
        } else {
            self.stream.node
        };
        Ok(Resolved {
            store,
            key_serde,
            agg_serde,
            parent,
            retention_ms,
            cached: !caching_disabled,
        })
    }

    /// Adds the aggregation's processor node below `r.parent`, with its store of `kind`.
    pub(super) fn add_aggregation<A>(
        &self,
        r: &Resolved<K, A>,
        kind: StoreKind,
        supplier: Supplier,
    ) -> usize {
        let mut g = self.stream.builder.inner.borrow_mut();
        g.add_store(&r.store, kind);
        let name = g.generated_name("aggregate");
        g.add(
            name,
            NodeKind::Processor {
                supplier,
                stores: vec![r.store.clone()],
            },
            vec![r.parent],
        )
    }

    /// Records a build error.
    pub(super) fn error(&self, e: super::TopologyError) {
        self.stream.builder.inner.borrow_mut().error(e);
    }

    /// The source node reading the repartitioned records: the grouping's shared topic when it is
    /// named, else `<store>-repartition`. `None` when a serde is missing (an error is recorded).
    pub(super) fn repartition_source(
        &self,
        store: &str,
        key_serde: Arc<dyn Serde<K>>,
    ) -> Option<usize> {
        if let Some(node) = self.repartitioned.get() {
            return Some(node);
        }
        let Some(value_serde) = self.stream.value_serde.clone() else {
            self.missing_serde("value");
            return None;
        };
        let node = match &self.name {
            Some(name) => {
                self.stream.builder.inner.borrow_mut().claim_name(name);
                let node = self
                    .stream
                    .through_repartition_topic(name, key_serde, value_serde);
                self.repartitioned.set(Some(node));
                node
            }
            None => self
                .stream
                .through_repartition_topic(store, key_serde, value_serde),
        };
        Some(node)
    }

    /// A table that build() will reject (an error was recorded), so chaining can go on.
    pub(super) fn dangling_table<K2, A: Datum + Clone>(
        &self,
        store: String,
        agg: Arc<dyn Serde<A>>,
    ) -> KTable<K2, A> {
        KTable {
            stream: KStream {
                builder: self.stream.builder.clone(),
                node: self.stream.node,
                key_serde: None,
                value_serde: Some(agg),
                key_changed: false,
            },
            store,
            window: None,
            versioned: false,
            view: None,
            changes: None,
        }
    }
}
