//! Cogrouping (Kafka Streams' `KGroupedStream.cogroup`): grouped streams of one key type, each
//! with a value type and an aggregator of its own, fold into one aggregate per key kept in one
//! store.
//!
//! ```
//! use rill_topology::prelude::*;
//! use rill_topology::serdes::{I64Serde, StringSerde};
//!
//! let b = StreamsBuilder::new();
//! let clicks = b.stream("clicks", StringSerde, I64Serde).group_by_key();
//! let views = b.stream("views", StringSerde, StringSerde).group_by_key();
//! clicks
//!     .cogroup(|_user: &String, n: i64, total: i64| total + n)
//!     .cogroup(&views, |_user: &String, _page: String, total: i64| total + 1)
//!     .aggregate(|| 0, Materialized::with(StringSerde, I64Serde).with_name("activity"));
//! b.build().unwrap();
//! ```
//!
//! Each input whose key changed upstream goes through a repartition topic of its own
//! (`<application.id>-<store>-cogroup-<i>-repartition`, or its `Grouped` name), so that every
//! input of a key lands in the one task that holds the key's aggregate; the inputs must then
//! be co-partitioned as a join's are. Every update is forwarded: cogrouped aggregates do not go
//! through the record cache.

use std::sync::Arc;

use super::grouped::{AggregateFn, AggregateProcessor, SERDE_HINT};
use super::{KGroupedStream, KStream, KTable, Materialized, NoSerde, StreamsBuilder};
use crate::graph::{NodeKind, Supplier};
use crate::processor::{Datum, Typed};
use crate::serdes::Serde;
use crate::store::StoreKind;

/// One input's fold: `aggregator(key, value, aggregate)`.
type Aggregator<K, V, A> = Arc<dyn Fn(&K, V, A) -> A + Send + Sync>;

/// What every input's aggregation node shares.
struct Shared<K, A> {
    store: String,
    key_serde: Arc<dyn Serde<K>>,
    agg_serde: Arc<dyn Serde<A>>,
    initializer: Arc<dyn Fn() -> A + Send + Sync>,
}

/// Adds one input's aggregation node (the `usize` is its index) and returns it; `None` when a
/// serde is missing (an error is recorded).
type AddInput<K, A> = Box<dyn FnOnce(&Shared<K, A>, usize) -> Option<usize>>;

/// Grouped streams folding into one aggregate per key (Kafka Streams' `CogroupedKStream`); made
/// by [`KGroupedStream::cogroup`], finished by [`CogroupedKStream::aggregate`].
pub struct CogroupedKStream<K, A> {
    builder: StreamsBuilder,
    /// The first input's grouping key serde: the store's, unless `Materialized` sets one.
    key_serde: Option<Arc<dyn Serde<K>>>,
    inputs: Vec<AddInput<K, A>>,
}

impl<K: Datum + Clone, V: Datum + Clone> KGroupedStream<K, V> {
    /// Starts a cogrouping with this stream's values folded by `aggregator(key, value,
    /// aggregate)` (Kafka Streams' `cogroup(Aggregator)`); add inputs with
    /// [`CogroupedKStream::cogroup`], then [`CogroupedKStream::aggregate`].
    pub fn cogroup<A: Datum + Clone>(
        &self,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> CogroupedKStream<K, A> {
        CogroupedKStream {
            builder: self.stream.builder.clone(),
            key_serde: self.stream.key_serde.clone(),
            inputs: Vec::new(),
        }
        .cogroup(self, aggregator)
    }
}

impl<K: Datum + Clone, A: Datum + Clone> CogroupedKStream<K, A> {
    /// Adds `grouped`, whose values `aggregator(key, value, aggregate)` folds into the same
    /// aggregate (Kafka Streams' `cogroup(KGroupedStream, Aggregator)`).
    pub fn cogroup<V: Datum + Clone>(
        mut self,
        grouped: &KGroupedStream<K, V>,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> Self {
        let grouped = grouped.clone();
        let aggregator: Aggregator<K, V, A> = Arc::new(aggregator);
        self.inputs.push(Box::new(move |shared, i| {
            let parent = if grouped.repartition {
                let topic = format!("{}-cogroup-{i}", shared.store);
                grouped.repartition_source(&topic, shared.key_serde.clone())?
            } else {
                grouped.stream.node
            };
            let (store, ks, agg) = (
                shared.store.clone(),
                shared.key_serde.clone(),
                shared.agg_serde.clone(),
            );
            let initializer = shared.initializer.clone();
            let step: AggregateFn<K, V, A> = Arc::new(move |k, v, old| {
                Some(aggregator(k, v, old.unwrap_or_else(|| initializer())))
            });
            let supplier: Supplier = Arc::new(move || {
                Box::new(Typed::<_, K, V, K, A>::new(AggregateProcessor {
                    store: store.clone(),
                    key_serde: ks.clone(),
                    agg_serde: agg.clone(),
                    step: step.clone(),
                    cached: false,
                }))
            });
            let mut g = grouped.stream.builder.inner.borrow_mut();
            let name = g.generated_name("cogroup-aggregate");
            Some(g.add(
                name,
                NodeKind::Processor {
                    supplier,
                    stores: vec![shared.store.clone()],
                },
                vec![parent],
            ))
        }));
        self
    }

    /// The table of each key's aggregate: `initializer()` for a new key, then each input's
    /// aggregator per record, kept in the store `materialized` names with its value serde
    /// (Kafka Streams' `aggregate(Initializer, Materialized)`; `build` fails without it).
    pub fn aggregate(
        self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, A>>,
    ) -> KTable<K, A> {
        let materialized = materialized.into();
        let store = self
            .builder
            .inner
            .borrow_mut()
            .materialized_store(&materialized, "cogroup-store");
        let key_serde = materialized.key_serde.or(self.key_serde);
        let agg_serde = materialized.value_serde;
        let shared = match (key_serde, agg_serde.clone()) {
            (Some(key_serde), Some(agg_serde)) => Some(Shared {
                store: store.clone(),
                key_serde,
                agg_serde,
                initializer: Arc::new(initializer),
            }),
            (key, _) => {
                let what = if key.is_none() { "key" } else { "value" };
                self.builder
                    .inner
                    .borrow_mut()
                    .error(super::TopologyError::MissingSerde {
                        node: store.clone(),
                        what,
                        hint: SERDE_HINT,
                    });
                None
            }
        };
        let mut nodes = Vec::new();
        if let Some(shared) = &shared {
            self.builder
                .inner
                .borrow_mut()
                .add_store(&store, StoreKind::KeyValue);
            for (i, add) in self.inputs.into_iter().enumerate() {
                nodes.extend(add(shared, i));
            }
        }
        // One node downstream of every input's aggregation: the table's stream.
        let forward: Supplier = Arc::new(|| {
            Box::new(super::FnProcessor(Arc::new(|rec, host| {
                host.forward(rec);
                Ok(())
            })))
        });
        let node = {
            let mut g = self.builder.inner.borrow_mut();
            let name = g.generated_name("cogroup-merge");
            g.add(
                name,
                NodeKind::Processor {
                    supplier: forward,
                    stores: vec![],
                },
                nodes,
            )
        };
        KTable {
            stream: KStream {
                builder: self.builder.clone(),
                node,
                key_serde: shared.as_ref().map(|s| s.key_serde.clone()),
                value_serde: Some(agg_serde.unwrap_or_else(|| Arc::new(NoSerde))),
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
