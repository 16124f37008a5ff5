//! Foreign-key table joins: [`KTable::join_on_foreign_key`] and
//! [`KTable::left_join_on_foreign_key`] (Kafka Streams' `KTable.join(other,
//! foreignKeyExtractor, joiner, ..)`, KIP-213).
//!
//! The left table (key `K`) and the right table (key `KO`) need not be co-partitioned: each left
//! value names a right key, and the join runs in three steps as in Kafka Streams, through two
//! internal topics:
//! 1. **subscribe** (beside the left table): each left update sends a [`Subscription`] to its
//!    foreign key through `<name>-subscription-registration-repartition`: the left key, a hash
//!    of the new left value and what to answer (see [`Instruction`]); a foreign key that
//!    changed also unsubscribes from the old one;
//! 2. **answer** (beside the right table, partitioned like it): subscriptions are kept in the
//!    store `<name>-subscription-store` under (foreign key, left key); each one, and each update
//!    of the right table for every subscription of its key (a prefix scan), sends a
//!    [`Response`] with the right value to the left key through
//!    `<name>-subscription-response-repartition`, to the partition the left record came from
//!    (the subscription carries it, [`PARTITION_HEADER`]), so a left topic written with any
//!    partitioner gets its answers;
//! 3. **resolve** (beside the left table again): a response whose hash is not the current left
//!    value's is stale (the left value changed since) and dropped; otherwise the result
//!    `joiner(left, right)` is stored in the result's store (the `Materialized`) and passed on
//!    as a change, or deleted when the join has none (inner join without a right value, or the
//!    left value deleted).
//!
//! A left value whose foreign key is `None` has no inner result and the left join's result
//! `joiner(value, None)` (Kafka Streams' left join since KIP-962), set at once. Where rill differs from Kafka Streams: the value hash is xxh3-128 of the left
//! value's serialized bytes (Kafka Streams: murmur3-128); the result carries the timestamp of
//! the update that triggered it; the result is always materialized.

use std::sync::Arc;

use super::change::Change;
use super::table_join::{result_table, JoinResult, OtherTable};
use super::{KStream, KTable, Materialized};
use crate::graph::Supplier;
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::{Headers, Record, PARTITION_HEADER};
use crate::serdes::{Serde, SerdeError};
use crate::store::StoreKind;

/// What a subscription asks of the foreign key's side (Kafka Streams' `SubscriptionWrapper
/// .Instruction`, same byte values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instruction {
    /// Unsubscribe; answer nothing (the left value moved to another foreign key).
    DeleteKeyNoPropagate = 0,
    /// Unsubscribe and answer "no value" (the left value was deleted).
    DeleteKeyAndPropagate = 1,
    /// Subscribe; answer the right value, or "no value" when there is none.
    PropagateNullIfNoFkValAvailable = 2,
    /// Subscribe; answer only when there is a right value (a new left key of an inner join).
    PropagateOnlyIfFkValAvailable = 3,
}

impl Instruction {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => Instruction::DeleteKeyNoPropagate,
            1 => Instruction::DeleteKeyAndPropagate,
            2 => Instruction::PropagateNullIfNoFkValAvailable,
            3 => Instruction::PropagateOnlyIfFkValAvailable,
            _ => return None,
        })
    }
}

/// A left key's subscription to a foreign key: what travels on the registration topic and
/// what the subscription store keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// What to answer.
    pub instruction: Instruction,
    /// Hash of the left value that sent it (`None` for a deleted one).
    pub hash: Option<u128>,
    /// The left key, serialized.
    pub left_key: Vec<u8>,
    /// The partition of the left record: where the answer goes (the left topic may not be
    /// partitioned as rill would partition the response topic).
    pub partition: u32,
}

/// A right value on its way back to a left key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response<VO> {
    /// The subscription's hash of the left value.
    pub hash: Option<u128>,
    /// The right table's value (`None`: it has none).
    pub value: Option<VO>,
}

/// Writes an optional hash: a flag byte, then 16 bytes when set.
fn put_hash(out: &mut Vec<u8>, hash: Option<u128>) {
    match hash {
        Some(h) => {
            out.push(1);
            out.extend_from_slice(&h.to_be_bytes());
        }
        None => out.push(0),
    }
}

/// Reads what [`put_hash`] wrote; the rest of the bytes after it.
fn take_hash<'a>(
    bytes: &'a [u8],
    what: &'static str,
) -> Result<(Option<u128>, &'a [u8]), SerdeError> {
    let bad = || SerdeError::new(what, "truncated hash");
    match bytes.split_first() {
        Some((0, rest)) => Ok((None, rest)),
        Some((1, rest)) => {
            let h = rest
                .get(..16)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?;
            Ok((Some(u128::from_be_bytes(h)), &rest[16..]))
        }
        _ => Err(bad()),
    }
}

/// [`Subscription`] bytes: the instruction byte, the hash, the partition (4 bytes, big-endian),
/// then the left key.
#[derive(Clone, Copy, Debug, Default)]
pub struct SubscriptionSerde;

impl Serde<Subscription> for SubscriptionSerde {
    fn serialize(&self, s: &Subscription) -> Result<Vec<u8>, SerdeError> {
        let mut out = Vec::with_capacity(18 + s.left_key.len());
        out.push(s.instruction as u8);
        put_hash(&mut out, s.hash);
        out.extend_from_slice(&s.partition.to_be_bytes());
        out.extend_from_slice(&s.left_key);
        Ok(out)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Subscription, SerdeError> {
        let (&b, rest) = bytes
            .split_first()
            .ok_or_else(|| SerdeError::new("SubscriptionSerde", "empty subscription"))?;
        let instruction = Instruction::from_byte(b)
            .ok_or_else(|| SerdeError::new("SubscriptionSerde", "unknown instruction byte"))?;
        let (hash, rest) = take_hash(rest, "SubscriptionSerde")?;
        let partition = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .ok_or_else(|| SerdeError::new("SubscriptionSerde", "truncated partition"))?;
        Ok(Subscription {
            instruction,
            hash,
            left_key: rest[4..].to_vec(),
            partition,
        })
    }
}

/// [`Response`] bytes: the hash, a flag byte for the value, then the value's bytes.
pub struct ResponseSerde<VO>(pub Arc<dyn Serde<VO>>);

impl<VO: 'static> Serde<Response<VO>> for ResponseSerde<VO> {
    fn serialize(&self, r: &Response<VO>) -> Result<Vec<u8>, SerdeError> {
        let mut out = Vec::new();
        put_hash(&mut out, r.hash);
        match &r.value {
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&self.0.serialize(v)?);
            }
            None => out.push(0),
        }
        Ok(out)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Response<VO>, SerdeError> {
        let (hash, rest) = take_hash(bytes, "ResponseSerde")?;
        let value = match rest.split_first() {
            Some((0, _)) => None,
            Some((1, v)) => Some(self.0.deserialize(v)?),
            _ => return Err(SerdeError::new("ResponseSerde", "missing value flag")),
        };
        Ok(Response { hash, value })
    }
}

/// The subscription store's key: the foreign key's length (4 bytes, big-endian), its bytes,
/// then the left key's; every subscription of a foreign key shares the first part.
fn combined_key(fk: &[u8], left_key: &[u8]) -> Vec<u8> {
    let mut out = fk_prefix(fk);
    out.extend_from_slice(left_key);
    out
}

/// The prefix of every subscription store key of foreign key `fk`.
fn fk_prefix(fk: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + fk.len());
    out.extend_from_slice(&(fk.len() as u32).to_be_bytes());
    out.extend_from_slice(fk);
    out
}

/// `headers` with the [`PARTITION_HEADER`] that sends a response to the left record's partition.
fn to_partition(mut headers: Headers, partition: u32) -> Headers {
    headers.remove(PARTITION_HEADER);
    headers.add(PARTITION_HEADER, partition.to_be_bytes().to_vec());
    headers
}

/// The hash a subscription carries of a left value's bytes.
fn value_hash(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// A left value's foreign key.
type ForeignKey<V, KO> = Arc<dyn Fn(&V) -> Option<KO> + Send + Sync>;

/// The result from a left value and the right value, `None` when the join kind has none.
type FkJoiner<V, VO, VR> = Arc<dyn Fn(V, Option<VO>) -> Option<VR> + Send + Sync>;

/// Step 1: a left update's subscriptions.
#[derive(Clone)]
struct Subscribe<K, V, KO> {
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
    fk_serde: Arc<dyn Serde<KO>>,
    extract: ForeignKey<V, KO>,
    left_join: bool,
}

impl<K, V, KO> Processor<K, Change<V>, KO, Subscription> for Subscribe<K, V, KO>
where
    K: Datum + Clone,
    V: Datum + Clone,
    KO: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<K, Change<V>>,
        ctx: &mut ProcessorContext<'_, KO, Subscription>,
    ) -> Result<(), ProcessError> {
        let Some(key) = &record.key else {
            return Ok(());
        };
        let s = &*self;
        let left_key = self.key_serde.serialize(key)?;
        let hash = match &record.value.new {
            Some(v) => Some(value_hash(&s.value_serde.serialize(v)?)),
            None => None,
        };
        let partition = ctx.record_meta().partition;
        let mut send = |fk: KO, instruction: Instruction| {
            ctx.forward(Record {
                key: Some(fk),
                value: Subscription {
                    instruction,
                    hash,
                    left_key: left_key.clone(),
                    partition,
                },
                timestamp: record.timestamp,
                headers: record.headers.clone(),
            });
        };
        let old_fk = record.value.old.as_ref().and_then(|v| (s.extract)(v));
        let new_fk = record.value.new.as_ref().map(|v| (s.extract)(v));
        match (new_fk, old_fk) {
            // The row is deleted: unsubscribe, and its result goes.
            (None, Some(old_fk)) => send(old_fk, Instruction::DeleteKeyAndPropagate),
            (Some(Some(new_fk)), old_fk) => {
                if let Some(old_fk) = old_fk {
                    if s.fk_serde.serialize(&old_fk)? != s.fk_serde.serialize(&new_fk)? {
                        send(old_fk, Instruction::DeleteKeyNoPropagate);
                    }
                }
                // A row that existed may have a result to unset when the new foreign key has
                // no value (an inner join's) or to replace (a left join's).
                let instruction = if s.left_join || record.value.old.is_some() {
                    Instruction::PropagateNullIfNoFkValAvailable
                } else {
                    Instruction::PropagateOnlyIfFkValAvailable
                };
                send(new_fk, instruction);
            }
            // The new value has no foreign key: unsubscribe; `NoForeignKey` answers.
            (Some(None), Some(old_fk)) => send(old_fk, Instruction::DeleteKeyNoPropagate),
            (Some(None), None) | (None, None) => {}
        }
        Ok(())
    }
}

/// Step 1 for a row whose value has no foreign key (or that is deleted after one without): its
/// result is set at once, as for a right value of `None` (an answer in flight for an older
/// value of the row fails the hash check when it arrives).
#[derive(Clone)]
struct NoForeignKey<K, V, KO, VO, VR> {
    key_serde: Arc<dyn Serde<K>>,
    extract: ForeignKey<V, KO>,
    result_store: String,
    result_serde: Arc<dyn Serde<VR>>,
    joiner: FkJoiner<V, VO, VR>,
}

impl<K, V, KO, VO, VR> Processor<K, Change<V>, K, Change<VR>> for NoForeignKey<K, V, KO, VO, VR>
where
    K: Datum + Clone,
    V: Datum + Clone,
    KO: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<K, Change<V>>,
        ctx: &mut ProcessorContext<'_, K, Change<VR>>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            return Ok(());
        };
        let new = match (record.value.new, &record.value.old) {
            (Some(v), _) if (self.extract)(&v).is_none() => (self.joiner)(v, None),
            (None, Some(old)) if (self.extract)(old).is_none() => None,
            _ => return Ok(()),
        };
        let kb = self.key_serde.serialize(&key)?;
        let result = JoinResult {
            store: &self.result_store,
            serde: &*self.result_serde,
        };
        result.set(ctx, key, &kb, new, record.timestamp, record.headers)
    }
}

/// Step 2, for subscriptions: keeps them and answers with the right table's value.
#[derive(Clone)]
struct Answer<K, KO, VO> {
    store: String,
    right: OtherTable<KO, VO>,
    fk_serde: Arc<dyn Serde<KO>>,
    key_serde: Arc<dyn Serde<K>>,
}

impl<K, KO, VO> Processor<KO, Subscription, K, Response<VO>> for Answer<K, KO, VO>
where
    K: Datum + Clone,
    KO: Datum + Clone,
    VO: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<KO, Subscription>,
        ctx: &mut ProcessorContext<'_, K, Response<VO>>,
    ) -> Result<(), ProcessError> {
        let Some(fk) = &record.key else {
            return Ok(());
        };
        let sub = record.value;
        let fkb = self.fk_serde.serialize(fk)?;
        let stored = combined_key(&fkb, &sub.left_key);
        let store = ctx.store(&self.store)?;
        match sub.instruction {
            Instruction::DeleteKeyNoPropagate | Instruction::DeleteKeyAndPropagate => {
                store.delete(&stored)?
            }
            _ => store.put(&stored, &SubscriptionSerde.serialize(&sub)?)?,
        }
        let value = match sub.instruction {
            Instruction::DeleteKeyNoPropagate => return Ok(()),
            Instruction::DeleteKeyAndPropagate => None,
            _ => self.right.read(ctx, fk, &fkb)?,
        };
        if sub.instruction == Instruction::PropagateOnlyIfFkValAvailable && value.is_none() {
            return Ok(());
        }
        ctx.forward(Record {
            key: Some(self.key_serde.deserialize(&sub.left_key)?),
            value: Response {
                hash: sub.hash,
                value,
            },
            timestamp: record.timestamp,
            headers: to_partition(record.headers, sub.partition),
        });
        Ok(())
    }
}

/// Step 2, for right updates: answers every subscription of the updated key.
#[derive(Clone)]
struct Notify<K, KO> {
    store: String,
    fk_serde: Arc<dyn Serde<KO>>,
    key_serde: Arc<dyn Serde<K>>,
}

impl<K, KO, VO> Processor<KO, Change<VO>, K, Response<VO>> for Notify<K, KO>
where
    K: Datum + Clone,
    KO: Datum + Clone,
    VO: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<KO, Change<VO>>,
        ctx: &mut ProcessorContext<'_, K, Response<VO>>,
    ) -> Result<(), ProcessError> {
        let Some(fk) = &record.key else {
            return Ok(());
        };
        let prefix = fk_prefix(&self.fk_serde.serialize(fk)?);
        let subscriptions = ctx.store(&self.store)?.prefix_scan(&prefix)?;
        for (_, bytes) in subscriptions {
            let sub = SubscriptionSerde.deserialize(&bytes)?;
            ctx.forward(Record {
                key: Some(self.key_serde.deserialize(&sub.left_key)?),
                value: Response {
                    hash: sub.hash,
                    value: record.value.new.clone(),
                },
                timestamp: record.timestamp,
                headers: to_partition(record.headers.clone(), sub.partition),
            });
        }
        Ok(())
    }
}

/// Step 3: a response against the left table's current value, into the result's store.
#[derive(Clone)]
struct Resolve<K, V, VO, VR> {
    left: OtherTable<K, V>,
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
    result_store: String,
    result_serde: Arc<dyn Serde<VR>>,
    joiner: FkJoiner<V, VO, VR>,
}

impl<K, V, VO, VR> Processor<K, Response<VO>, K, Change<VR>> for Resolve<K, V, VO, VR>
where
    K: Datum + Clone,
    V: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    fn process(
        &mut self,
        record: Record<K, Response<VO>>,
        ctx: &mut ProcessorContext<'_, K, Change<VR>>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            return Ok(());
        };
        let kb = self.key_serde.serialize(&key)?;
        let current = self.left.read(ctx, &key, &kb)?;
        let current_hash = match &current {
            Some(v) => Some(value_hash(&self.value_serde.serialize(v)?)),
            None => None,
        };
        if current_hash != record.value.hash {
            // The left value changed since this subscription: its own response follows.
            return Ok(());
        }
        let new = current.and_then(|v| (self.joiner)(v, record.value.value));
        let result = JoinResult {
            store: &self.result_store,
            serde: &*self.result_serde,
        };
        result.set(ctx, key, &kb, new, record.timestamp, record.headers)
    }
}

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// The table of `joiner(value, other_value)` for each key of this table whose value's
    /// foreign key (`foreign_key(value)`) is a key of `other` (Kafka Streams' foreign-key
    /// `KTable.join(other, foreignKeyExtractor, joiner, Materialized)`), kept in the store
    /// `materialized` names. The tables need not be co-partitioned. See
    /// [`crate::dsl::fk_join`].
    pub fn join_on_foreign_key<KO, VO, VR>(
        &self,
        other: &KTable<KO, VO>,
        foreign_key: impl Fn(&V) -> Option<KO> + Send + Sync + 'static,
        joiner: impl Fn(V, VO) -> VR + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, VR>>,
    ) -> KTable<K, VR>
    where
        KO: Datum + Clone,
        VO: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: FkJoiner<V, VO, VR> = Arc::new(move |v, vo| vo.map(|vo| joiner(v, vo)));
        self.join_foreign(
            other,
            Arc::new(foreign_key),
            joiner,
            false,
            materialized.into(),
        )
    }

    /// Like [`KTable::join_on_foreign_key`], for every key of this table with a foreign key:
    /// `joiner(value, None)` when `other` lacks it (Kafka Streams' foreign-key `leftJoin`).
    pub fn left_join_on_foreign_key<KO, VO, VR>(
        &self,
        other: &KTable<KO, VO>,
        foreign_key: impl Fn(&V) -> Option<KO> + Send + Sync + 'static,
        joiner: impl Fn(V, Option<VO>) -> VR + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, VR>>,
    ) -> KTable<K, VR>
    where
        KO: Datum + Clone,
        VO: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: FkJoiner<V, VO, VR> = Arc::new(move |v, vo| Some(joiner(v, vo)));
        self.join_foreign(
            other,
            Arc::new(foreign_key),
            joiner,
            true,
            materialized.into(),
        )
    }

    fn join_foreign<KO, VO, VR>(
        &self,
        other: &KTable<KO, VO>,
        extract: ForeignKey<V, KO>,
        joiner: FkJoiner<V, VO, VR>,
        left_join: bool,
        materialized: Materialized<K, VR>,
    ) -> KTable<K, VR>
    where
        KO: Datum + Clone,
        VO: Datum + Clone,
        VR: Datum + Clone,
    {
        let builder = self.stream.builder.clone();
        let hint = "Materialized::with on the tables and the join";
        let op = if left_join { "fk-left-join" } else { "fk-join" };
        let store = builder
            .inner
            .borrow_mut()
            .materialized_store(&materialized, op);
        let Some((this_changes, other_changes)) = self.changes_with(other) else {
            return self.dangling(store);
        };
        let serdes = (
            self.stream.key_serde.clone(),
            self.stream.value_serde.clone(),
            other.stream.key_serde.clone(),
            other.stream.value_serde.clone(),
            materialized.value_serde.clone(),
            self.lookup(hint),
            other.lookup(hint),
        );
        let (
            Some(key_serde),
            Some(value_serde),
            Some(fk_serde),
            Some(right_serde),
            Some(result_serde),
            Some((_, left_lookup)),
            Some((_, right_lookup)),
        ) = serdes
        else {
            builder
                .inner
                .borrow_mut()
                .missing_serde(self.stream.node, "key or value", hint);
            return self.dangling(store);
        };
        let subscriptions = format!("{store}-subscription-store");
        {
            let mut g = builder.inner.borrow_mut();
            g.add_store(&store, StoreKind::KeyValue);
            g.add_store(&subscriptions, StoreKind::KeyValue);
        }
        // 1. Subscribe, through the registration topic (partitioned by the foreign key).
        let no_foreign_key = NoForeignKey {
            key_serde: key_serde.clone(),
            extract: extract.clone(),
            result_store: store.clone(),
            result_serde: result_serde.clone(),
            joiner: joiner.clone(),
        };
        let subscribe = Subscribe {
            key_serde: key_serde.clone(),
            value_serde: value_serde.clone(),
            fk_serde: fk_serde.clone(),
            extract,
            left_join,
        };
        let sent: KStream<KO, Subscription> = node(
            this_changes,
            &format!("{op}-subscribe"),
            move || subscribe.clone(),
            vec![],
        );
        let registration = sent.through_repartition_topic(
            &format!("{store}-subscription-registration"),
            fk_serde.clone(),
            Arc::new(SubscriptionSerde),
        );
        let registered = KStream::<KO, Subscription> {
            builder: builder.clone(),
            node: registration,
            key_serde: Some(fk_serde.clone()),
            value_serde: Some(Arc::new(SubscriptionSerde)),
            key_changed: false,
        };
        // 2. Answer subscriptions and right updates, through the response topic (partitioned
        // by the left key).
        let answer = Answer {
            store: subscriptions.clone(),
            right: OtherTable {
                store: other.store.clone(),
                versioned: other.versioned,
                lookup: right_lookup,
            },
            fk_serde: fk_serde.clone(),
            key_serde: key_serde.clone(),
        };
        let answered: KStream<K, Response<VO>> = node(
            &registered,
            &format!("{op}-answer"),
            move || answer.clone(),
            vec![subscriptions.clone(), other.store.clone()],
        );
        let notify = Notify {
            store: subscriptions.clone(),
            fk_serde,
            key_serde: key_serde.clone(),
        };
        let notified: KStream<K, Response<VO>> = node(
            other_changes,
            &format!("{op}-notify"),
            move || notify.clone(),
            vec![subscriptions],
        );
        let responses = answered.merge(&notified);
        let response_serde: Arc<dyn Serde<Response<VO>>> = Arc::new(ResponseSerde(right_serde));
        let response_source = responses.through_repartition_topic(
            &format!("{store}-subscription-response"),
            key_serde.clone(),
            response_serde.clone(),
        );
        let responses = KStream::<K, Response<VO>> {
            builder: builder.clone(),
            node: response_source,
            key_serde: Some(key_serde.clone()),
            value_serde: Some(response_serde),
            key_changed: false,
        };
        // 3. Resolve against the current left value.
        let resolve = Resolve {
            left: OtherTable {
                store: self.store.clone(),
                versioned: self.versioned,
                lookup: left_lookup,
            },
            key_serde: key_serde.clone(),
            value_serde,
            result_store: store.clone(),
            result_serde: result_serde.clone(),
            joiner,
        };
        let resolved: KStream<K, Change<VR>> = node(
            &responses,
            &format!("{op}-resolve"),
            move || resolve.clone(),
            vec![self.store.clone(), store.clone()],
        );
        let direct: KStream<K, Change<VR>> = node(
            this_changes,
            &format!("{op}-no-foreign-key"),
            move || no_foreign_key.clone(),
            vec![store.clone()],
        );
        result_table(resolved.merge(&direct), key_serde, result_serde, store)
    }
}

/// Adds a processor made by `make` below `input`, with access to `stores`.
fn node<KI, VI, KO2, VO2, P>(
    input: &KStream<KI, VI>,
    op: &str,
    make: impl Fn() -> P + Send + Sync + 'static,
    stores: Vec<String>,
) -> KStream<KO2, VO2>
where
    KI: Datum + Clone,
    VI: Datum + Clone,
    KO2: Datum + Clone,
    VO2: Datum + Clone,
    P: Processor<KI, VI, KO2, VO2> + 'static,
{
    let supplier: Supplier = Arc::new(move || Box::new(Typed::<P, KI, VI, KO2, VO2>::new(make())));
    input.add_processor(None, op, supplier, stores, vec![input.node], true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serdes::StringSerde;

    #[test]
    fn subscriptions_and_responses_round_trip() {
        for hash in [None, Some(0u128), Some(u128::MAX)] {
            for instruction in [
                Instruction::DeleteKeyNoPropagate,
                Instruction::DeleteKeyAndPropagate,
                Instruction::PropagateNullIfNoFkValAvailable,
                Instruction::PropagateOnlyIfFkValAvailable,
            ] {
                let s = Subscription {
                    instruction,
                    hash,
                    left_key: b"k1".to_vec(),
                    partition: 7,
                };
                let bytes = SubscriptionSerde.serialize(&s).unwrap();
                assert_eq!(SubscriptionSerde.deserialize(&bytes).unwrap(), s);
            }
            let serde = ResponseSerde(Arc::new(StringSerde) as Arc<dyn Serde<String>>);
            for value in [None, Some(String::new()), Some("gold".to_string())] {
                let r = Response { hash, value };
                assert_eq!(serde.deserialize(&serde.serialize(&r).unwrap()).unwrap(), r);
            }
        }
        assert!(SubscriptionSerde.deserialize(&[9, 0]).is_err());
        assert!(SubscriptionSerde.deserialize(&[2, 1, 0]).is_err());
        assert!(
            SubscriptionSerde.deserialize(&[2, 0, 0, 0]).is_err(),
            "no partition"
        );
    }

    #[test]
    fn a_foreign_key_prefix_never_matches_a_longer_key() {
        let k = combined_key(b"ab", b"c");
        assert!(k.starts_with(&fk_prefix(b"ab")));
        assert!(!k.starts_with(&fk_prefix(b"a")));
        assert!(!combined_key(b"abc", b"").starts_with(&fk_prefix(b"ab")));
    }
}
