//! [`KTable::group_by`] and [`KGroupedTable`]: a table re-keyed and aggregated with an adder and
//! a subtractor (Kafka Streams' `KTable.groupBy` and `KGroupedTable`).
//!
//! Every update of the table is a [`Change`]: the value before and after. `group_by` maps both
//! with the selector: when they land in the same group, one record carries both; when the group
//! changed, the old group gets the old value's retraction and then the new group the new value.
//! The records go through a repartition topic (as [`ChangeSerde`]) to the aggregation, which
//! first subtracts the old value (when the group has an aggregate) and then adds the new one
//! (starting from the initializer). So a customer moving from one region to another leaves the
//! first region's count and joins the second's, and a deleted one leaves its region's.
//!
//! As in Kafka Streams, a count that drops to 0 stays in the store as 0. Tables read from a topic,
//! their `filter` / `map_values` views and table-table joins' results can be regrouped; an
//! aggregation's table cannot yet: it does not say which values its updates replace (`build`
//! says so).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use super::change::{Change, ChangeSerde};
use super::grouped::KGroupedStream;
use super::{Grouped, KStream, KTable, Materialized, TopologyError};
use crate::processor::Datum;
use crate::record::Record;
use crate::serdes::{I64Serde, Serde};

/// A table grouped by a new key, ready for an aggregation with an adder and a subtractor; the
/// counterpart of `KGroupedTable`.
pub struct KGroupedTable<K, V> {
    grouped: KGroupedStream<K, Change<V>>,
    /// The values' serde (for `reduce`'s store).
    value_serde: Option<Arc<dyn Serde<V>>>,
}

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// Groups the table by `selector(key, value) = (new key, new value)` (Kafka Streams'
    /// `KTable.groupBy`); `grouped` gives the new key's and value's serdes (needed when the types
    /// change) and names the repartition topic. See [`crate::dsl::grouped_table`].
    pub fn group_by<K2, V2>(
        &self,
        selector: impl Fn(&K, V) -> (K2, V2) + Send + Sync + 'static,
        grouped: impl Into<Grouped<K2, V2>>,
    ) -> KGroupedTable<K2, V2>
    where
        K2: Datum + Clone + PartialEq,
        V2: Datum + Clone,
    {
        let Grouped {
            name,
            key_serde,
            value_serde,
        } = grouped.into();
        let mut mapped: KStream<K2, Change<V2>> = match &self.changes {
            Some(changes) => changes.stateless("table-group-by", true, move |r, out| {
                let Record {
                    key,
                    value: Change { new, old },
                    timestamp,
                    headers,
                } = r;
                let Some(key) = key else {
                    return;
                };
                let old = old.map(|v| selector(&key, v));
                let new = new.map(|v| selector(&key, v));
                let mut send = |k: K2, change: Change<V2>| {
                    out(Record {
                        key: Some(k),
                        value: change,
                        timestamp,
                        headers: headers.clone(),
                    })
                };
                match (old, new) {
                    (Some((ko, vo)), Some((kn, vn))) if ko == kn => send(
                        kn,
                        Change {
                            new: Some(vn),
                            old: Some(vo),
                        },
                    ),
                    (old, new) => {
                        if let Some((k, v)) = old {
                            send(
                                k,
                                Change {
                                    new: None,
                                    old: Some(v),
                                },
                            );
                        }
                        if let Some((k, v)) = new {
                            send(
                                k,
                                Change {
                                    new: Some(v),
                                    old: None,
                                },
                            );
                        }
                    }
                }
            }),
            None => {
                self.stream
                    .builder
                    .inner
                    .borrow_mut()
                    .error(TopologyError::NoTableChanges {
                        store: self.store.clone(),
                    });
                self.stream.stateless("table-group-by", true, |_, _| {})
            }
        };
        mapped.key_serde = key_serde;
        mapped.value_serde = value_serde
            .clone()
            .map(|s| Arc::new(ChangeSerde(s)) as Arc<dyn Serde<Change<V2>>>);
        KGroupedTable {
            grouped: KGroupedStream {
                stream: mapped,
                repartition: true,
                name,
                repartitioned: Rc::new(Cell::new(None)),
            },
            value_serde,
        }
    }
}

impl<K: Datum + Clone, V: Datum + Clone> KGroupedTable<K, V> {
    /// Counts the rows of each group in the store `materialized` names (`count`).
    pub fn count(&self, materialized: impl Into<Materialized<K, i64>>) -> KTable<K, i64> {
        self.aggregate_with(
            materialized.into(),
            Some(Arc::new(I64Serde)),
            || 0,
            |_k, _v, n| n + 1,
            |_k, _v, n| n - 1,
        )
    }

    /// Combines each group's values with `adder(aggregate, value)`, and takes a value that
    /// leaves the group out with `subtractor(aggregate, value)` (Kafka Streams' `reduce(adder,
    /// subtractor, Materialized)`).
    pub fn reduce(
        &self,
        adder: impl Fn(V, V) -> V + Send + Sync + 'static,
        subtractor: impl Fn(V, V) -> V + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, V>>,
    ) -> KTable<K, V> {
        self.grouped.aggregate_with(
            materialized.into(),
            self.value_serde.clone(),
            move |_k, c: Change<V>, agg: Option<V>| {
                let mid = match (agg, c.old) {
                    (Some(a), Some(o)) => Some(subtractor(a, o)),
                    (a, _) => a,
                };
                match (c.new, mid) {
                    (Some(n), Some(m)) => Some(adder(m, n)),
                    (Some(n), None) => Some(n),
                    (None, mid) => mid,
                }
            },
        )
    }

    /// Folds each group's values into an aggregate: `initializer()` for a new group,
    /// `adder(key, value, aggregate)` for a value joining it, `subtractor(key, value,
    /// aggregate)` for one leaving it (Kafka Streams' `aggregate(initializer, adder,
    /// subtractor, Materialized)`), kept in the store `materialized` names with its value serde
    /// (`build` fails without it).
    pub fn aggregate<A: Datum + Clone>(
        &self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        subtractor: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, A>>,
    ) -> KTable<K, A> {
        self.aggregate_with(materialized.into(), None, initializer, adder, subtractor)
    }

    /// Kafka Streams' `KTableAggregate`: subtract the old value when the group has an aggregate,
    /// then add the new one (to the initializer when it has none).
    fn aggregate_with<A: Datum + Clone>(
        &self,
        materialized: Materialized<K, A>,
        agg_serde: Option<Arc<dyn Serde<A>>>,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        adder: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        subtractor: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> KTable<K, A> {
        self.grouped.aggregate_with(
            materialized,
            agg_serde,
            move |k, c: Change<V>, agg: Option<A>| {
                let mid = match (agg, c.old) {
                    (Some(a), Some(o)) => Some(subtractor(k, o, a)),
                    (a, _) => a,
                };
                match c.new {
                    Some(n) => Some(adder(k, n, mid.unwrap_or_else(&initializer))),
                    None => mid,
                }
            },
        )
    }
}
