//! Table-table joins: [`KTable::join`], [`KTable::left_join`] and [`KTable::outer_join`] (Kafka
//! Streams' `KTableKTableJoin` and its left and outer forms).
//!
//! The result is a table keyed like both inputs: for each key, `joiner(left, right)` of the two
//! tables' current values, present when the join kind says so (inner: both present; left: the
//! left one; outer: either). An update of either input recomputes its key's result from the
//! update and the other table's current value, stores it in the result's own store (named by
//! the `Materialized`) and passes the change on; a result that disappears (a deletion, or an
//! inner join losing a side) is deleted from the store and regroupings see its retraction.
//! `to_stream` carries the results that exist after each update.
//!
//! The two tables must be co-partitioned (same partition count, keys partitioned alike): the
//! join runs in one sub-topology, split by the same key ranges, and takes the two topics' records
//! in timestamp order (`max.task.idle.ms`). Where rill differs from Kafka Streams: the result
//! carries the timestamp of the update that produced it (rill's table stores keep no timestamps,
//! so not the larger of the two), and the result is always materialized (Kafka Streams computes
//! an unmaterialized join's value from both tables when read). Both inputs must be tables read
//! from topics or views of them, whose updates carry the values they replace.

use std::sync::Arc;

use super::change::{Change, ChangeSerde};
use super::table_view::TableLookup;
use super::{KStream, KTable, Materialized, TopologyError};
use crate::graph::Supplier;
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::Record;
use crate::serdes::Serde;
use crate::store::StoreKind;
use crate::versioned::VersionedBytes;

/// The result from the two sides' values; `None` when the join kind has none.
type TableJoiner<V1, V2, VR> = Arc<dyn Fn(Option<V1>, Option<V2>) -> Option<VR> + Send + Sync>;

/// How a join processor reads a table: its store and how its value for a key is made.
#[derive(Clone)]
pub(super) struct OtherTable<K, VO> {
    pub store: String,
    pub versioned: bool,
    pub lookup: TableLookup<K, VO>,
}

impl<K, VO> OtherTable<K, VO> {
    /// The table's current value for `key` (serialized: `kb`).
    pub fn read<KC: Datum, VC: Datum>(
        &self,
        ctx: &mut ProcessorContext<'_, KC, VC>,
        key: &K,
        kb: &[u8],
    ) -> Result<Option<VO>, ProcessError> {
        let bytes = if self.versioned {
            VersionedBytes::open(ctx.timed_store(&self.store)?)?
                .get(kb)?
                .map(|(value, _)| value)
        } else {
            ctx.store(&self.store)?.get(kb)?
        };
        match bytes {
            Some(b) => (self.lookup)(key, b.as_slice()),
            None => Ok(None),
        }
    }
}

/// The join processor of one side: an update of this table against the other's current value.
#[derive(Clone)]
struct TableJoinSide<K, VT, VO, VR> {
    other: OtherTable<K, VO>,
    result_store: String,
    key_serde: Arc<dyn Serde<K>>,
    result_serde: Arc<dyn Serde<VR>>,
    /// (this value, other value) to the result.
    pair: TableJoiner<VT, VO, VR>,
}

impl<K, VT, VO, VR> Processor<K, Change<VT>, K, Change<VR>> for TableJoinSide<K, VT, VO, VR>
where
    K: Datum + Clone,
    VT: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<K, Change<VT>>,
        ctx: &mut ProcessorContext<'_, K, Change<VR>>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            return Ok(());
        };
        let kb = self.key_serde.serialize(&key)?;
        let other = self.other.read(ctx, &key, &kb)?;
        let new = (self.pair)(record.value.new, other);
        let result = JoinResult {
            store: &self.result_store,
            serde: &*self.result_serde,
        };
        result.set(ctx, key, &kb, new, record.timestamp, record.headers)
    }
}

/// A join's result table: its store and value serde.
pub(super) struct JoinResult<'a, VR> {
    pub store: &'a str,
    pub serde: &'a dyn Serde<VR>,
}

impl<VR: Datum + Clone> JoinResult<'_, VR> {
    /// Stores `new` as `key`'s result (deletes it for `None`) and forwards the change, unless
    /// there was nothing to delete.
    pub fn set<K: Datum + Clone>(
        &self,
        ctx: &mut ProcessorContext<'_, K, Change<VR>>,
        key: K,
        kb: &[u8],
        new: Option<VR>,
        timestamp: i64,
        headers: crate::record::Headers,
    ) -> Result<(), ProcessError> {
        let store = ctx.store(self.store)?;
        let old = store
            .get(kb)?
            .map(|b| self.serde.deserialize(&b))
            .transpose()?;
        match &new {
            Some(v) => store.put(kb, &self.serde.serialize(v)?)?,
            None if old.is_some() => store.delete(kb)?,
            None => return Ok(()),
        }
        ctx.forward(Record {
            key: Some(key),
            value: Change { new, old },
            timestamp,
            headers,
        });
        Ok(())
    }
}

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// The table of `joiner(value, other_value)` for the keys in both tables (Kafka Streams'
    /// `KTable.join(KTable, ValueJoiner, Materialized)`), kept in the store `materialized`
    /// names, whose value serde it needs. See [`crate::dsl::table_join`].
    pub fn join<V2, VR>(
        &self,
        other: &KTable<K, V2>,
        joiner: impl Fn(V, V2) -> VR + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, VR>>,
    ) -> KTable<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: TableJoiner<V, V2, VR> = Arc::new(move |a, b| match (a, b) {
            (Some(a), Some(b)) => Some(joiner(a, b)),
            _ => None,
        });
        self.join_tables(other, "table-join", joiner, materialized.into())
    }

    /// Like [`KTable::join`], for every key of this table: `joiner(value, None)` when `other`
    /// lacks it (`KTable.leftJoin`).
    pub fn left_join<V2, VR>(
        &self,
        other: &KTable<K, V2>,
        joiner: impl Fn(V, Option<V2>) -> VR + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, VR>>,
    ) -> KTable<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: TableJoiner<V, V2, VR> = Arc::new(move |a, b| a.map(|a| joiner(a, b)));
        self.join_tables(other, "table-left-join", joiner, materialized.into())
    }

    /// Like [`KTable::join`], for every key of either table: `joiner(Some, None)` or
    /// `joiner(None, Some)` when one lacks it (`KTable.outerJoin`).
    pub fn outer_join<V2, VR>(
        &self,
        other: &KTable<K, V2>,
        joiner: impl Fn(Option<V>, Option<V2>) -> VR + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, VR>>,
    ) -> KTable<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: TableJoiner<V, V2, VR> =
            Arc::new(move |a, b| (a.is_some() || b.is_some()).then(|| joiner(a, b)));
        self.join_tables(other, "table-outer-join", joiner, materialized.into())
    }

    fn join_tables<V2, VR>(
        &self,
        other: &KTable<K, V2>,
        op: &str,
        joiner: TableJoiner<V, V2, VR>,
        materialized: Materialized<K, VR>,
    ) -> KTable<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let builder = self.stream.builder.clone();
        let hint = "Materialized::with on the join";
        let store = builder
            .inner
            .borrow_mut()
            .materialized_store(&materialized, op);
        let key_serde = materialized
            .key_serde
            .clone()
            .or_else(|| self.stream.key_serde.clone())
            .or_else(|| other.stream.key_serde.clone());
        let result_serde = materialized.value_serde.clone();
        let (this_reader, other_reader) = (self.lookup(hint), other.lookup(hint));
        let Some((this_changes, other_changes)) = self.changes_with(other) else {
            return self.dangling(store);
        };
        let (Some(key_serde), Some(result_serde), Some((_, this_lookup)), Some((_, other_lookup))) =
            (key_serde, result_serde, this_reader, other_reader)
        else {
            builder
                .inner
                .borrow_mut()
                .missing_serde(self.stream.node, "value", hint);
            return self.dangling(store);
        };
        builder
            .inner
            .borrow_mut()
            .add_store(&store, StoreKind::KeyValue);
        let stores = vec![self.store.clone(), other.store.clone(), store.clone()];
        let j = joiner.clone();
        let left = TableJoinSide {
            other: OtherTable {
                store: other.store.clone(),
                versioned: other.versioned,
                lookup: other_lookup,
            },
            result_store: store.clone(),
            key_serde: key_serde.clone(),
            result_serde: result_serde.clone(),
            pair: Arc::new(move |a, b| j(a, b)),
        };
        let right = TableJoinSide {
            other: OtherTable {
                store: self.store.clone(),
                versioned: self.versioned,
                lookup: this_lookup,
            },
            result_store: store.clone(),
            key_serde: key_serde.clone(),
            result_serde: result_serde.clone(),
            pair: Arc::new(move |b, a| joiner(a, b)),
        };
        let this_side = side_node(this_changes, op, left, stores.clone());
        let other_side = side_node(other_changes, op, right, stores);
        result_table(this_side.merge(&other_side), key_serde, result_serde, store)
    }

    /// This table's and `other`'s change streams; `None` (with the error `build` reports
    /// recorded) when one has none.
    #[allow(clippy::type_complexity)]
    pub(super) fn changes_with<'a, KO: Datum + Clone, VO: Datum + Clone>(
        &'a self,
        other: &'a KTable<KO, VO>,
    ) -> Option<(&'a KStream<K, Change<V>>, &'a KStream<KO, Change<VO>>)> {
        if let (Some(a), Some(b)) = (&self.changes, &other.changes) {
            return Some((a, b));
        }
        let store = if self.changes.is_none() {
            &self.store
        } else {
            &other.store
        };
        self.stream
            .builder
            .inner
            .borrow_mut()
            .error(TopologyError::NoTableChanges {
                store: store.clone(),
            });
        None
    }

    /// A table `build` rejects (an error was recorded), so chaining can go on.
    pub(super) fn dangling<VR: Datum + Clone>(&self, store: String) -> KTable<K, VR> {
        KTable {
            stream: self.stream.stateless("table-join", false, |_, _| {}),
            store,
            window: None,
            versioned: false,
            view: None,
            changes: None,
        }
    }
}

/// The table of a join's result `changes`, kept in `store`.
pub(super) fn result_table<K: Datum + Clone, VR: Datum + Clone>(
    mut changes: KStream<K, Change<VR>>,
    key_serde: Arc<dyn Serde<K>>,
    result_serde: Arc<dyn Serde<VR>>,
    store: String,
) -> KTable<K, VR> {
    changes.key_serde = Some(key_serde.clone());
    changes.value_serde =
        Some(Arc::new(ChangeSerde(result_serde.clone())) as Arc<dyn Serde<Change<VR>>>);
    let mut stream = changes.values_op("table-updates", |c: Change<VR>| c.new);
    stream.key_serde = Some(key_serde);
    stream.value_serde = Some(result_serde);
    KTable {
        stream,
        store,
        window: None,
        versioned: false,
        view: None,
        changes: Some(changes),
    }
}

/// Adds one side's join processor below its table's change stream.
fn side_node<K, VT, VO, VR>(
    changes: &KStream<K, Change<VT>>,
    op: &str,
    side: TableJoinSide<K, VT, VO, VR>,
    stores: Vec<String>,
) -> KStream<K, Change<VR>>
where
    K: Datum + Clone,
    VT: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    let supplier: Supplier =
        Arc::new(move || Box::new(Typed::<_, K, Change<VT>, K, Change<VR>>::new(side.clone())));
    changes.add_processor(None, op, supplier, stores, vec![changes.node], false)
}
