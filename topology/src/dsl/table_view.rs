//! Tables derived from a table without a store of their own: [`KTable::filter`],
//! [`KTable::filter_not`] and [`KTable::map_values`] (Kafka Streams' non-materialized
//! `KTable.filter` / `mapValues`).
//!
//! As in Kafka Streams, such a table is a *view*: its value for a key is computed, when read,
//! from the parent table's stored value (Kafka Streams' `KTableValueGetter`), so a stream-table
//! join with it reads the parent's store and applies the chain of filters and mappers. Its
//! update stream (`to_stream`) is the parent's with the same steps applied.
//!
//! Not yet as in Kafka Streams: a parent value that stops passing a filter produces no tombstone
//! on `to_stream` (rill's streams carry no null values); reads through the view (joins) see the
//! key as absent, as Kafka Streams' do. A view of a windowed table is not windowed (no
//! `suppress(until_window_closes)` on it), and has no store to query or name in `Materialized`.

use std::sync::Arc;

use super::change::Change;
use super::{KStream, KTable};
use crate::processor::{Datum, ProcessError};
use crate::record::Record;
use crate::serdes::Serde;

/// A table's value for a key, computed from the bytes its store holds for the key.
pub(crate) type TableLookup<K, V> =
    Arc<dyn Fn(&K, &[u8]) -> Result<Option<V>, ProcessError> + Send + Sync>;

/// What a join needs to read a table: its key serde and its lookup.
pub(crate) type TableReader<K, V> = (Arc<dyn Serde<K>>, TableLookup<K, V>);

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// The table of the values for which `predicate(key, value)` holds (Kafka Streams'
    /// `KTable.filter`); a key whose value fails it is absent from the new table. See
    /// [`crate::dsl::table_view`].
    pub fn filter(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KTable<K, V> {
        let predicate = Arc::new(predicate);
        let p = predicate.clone();
        let stream = self.stream.filter(move |k, v| k.is_some_and(|k| p(k, v)));
        let q = predicate.clone();
        let view = self.view_then(move |k, v| v.filter(|v| q(k, v)));
        let changes = self.changes.as_ref().map(|c| {
            c.stateless(
                "table-filter",
                false,
                move |r: Record<K, Change<V>>, out| {
                    let passes = |v: &V| r.key.as_ref().is_some_and(|k| predicate(k, v));
                    let change = Change {
                        new: r.value.new.clone().filter(passes),
                        old: r.value.old.clone().filter(passes),
                    };
                    if change.new.is_some() || change.old.is_some() {
                        out(Record { value: change, ..r });
                    }
                },
            )
        });
        self.derived(stream, view, changes)
    }

    /// The table of the values for which `predicate(key, value)` does not hold (Kafka Streams'
    /// `KTable.filterNot`).
    pub fn filter_not(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KTable<K, V> {
        self.filter(move |k, v| !predicate(k, v))
    }

    /// The table of `f(value)` for every key (Kafka Streams' `KTable.mapValues`). The new values
    /// have no serde: give one to a sink of `to_stream` with `Produced::with`.
    pub fn map_values<V2: Datum + Clone>(
        &self,
        f: impl Fn(V) -> V2 + Send + Sync + 'static,
    ) -> KTable<K, V2> {
        let f = Arc::new(f);
        let g = f.clone();
        let stream = self.stream.map_values(move |v| g(v));
        let h = f.clone();
        let view = self.view_then(move |_k, v| v.map(|v| h(v)));
        let changes = self.changes.as_ref().map(|c| {
            c.values_op("table-map-values", move |c: Change<V>| {
                Some(Change {
                    new: c.new.map(|v| f(v)),
                    old: c.old.map(|v| f(v)),
                })
            })
        });
        self.derived(stream, view, changes)
    }

    /// How a join reads this table: its key serde and its value for a key from the stored
    /// bytes. Records a missing-serde error (reported by `build`) and returns `None` without.
    pub(super) fn lookup(&self, hint: &'static str) -> Option<TableReader<K, V>> {
        let Some(view) = &self.view else {
            let (key_serde, value_serde) = self.stream.serdes_or_error(None, None, hint)?;
            return Some((key_serde, decode(value_serde)));
        };
        match self.stream.key_serde.clone() {
            Some(key_serde) => Some((key_serde, view.clone())),
            None => {
                let mut g = self.stream.builder.inner.borrow_mut();
                g.missing_serde(self.stream.node, "key", hint);
                None
            }
        }
    }

    /// This table's lookup followed by `step`.
    fn view_then<V2: 'static>(
        &self,
        step: impl Fn(&K, Option<V>) -> Option<V2> + Send + Sync + 'static,
    ) -> TableLookup<K, V2> {
        let parent: TableLookup<K, V> = match (&self.view, &self.stream.value_serde) {
            (Some(view), _) => view.clone(),
            (None, Some(value_serde)) => decode(value_serde.clone()),
            (None, None) => {
                let mut g = self.stream.builder.inner.borrow_mut();
                g.missing_serde(self.stream.node, "value", HINT);
                // `build` fails on the error; this lookup never runs.
                Arc::new(|_, _| Ok(None))
            }
        };
        Arc::new(move |k, b| Ok(step(k, parent(k, b)?)))
    }

    fn derived<V2>(
        &self,
        stream: KStream<K, V2>,
        view: TableLookup<K, V2>,
        changes: Option<KStream<K, Change<V2>>>,
    ) -> KTable<K, V2> {
        KTable {
            stream,
            store: self.store.clone(),
            window: None,
            versioned: self.versioned,
            view: Some(view),
            changes,
        }
    }
}

/// Where a `build` error points users whose table lacks a value serde.
const HINT: &str = "Materialized::with on the table";

/// A lookup that decodes the stored bytes with `value_serde`.
fn decode<K, V: 'static>(value_serde: Arc<dyn Serde<V>>) -> TableLookup<K, V> {
    Arc::new(move |_k, b| Ok(Some(value_serde.deserialize(b)?)))
}
