//! [`KTable`]: the changelog of an aggregation or of a topic read as a table, and `suppress`.

use std::sync::Arc;

use super::change::Change;
use super::table_view::TableLookup;
use super::{encoder_with, KStream, Produced, TopologyError};
use crate::graph::{NodeKind, Supplier, Topic};
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::Record;
use crate::serdes::Serde;
use crate::store::StoreKind;
use crate::versioned::{PutOutcome, VersionedBytes};
use crate::window::suppress::{SuppressProcessor, Suppressed, TimeOf, Until};

/// What a windowed table knows of its windows, for `suppress(until_window_closes)`.
pub(crate) struct WindowedTable<K> {
    /// The window end of a windowed key.
    pub end_of: Arc<dyn Fn(&K) -> i64 + Send + Sync>,
    /// A window ending at `end` is closed once `end + due_after <= stream time`.
    pub due_after: i64,
    /// The node to read updates from when the table's stream filters some out (the session
    /// aggregation itself, whose retractions the table's stream drops).
    pub updates: Option<usize>,
}

impl<K> Clone for WindowedTable<K> {
    fn clone(&self) -> Self {
        WindowedTable {
            end_of: self.end_of.clone(),
            due_after: self.due_after,
            updates: self.updates,
        }
    }
}

/// Materializes a topic as a table (`StreamsBuilder::table`): upserts and tombstones.
pub(super) struct TableSource<K, V> {
    pub store: String,
    pub key_serde: Arc<dyn Serde<K>>,
    pub value_serde: Arc<dyn Serde<V>>,
    /// The store is versioned: each record is a version at its timestamp.
    pub versioned: bool,
}

impl<K: Datum + Clone, V: Datum + Clone> Processor<K, Option<V>, K, Change<V>>
    for TableSource<K, V>
{
    fn process(
        &mut self,
        record: Record<K, Option<V>>,
        ctx: &mut ProcessorContext<'_, K, Change<V>>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            ctx.record_dropped("null_key");
            return Ok(());
        };
        let kb = self.key_serde.serialize(&key)?;
        let vb = record
            .value
            .as_ref()
            .map(|v| self.value_serde.serialize(v))
            .transpose()?;
        let old = if self.versioned {
            let mut store = VersionedBytes::open(ctx.timed_store(&self.store)?)?;
            let old = store.get(&kb)?.map(|(value, _)| value);
            match store.put(&kb, vb.as_deref(), record.timestamp)? {
                PutOutcome::Latest => {}
                // Older than the history retention reaches: not stored (Kafka Streams drops it).
                PutOutcome::Expired => {
                    ctx.record_dropped("expired_version");
                    return Ok(());
                }
                // Out of order: stored as history, but the table's current value is unchanged,
                // so nothing goes downstream (as in Kafka Streams).
                PutOutcome::ValidTo(_) => return Ok(()),
            }
            old
        } else {
            let store = ctx.store(&self.store)?;
            let old = store.get(&kb)?;
            match &vb {
                Some(vb) => store.put(&kb, vb)?,
                None => store.delete(&kb)?,
            }
            old
        };
        let old = old.map(|b| self.value_serde.deserialize(&b)).transpose()?;
        if record.value.is_none() && old.is_none() {
            // Deleting an absent key changes nothing.
            return Ok(());
        }
        ctx.forward(Record {
            key: Some(key),
            value: Change {
                new: record.value,
                old,
            },
            timestamp: record.timestamp,
            headers: record.headers,
        });
        Ok(())
    }
}

/// A table: the changelog of an aggregation, or a topic read as a table, keyed like its store;
/// the counterpart of `KTable`.
///
/// A table holds the latest value of each key in a store; its operations see each update:
/// `filter` and `map_values` derive tables, `group_by` re-groups for another aggregation,
/// `join` joins another table, and [`to_stream`](Self::to_stream) turns the updates into a
/// stream (to write them with `to`, for example).
///
/// ```
/// use rill_topology::prelude::*;
///
/// let builder = StreamsBuilder::new();
/// builder
///     .table("prices", StringSerde, I64Serde, "prices-store") // latest price per product
///     .filter(|_product, cents| *cents >= 10_000)
///     .to_stream()
///     .to("expensive-products");
/// builder.build()?;
/// # Ok::<(), TopologyError>(())
/// ```
pub struct KTable<K, V> {
    pub(super) stream: KStream<K, V>,
    pub(super) store: String,
    /// Set for the tables of windowed aggregations.
    pub(super) window: Option<WindowedTable<K>>,
    /// Whether its store is versioned (a stream-table join reads it as of each record's time).
    pub(super) versioned: bool,
    /// For a table derived without a store ([`crate::dsl::table_view`]): its value from the
    /// bytes of the store it reads. `None`: the store's values, decoded with the value serde.
    pub(super) view: Option<TableLookup<K, V>>,
    /// Its updates with the values they replace, deletions included (tables read from topics
    /// and their views; `None` for aggregations' tables, which have no such stream yet).
    pub(super) changes: Option<KStream<K, Change<V>>>,
}

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// The stream of updates: one record per change, carrying the new value.
    pub fn to_stream(&self) -> KStream<K, V> {
        self.stream.clone()
    }

    /// Writes the table to `topic` with its serdes (see [`KTable::to_with`]).
    pub fn to(&self, topic: &str) {
        self.to_with(topic, Produced::default());
    }

    /// Writes the table to `topic`: each update, and each deletion as a tombstone (a record with
    /// a null value), which is what Kafka Streams' `table.toStream().to(topic, produced)`
    /// writes (rill's `to_stream` carries no deletions). Serdes unset in `produced` are the
    /// table's. An aggregation's table has no deletions to write.
    pub fn to_with(&self, topic: &str, produced: impl Into<Produced<K, V>>) {
        let Some(changes) = &self.changes else {
            self.stream.to_with(topic, produced);
            return;
        };
        let Produced {
            name,
            key_serde,
            value_serde,
        } = produced.into();
        let Some((k, v)) = self
            .stream
            .serdes_or_error(key_serde, value_serde, "KTable::to_with")
        else {
            return;
        };
        let encode = encoder_with(k, move |c: &Change<V>| {
            c.new.as_ref().map(|x| v.serialize(x)).transpose()
        });
        changes.add_encoded_sink(name.as_deref(), Topic::External(topic.to_string()), encode);
    }

    /// The name of the store that materializes the table.
    pub fn store_name(&self) -> &str {
        &self.store
    }

    /// Holds updates back as `suppressed` says (Kafka Streams' `KTable.suppress`):
    /// `Suppressed::until_window_closes(..)` forwards one final result per window of a windowed
    /// table; `Suppressed::until_time_limit(..)` forwards each key at most once per time limit.
    /// The held updates live in a buffer store `<name>-store` (named by
    /// [`Suppressed::with_name`], else generated) that commits with the range, so what is
    /// released is exact across crashes. See [`crate::window::suppress`].
    pub fn suppress(&self, suppressed: Suppressed) -> KTable<K, V> {
        let Suppressed {
            until,
            buffer,
            name,
        } = suppressed;
        let builder = &self.stream.builder;
        let (node_name, store) = {
            let mut g = builder.inner.borrow_mut();
            let node = g.name_or_generated(name.as_deref(), "suppress");
            let store = format!("{node}-store");
            (node, store)
        };
        let (time_of, due_after, parent): (TimeOf<K>, i64, usize) = match (until, &self.window) {
            (Until::WindowCloses, Some(w)) => {
                if !buffer.is_strict() {
                    builder
                        .inner
                        .borrow_mut()
                        .error(TopologyError::SuppressBufferNotStrict { name: node_name });
                    return self.clone();
                }
                let end_of = w.end_of.clone();
                let parent = w.updates.unwrap_or(self.stream.node);
                (Arc::new(move |k: &K, _| end_of(k)), w.due_after, parent)
            }
            (Until::WindowCloses, None) => {
                builder
                    .inner
                    .borrow_mut()
                    .error(TopologyError::SuppressNotWindowed { name: node_name });
                return self.clone();
            }
            (Until::TimeLimit(limit), _) => {
                let parent = self
                    .window
                    .as_ref()
                    .and_then(|w| w.updates)
                    .unwrap_or(self.stream.node);
                (Arc::new(|_: &K, ts| ts), limit, parent)
            }
        };
        let hint = "Materialized::with on the aggregation";
        let Some((key_serde, value_serde)) = self.stream.serdes_or_error(None, None, hint) else {
            return self.clone();
        };
        let (ks, vs, st) = (key_serde.clone(), value_serde.clone(), store.clone());
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, K, V>::new(SuppressProcessor {
                store: st.clone(),
                key_serde: ks.clone(),
                value_serde: vs.clone(),
                time_of: time_of.clone(),
                due_after,
                buffer,
                floor: None,
                size: None,
            }))
        });
        let node = {
            let mut g = builder.inner.borrow_mut();
            g.add_store(&store, StoreKind::SuppressionBuffer);
            g.add(
                node_name,
                NodeKind::Processor {
                    supplier,
                    stores: vec![store],
                },
                vec![parent],
            )
        };
        KTable {
            stream: KStream {
                builder: builder.clone(),
                node,
                key_serde: Some(key_serde),
                value_serde: Some(value_serde),
                key_changed: false,
            },
            store: self.store.clone(),
            // Updates now come from the suppression itself.
            window: self
                .window
                .clone()
                .map(|w| WindowedTable { updates: None, ..w }),
            versioned: self.versioned,
            view: self.view.clone(),
            // The held-back updates do not say what they replace.
            changes: None,
        }
    }
}

impl<K, V> Clone for KTable<K, V> {
    fn clone(&self) -> Self {
        KTable {
            stream: self.stream.clone(),
            store: self.store.clone(),
            window: self.window.clone(),
            versioned: self.versioned,
            view: self.view.clone(),
            changes: self.changes.clone(),
        }
    }
}
