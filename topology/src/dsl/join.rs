//! Stream-table joins: [`KStream::join`] and [`KStream::left_join`] with a [`KTable`] (Kafka
//! Streams' `KStreamKTableJoin`).
//!
//! Each stream record looks up its key in the table's store as it is when the record is
//! processed; table updates produce nothing (only the stream side triggers). The join node uses
//! the table's store, so it lands in the table's sub-topology: the stream's topic and the table's
//! topic are read by the same tasks (co-partitioned: startup refuses different partition counts)
//! and split by the same key ranges, so a join never leaves its range. A stream whose key
//! changed upstream is repartitioned first, as in Kafka Streams.
//!
//! With a versioned table (`Materialized::versioned`), a stream record is joined with the table
//! version valid at its own timestamp (KIP-914), whatever order the two topics' records arrive
//! in, as long as the table's record was processed first and is within the history retention.
//!
//! The two topics' records reach the join in timestamp order when both are already populated
//! (`max.task.idle.ms`, see `rill_runtime::kafka::time_sync`), so each stream record meets the
//! table as it was at its timestamp.

use std::sync::Arc;

use super::stream_join::co_partitioned;
use super::table_view::TableLookup;
use super::{KStream, KTable};
use crate::graph::Supplier;
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::Record;
use crate::serdes::Serde;
use crate::versioned::VersionedBytes;

/// A joiner over the table's value when there is one; `None` drops the record.
type JoinFn<V, VT, VR> = Arc<dyn Fn(V, Option<VT>) -> Option<VR> + Send + Sync>;

/// Looks each stream record up in the table's store.
struct StreamTableJoin<K, V, VT, VR> {
    store: String,
    key_serde: Arc<dyn Serde<K>>,
    /// The table's value from its stored bytes (decoded, and for views filtered or mapped).
    lookup: TableLookup<K, VT>,
    joiner: JoinFn<V, VT, VR>,
    /// A left join: records without a key or a match still produce a result.
    left: bool,
    /// The table is versioned: look it up as of the record's timestamp.
    versioned: bool,
}

impl<K, V, VT, VR> Processor<K, V, K, VR> for StreamTableJoin<K, V, VT, VR>
where
    K: Datum + Clone,
    V: Datum + Clone,
    VT: Datum + Clone,
    VR: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut ProcessorContext<'_, K, VR>,
    ) -> Result<(), ProcessError> {
        let table = match &record.key {
            Some(key) => {
                let kb = self.key_serde.serialize(key)?;
                let bytes = if self.versioned {
                    VersionedBytes::open(ctx.timed_store(&self.store)?)?
                        .get_as_of(&kb, record.timestamp)?
                        .map(|r| r.value)
                } else {
                    ctx.store(&self.store)?.get(&kb)?
                };
                match bytes {
                    Some(b) => (self.lookup)(key, &b)?,
                    None => None,
                }
            }
            // A left join passes a record without a key through with no table value (KIP-962);
            // an inner join drops it.
            None if self.left => None,
            None => {
                ctx.record_dropped("null_key");
                return Ok(());
            }
        };
        forward_joined(ctx, record, |v| (self.joiner)(v, table));
        Ok(())
    }
}

/// Forwards `join(value)` with the record's key and timestamp, or counts the record as
/// unmatched when it is `None`.
pub(super) fn forward_joined<K: Datum, V, VR: Datum>(
    ctx: &mut ProcessorContext<'_, K, VR>,
    record: Record<K, V>,
    join: impl FnOnce(V) -> Option<VR>,
) {
    match join(record.value) {
        Some(value) => ctx.forward(Record {
            key: record.key,
            value,
            timestamp: record.timestamp,
            headers: record.headers,
        }),
        None => ctx.record_dropped("unmatched_join"),
    }
}

impl<K: Datum + Clone, V: Datum + Clone> KStream<K, V> {
    /// Joins each record with the table's current value for its key (Kafka Streams'
    /// `join(KTable, ValueJoiner)`): `joiner(value, table_value)` becomes the value, key and
    /// timestamp stay the record's. A record whose key is absent from the table produces
    /// nothing and is counted (`rill_discarded_records_total{reason="unmatched_join"}`); one
    /// without a key is dropped (`null_key`). See [`crate::dsl::join`].
    pub fn join<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        joiner: impl Fn(V, VT) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: JoinFn<V, VT, VR> = Arc::new(move |v, t| t.map(|t| joiner(v, t)));
        self.join_table(table, "join", joiner, false)
    }

    /// Like [`KStream::join`], but every record produces a result: `joiner(value, None)` when
    /// the table has no value for its key or it has no key (Kafka Streams' `leftJoin`).
    pub fn left_join<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        joiner: impl Fn(V, Option<VT>) -> VR + Send + Sync + 'static,
    ) -> KStream<K, VR>
    where
        VT: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: JoinFn<V, VT, VR> = Arc::new(move |v, t| Some(joiner(v, t)));
        self.join_table(table, "left-join", joiner, true)
    }

    fn join_table<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        op: &str,
        joiner: JoinFn<V, VT, VR>,
        left: bool,
    ) -> KStream<K, VR>
    where
        VT: Datum + Clone,
        VR: Datum + Clone,
    {
        // Every record of a key must meet the table's range of that key. The keys have the
        // table's type: without a key serde of its own, the stream takes the table's.
        let stream = co_partitioned(self, table.stream.key_serde.clone());
        let hint = "Materialized::with on the table";
        let Some((key_serde, lookup)) = table.lookup(hint) else {
            // The error is recorded; `build` reports it.
            return stream.stateless(op, false, |_, _| {});
        };
        let store = table.store.clone();
        let (st, versioned) = (store.clone(), table.versioned);
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, K, VR>::new(StreamTableJoin {
                store: st.clone(),
                key_serde: key_serde.clone(),
                lookup: lookup.clone(),
                joiner: joiner.clone(),
                left,
                versioned,
            }))
        });
        let mut joined: KStream<K, VR> =
            stream.add_processor(None, op, supplier, vec![store], vec![stream.node], false);
        joined.key_serde = stream.key_serde.clone();
        joined
    }
}
