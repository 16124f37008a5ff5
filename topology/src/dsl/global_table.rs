//! [`GlobalKTable`] (`StreamsBuilder::global_table`) and the stream-global-table joins
//! [`KStream::join_global`] and [`KStream::left_join_global`] (Kafka Streams' `GlobalKTable` and
//! `join(GlobalKTable, KeyValueMapper, ValueJoiner)`).
//!
//! A global table is a full copy of its topic on every instance ([`crate::global`]), so a
//! stream joins it by any key it derives from a record, with no co-partitioning and no
//! repartitioning: every key range of every task reads the same store. As in Kafka Streams the
//! table is filled from its topic before processing starts and then updated by a reader of its
//! own, not in timestamp order with the stream: a stream record meets the table as it is when
//! the record is processed.

use std::sync::Arc;

use super::join::forward_joined;
use super::{KStream, StreamsBuilder};
use crate::graph::Supplier;
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::Record;
use crate::serdes::Serde;

/// A table holding every partition of a topic on every instance; the counterpart of
/// `GlobalKTable`.
pub struct GlobalKTable<K, V> {
    store: String,
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
}

impl<K, V> Clone for GlobalKTable<K, V> {
    fn clone(&self) -> Self {
        GlobalKTable {
            store: self.store.clone(),
            key_serde: self.key_serde.clone(),
            value_serde: self.value_serde.clone(),
        }
    }
}

impl<K, V> GlobalKTable<K, V> {
    /// The name of its store.
    pub fn store_name(&self) -> &str {
        &self.store
    }
}

impl StreamsBuilder {
    /// A global table of `topic` in the store `store` (Kafka Streams' `globalTable`): the latest
    /// value of each key over all partitions, on every instance; a null value deletes its key.
    /// See [`crate::dsl::global_table`].
    pub fn global_table<K: Datum + Clone, V: Datum + Clone>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
        store: &str,
    ) -> GlobalKTable<K, V> {
        let mut g = self.inner.borrow_mut();
        g.claim_name(store);
        g.global_tables.insert(store.to_string(), topic.to_string());
        GlobalKTable {
            store: store.to_string(),
            key_serde: Arc::new(key_serde),
            value_serde: Arc::new(value_serde),
        }
    }
}

/// The join result from the record's value and the table's (`None`: no row); `None` drops it.
type GlobalJoiner<V, VG, VR> = Arc<dyn Fn(V, Option<VG>) -> Option<VR> + Send + Sync>;

/// The global table's key for a record.
type KeyMapper<K, V, KG> = Arc<dyn Fn(Option<&K>, &V) -> KG + Send + Sync>;

/// Looks each record up in a global table by the key it maps to.
struct GlobalJoin<K, V, KG, VG, VR> {
    table: GlobalKTable<KG, VG>,
    key_mapper: KeyMapper<K, V, KG>,
    joiner: GlobalJoiner<V, VG, VR>,
}

impl<K, V, KG, VG, VR> Processor<K, V, K, VR> for GlobalJoin<K, V, KG, VG, VR>
where
    K: Datum + Clone,
    V: Datum + Clone,
    KG: Datum + Clone,
    VG: Datum + Clone,
    VR: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut ProcessorContext<'_, K, VR>,
    ) -> Result<(), ProcessError> {
        let kg = (self.key_mapper)(record.key.as_ref(), &record.value);
        let kb = self.table.key_serde.serialize(&kg)?;
        let row = ctx
            .global_get(&self.table.store, &kb)?
            .map(|b| self.table.value_serde.deserialize(&b))
            .transpose()?;
        forward_joined(ctx, record, None, |v| (self.joiner)(v, row));
        Ok(())
    }
}

impl<K: Datum + Clone, V: Datum + Clone> KStream<K, V> {
    /// Joins each record with the row of `table` whose key is `key_mapper(key, value)` (Kafka
    /// Streams' `join(GlobalKTable, KeyValueMapper, ValueJoiner)`): `joiner(value, row)`, key
    /// and timestamp stay the record's; a record without a row is dropped and counted
    /// (`unmatched_join`). See [`crate::dsl::global_table`].
    pub fn join_global<KG, VG, VR>(
        &self,
        table: &GlobalKTable<KG, VG>,
        key_mapper: impl Fn(Option<&K>, &V) -> KG + Send + Sync + 'static,
        joiner: impl Fn(V, VG) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        KG: Datum + Clone,
        VG: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: GlobalJoiner<V, VG, VR> = Arc::new(move |v, row| row.map(|r| joiner(v, r)));
        self.join_global_with(table, "global-join", key_mapper, joiner)
    }

    /// Like [`KStream::join_global`], but every record produces a result: `joiner(value, None)`
    /// without a row (`leftJoin(GlobalKTable, ..)`).
    pub fn left_join_global<KG, VG, VR>(
        &self,
        table: &GlobalKTable<KG, VG>,
        key_mapper: impl Fn(Option<&K>, &V) -> KG + Send + Sync + 'static,
        joiner: impl Fn(V, Option<VG>) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        KG: Datum + Clone,
        VG: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: GlobalJoiner<V, VG, VR> = Arc::new(move |v, row| Some(joiner(v, row)));
        self.join_global_with(table, "global-left-join", key_mapper, joiner)
    }

    fn join_global_with<KG, VG, VR>(
        &self,
        table: &GlobalKTable<KG, VG>,
        op: &str,
        key_mapper: impl Fn(Option<&K>, &V) -> KG + Send + Sync + 'static,
        joiner: GlobalJoiner<V, VG, VR>,
    ) -> KStream<K, VR>
    where
        KG: Datum + Clone,
        VG: Datum + Clone,
        VR: Datum + Clone,
    {
        let key_mapper: KeyMapper<K, V, KG> = Arc::new(key_mapper);
        let table = table.clone();
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, K, VR>::new(GlobalJoin {
                table: table.clone(),
                key_mapper: key_mapper.clone(),
                joiner: joiner.clone(),
            }))
        });
        let mut joined: KStream<K, VR> =
            self.add_processor(None, op, supplier, vec![], vec![self.node], false);
        joined.key_serde = self.key_serde.clone();
        joined
    }
}
