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
//! With [`Joined::with_grace_period`] (KIP-923, versioned tables only) each stream record waits
//! in a buffer store (`<join node>-buffer`) until the stream's time passes its timestamp by the
//! grace period; the records due then join in timestamp order, each with the table as of its
//! timestamp, so a table update up to `grace` late still meets them. A record older than the
//! stream's time minus the grace period joins at once, as in Kafka Streams. The stream's time
//! is the task's, as every window of rill keeps it (`crate::time`): the partition's at the
//! record's offset, whatever the factor, committed with the range, and handed to a quiet range
//! by a tick, which releases what is due then. So a record is released at the same offset as
//! at P = 1, across factor changes, restarts and replays. Where rill differs from Kafka Streams
//! on purpose: Kafka Streams' join keeps its own time, over the stream side's records only;
//! rill's task time counts the table's records too, so a table whose timestamps run ahead of
//! the stream releases the waiting records earlier (an out-of-order table update older than
//! that time minus the grace period then misses them). Released records carry no headers.
//!
//! The two topics' records reach the join in timestamp order when both are already populated
//! (`max.task.idle.ms`, see `rill_runtime::kafka::time_sync`), so each stream record meets the
//! table as it was at its timestamp.

use std::ops::Bound;
use std::sync::Arc;

use super::stream_join::co_partitioned;
use super::table_view::TableLookup;
use super::{Joined, KStream, KTable, TopologyError};
use crate::graph::Supplier;
use crate::keyrange::key_hash;
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::{Headers, Record};
use crate::serdes::{Serde, SerdeError};
use crate::store::{KeyValueBytes, StoreKind};
use crate::versioned::VersionedBytes;
use crate::window::{time_bytes, time_from};

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
    /// With a grace period: where records wait.
    buffer: Option<GraceBuffer<K, V>>,
}

/// Buffer entries: `'b' T(timestamp) topic-hash offset n -> key length (4) key value`, in
/// timestamp order. (Stores written before the buffer took the task's time also hold a `'t'`
/// entry, its own time then: it is no longer read.)
const HELD: u8 = b'b';

/// Held records due for their join, each with its key's routing hash.
type Due<K, V> = Vec<(Record<K, V>, Option<u64>)>;

/// The grace period's buffer of a join (see the module doc).
struct GraceBuffer<K, V> {
    store: String,
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
    grace_ms: i64,
    /// (input topic hash, offset, records of that offset held so far): tells apart records of
    /// one timestamp, the same way when the input is replayed.
    last: Option<(u64, u64, u32)>,
}

impl<K: Datum + Clone, V: Datum + Clone> GraceBuffer<K, V> {
    /// Holds `record`, or returns it when it is too old to wait (older than `now`, the stream
    /// time, minus the grace period) or has no key (a left join passes it through at once).
    fn hold<KO, VO>(
        &mut self,
        record: Record<K, V>,
        now: i64,
        ctx: &mut ProcessorContext<'_, KO, VO>,
    ) -> Result<Option<Record<K, V>>, ProcessError> {
        let Some(key) = record.key.as_ref() else {
            return Ok(Some(record));
        };
        let ts = record.timestamp;
        if ts < now.saturating_sub(self.grace_ms) {
            return Ok(Some(record));
        }
        let kb = self.key_serde.serialize(key)?;
        let meta = ctx.record_meta();
        let (topic, offset) = (key_hash(meta.topic.as_bytes()), meta.offset);
        let n = match self.last {
            Some((t, o, n)) if (t, o) == (topic, offset) => n + 1,
            _ => 0,
        };
        self.last = Some((topic, offset, n));
        let mut entry = Vec::with_capacity(29);
        entry.push(HELD);
        entry.extend_from_slice(&time_bytes(ts));
        entry.extend_from_slice(&topic.to_be_bytes());
        entry.extend_from_slice(&offset.to_be_bytes());
        entry.extend_from_slice(&n.to_be_bytes());
        let key_len = u32::try_from(kb.len())
            .map_err(|_| SerdeError::new("join buffer", "a key longer than 4 GiB"))?;
        let mut held = key_len.to_be_bytes().to_vec();
        held.extend_from_slice(&kb);
        held.extend_from_slice(&self.value_serde.serialize(&record.value)?);
        ctx.store(&self.store)?.put(&entry, &held)?;
        Ok(None)
    }

    /// Takes the records due at stream time `now` (held at or before `now - grace`), in
    /// timestamp order, each with the routing hash of its key (they may be other keys' than the
    /// record being processed: their joins' writes belong to their own keys' ranges).
    fn take_due(&self, store: &mut dyn KeyValueBytes, now: i64) -> Result<Due<K, V>, ProcessError> {
        let bound = now.saturating_sub(self.grace_ms);
        let upper = bound.checked_add(1).map(|b| {
            let mut u = vec![HELD];
            u.extend_from_slice(&time_bytes(b));
            u
        });
        let to = upper
            .as_deref()
            .map_or(Bound::Excluded(&[HELD + 1][..]), Bound::Excluded);
        let mut due = Vec::new();
        for (k, v) in store.range(Bound::Included(&[HELD][..]), to)? {
            let hash = store.routing_hash_of(&k)?;
            store.delete(&k)?;
            due.push((self.decode(&k, &v)?, hash));
        }
        Ok(due)
    }

    /// The record of a held entry.
    fn decode(&self, entry: &[u8], held: &[u8]) -> Result<Record<K, V>, ProcessError> {
        let corrupt = || SerdeError::new("join buffer", "a held entry is cut short");
        let timestamp = entry.get(1..9).and_then(time_from).ok_or_else(corrupt)?;
        let len = held
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .ok_or_else(corrupt)?;
        let split = usize::try_from(len).map_err(|_| corrupt())? + 4;
        let (kb, vb) = (
            held.get(4..split).ok_or_else(corrupt)?,
            held.get(split..).ok_or_else(corrupt)?,
        );
        Ok(Record {
            key: Some(self.key_serde.deserialize(kb)?),
            value: self.value_serde.deserialize(vb)?,
            timestamp,
            headers: Headers::new(),
        })
    }
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
        let Some(buffer) = self.buffer.as_mut() else {
            return self.join_one(record, None, ctx);
        };
        let now = ctx
            .current_stream_time()
            .map_or(record.timestamp, |t| t.max(record.timestamp));
        if let Some(record) = buffer.hold(record, now, ctx)? {
            self.join_one(record, None, ctx)?;
        }
        self.release_due(now, ctx)
    }

    fn on_stream_time(
        &mut self,
        ctx: &mut ProcessorContext<'_, K, VR>,
    ) -> Result<(), ProcessError> {
        match ctx.current_stream_time() {
            Some(now) if self.buffer.is_some() => self.release_due(now, ctx),
            _ => Ok(()),
        }
    }
}

impl<K, V, VT, VR> StreamTableJoin<K, V, VT, VR>
where
    K: Datum + Clone,
    V: Datum + Clone,
    VT: Datum + Clone,
    VR: Datum + Clone,
{
    /// Joins the records of the grace buffer due at stream time `now`.
    fn release_due(
        &self,
        now: i64,
        ctx: &mut ProcessorContext<'_, K, VR>,
    ) -> Result<(), ProcessError> {
        let Some(buffer) = self.buffer.as_ref() else {
            return Ok(());
        };
        for (record, hash) in buffer.take_due(ctx.store(&buffer.store)?, now)? {
            self.join_one(record, hash, ctx)?;
        }
        Ok(())
    }

    /// Joins `record` with the table (as of its timestamp when versioned) and forwards it,
    /// about the key of routing hash `hash` when it is not the processed record's.
    fn join_one(
        &self,
        record: Record<K, V>,
        hash: Option<u64>,
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
        forward_joined(ctx, record, hash, |v| (self.joiner)(v, table));
        Ok(())
    }
}

/// Forwards `join(value)` with the record's key and timestamp (about the key of routing hash
/// `hash`, when given: see [`ProcessorContext::forward_about`]), or counts the record as
/// unmatched when it is `None`.
pub(super) fn forward_joined<K: Datum, V, VR: Datum>(
    ctx: &mut ProcessorContext<'_, K, VR>,
    record: Record<K, V>,
    hash: Option<u64>,
    join: impl FnOnce(V) -> Option<VR>,
) {
    match join(record.value) {
        Some(value) => ctx.forward_about(
            Record {
                key: record.key,
                value,
                timestamp: record.timestamp,
                headers: record.headers,
            },
            hash,
        ),
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
        self.join_with(table, joiner, Joined::default())
    }

    /// [`KStream::join`] as `joined` says: the node's name, and a grace period for a versioned
    /// table ([`Joined::with_grace_period`]; Kafka Streams' `join(KTable, ValueJoiner, Joined)`).
    pub fn join_with<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        joiner: impl Fn(V, VT) -> VR + Send + Sync + 'static,
        joined: impl Into<Joined<K, V>>,
    ) -> KStream<K, VR>
    where
        VT: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: JoinFn<V, VT, VR> = Arc::new(move |v, t| t.map(|t| joiner(v, t)));
        self.join_table(table, "join", joiner, false, joined.into())
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
        self.left_join_with(table, joiner, Joined::default())
    }

    /// [`KStream::left_join`] as `joined` says (see [`KStream::join_with`]).
    pub fn left_join_with<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        joiner: impl Fn(V, Option<VT>) -> VR + Send + Sync + 'static,
        joined: impl Into<Joined<K, V>>,
    ) -> KStream<K, VR>
    where
        VT: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: JoinFn<V, VT, VR> = Arc::new(move |v, t| Some(joiner(v, t)));
        self.join_table(table, "left-join", joiner, true, joined.into())
    }

    fn join_table<VT, VR>(
        &self,
        table: &KTable<K, VT>,
        op: &str,
        joiner: JoinFn<V, VT, VR>,
        left: bool,
        joined: Joined<K, V>,
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
        let name = self
            .builder
            .inner
            .borrow_mut()
            .name_or_generated(joined.name.as_deref(), op);
        let mut stores = vec![store.clone()];
        let buffer = match joined.grace_ms {
            Some(grace_ms) => {
                let hint = "Joined::with(key_serde, value_serde) on the join";
                let serdes = stream.serdes_or_error(joined.key_serde, joined.value_serde, hint);
                let mut g = self.builder.inner.borrow_mut();
                if !versioned {
                    g.error(TopologyError::GraceNeedsVersionedTable {
                        node: name.clone(),
                        store: store.clone(),
                    });
                }
                let buffer_store = format!("{name}-buffer");
                g.add_store(&buffer_store, StoreKind::KeyValue);
                stores.push(buffer_store.clone());
                serdes.map(|(k, v)| (buffer_store, k, v, grace_ms.max(0)))
            }
            None => None,
        };
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, K, VR>::new(StreamTableJoin {
                store: st.clone(),
                key_serde: key_serde.clone(),
                lookup: lookup.clone(),
                joiner: joiner.clone(),
                left,
                versioned,
                buffer: buffer
                    .clone()
                    .map(|(store, key_serde, value_serde, grace_ms)| GraceBuffer {
                        store,
                        key_serde,
                        value_serde,
                        grace_ms,
                        last: None,
                    }),
            }))
        });
        let mut joined: KStream<K, VR> =
            stream.add_processor(Some(&name), op, supplier, stores, vec![stream.node], false);
        joined.key_serde = stream.key_serde.clone();
        joined
    }
}
