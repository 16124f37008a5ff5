//! The Processor API: user processors, the context they run in, and punctuation.
//!
//! Processors are typed for users ([`Processor`]) and type-erased inside the graph
//! ([`ErasedProcessor`]); values travel between nodes as [`Datum`] boxes, and the typed DSL
//! guarantees that every node receives the types it was built for.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::record::{Headers, Record};
use crate::serdes::{Serde, SerdeError};
use crate::store::{KeyValueBytes, KeyValueStore, StoreError, StoreKind, StoreSerdes, TimedStore};
use crate::stores::StoreDeclaration;
use crate::versioned::VersionedStore;
use crate::window::{SessionStore, WindowStore};

/// A value that can travel through a topology: any cloneable `Send` type.
pub trait Datum: Any + Send {
    /// Clones into a new box (fan-out to several children).
    fn clone_datum(&self) -> Box<dyn Datum>;
    /// Converts into `Box<dyn Any>` for downcasting by value.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    /// Borrows as `&dyn Any` for downcasting by reference.
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any + Send + Clone> Datum for T {
    fn clone_datum(&self) -> Box<dyn Datum> {
        Box::new(self.clone())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// Careful: `Box<dyn Datum>` is itself a `Datum` through the blanket impl, so call `as_any` on
// `**boxed` (the inner value), never on the box.
impl Clone for Box<dyn Datum> {
    fn clone(&self) -> Self {
        (**self).clone_datum()
    }
}

/// A record whose key and value types are erased.
pub type ErasedRecord = Record<Box<dyn Datum>, Box<dyn Datum>>;

/// Turns a typed record into an erased one.
pub fn erase<K: Datum, V: Datum>(r: Record<K, V>) -> ErasedRecord {
    Record {
        key: r.key.map(|k| Box::new(k) as Box<dyn Datum>),
        value: Box::new(r.value),
        timestamp: r.timestamp,
        headers: r.headers,
    }
}

/// Turns an erased record back into a typed one; fails only if the graph was wired wrongly.
pub fn unerase<K: 'static, V: 'static>(r: ErasedRecord) -> Result<Record<K, V>, ProcessError> {
    let key = match r.key {
        Some(k) => Some(*k.into_any().downcast::<K>().map_err(|_| {
            ProcessError::Internal(format!("key is not a {}", std::any::type_name::<K>()))
        })?),
        None => None,
    };
    let value = *r.value.into_any().downcast::<V>().map_err(|_| {
        ProcessError::Internal(format!("value is not a {}", std::any::type_name::<V>()))
    })?;
    Ok(Record {
        key,
        value,
        timestamp: r.timestamp,
        headers: r.headers,
    })
}

/// Why a processor failed on a record.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A value could not be (de)serialized inside the topology.
    #[error(transparent)]
    Serde(#[from] SerdeError),
    /// The user's processor reported an error (any error type: `ProcessError::User(e.into())`,
    /// or `"message".into()`).
    #[error("processor failed: {0}")]
    User(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The processor panicked; the panic was caught (the message is the panic's).
    #[error("processor panicked: {0}")]
    Panicked(String),
    /// A failure worth trying again (a call of an async stage timed out, a service was briefly
    /// unavailable): the call is retried up to `retry.max.attempts` times, with exponential
    /// backoff from `retry.backoff.ms`, before the processing handler decides. Make one with
    /// [`ProcessError::retryable`].
    #[error("retryable failure: {0}")]
    Retryable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A `suppress` buffer configured with `shutdown_when_full` is full (Kafka Streams stops the
    /// same way).
    #[error("suppression buffer `{store}` is full ({limit}); raise the limit, use BufferConfig::unbounded(), or emit_early_when_full()")]
    BufferFull {
        /// The buffer's store.
        store: String,
        /// The limit reached, e.g. `max_records 1000`.
        limit: String,
    },
    /// The topology was wired inconsistently (a bug in rill; please report it).
    #[error("internal error (please report): {0}")]
    Internal(String),
}

impl ProcessError {
    /// A failure that an async stage retries before the processing handler decides.
    pub fn retryable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ProcessError::Retryable(e.into())
    }
}

/// The clock a punctuation follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PunctuationType {
    /// The largest record timestamp the sub-task has seen.
    StreamTime,
    /// The system clock (the TestDriver's mocked clock in tests).
    WallClockTime,
}

/// Where the record being processed was read from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordMeta {
    /// Topic of the input record (resolved name).
    pub topic: std::sync::Arc<str>,
    /// Partition of the input record.
    pub partition: u32,
    /// Offset of the input record.
    pub offset: u64,
}

/// What the engine offers a processor node while it runs.
pub trait ProcessorHost {
    /// Sends a record to the node's children.
    fn forward(&mut self, record: ErasedRecord);
    /// Sends a record through the record cache: until the cache is flushed or evicts it, a later
    /// record with the same `key` from this node replaces it. `size` is its serialized key and
    /// value length; without a cache it is forwarded at once.
    fn forward_cached(&mut self, _key: Vec<u8>, _size: usize, record: ErasedRecord) {
        self.forward(record);
    }
    /// Sends a record about another key than the one being processed: the children's store
    /// writes carry `routing_hash` (that key's) instead of the processed record's.
    fn forward_about(&mut self, record: ErasedRecord, _routing_hash: u64) {
        self.forward(record);
    }
    /// Byte-level access to a store connected to the node.
    fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError>;
    /// What a `Stores` builder declared for store `name` (its serdes), if one did.
    fn store_declaration(&self, _name: &str) -> Option<&StoreDeclaration> {
        None
    }
    /// A connected window, session or buffer store with its layout, stream time and expiry
    /// position.
    fn timed_store(&mut self, name: &str) -> Result<TimedStore<'_>, StoreError>;
    /// The sub-task's stream time: the partition's stream time at the last record its key range
    /// took (the record being processed included).
    fn stream_time(&self) -> Option<i64>;
    /// Counts a record a windowed operation dropped because its windows had closed.
    fn late_record_dropped(&mut self, store: &str);
    /// Registers a punctuation every `interval`, from `init` or later.
    fn schedule(&mut self, interval: Duration, kind: PunctuationType) -> Cancellable;
    /// The schedule whose punctuation runs now (`None` outside `punctuate`).
    fn punctuation(&self) -> Option<&Cancellable> {
        None
    }
    /// Counts a record the node dropped on purpose (for example a null key).
    fn record_dropped(&mut self, reason: &'static str);
    /// The input record being processed (default values during punctuation).
    fn meta(&self) -> &RecordMeta;
    /// The value of `key` in global store `store` ([`crate::global`]).
    fn global_get(&mut self, store: &str, _key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Err(StoreError::UnknownStore(store.to_string()))
    }
}

/// What a processor can do besides forwarding: its stores, the stream time, punctuation, its
/// record's metadata. [`ProcessorContext`] and [`FixedKeyContext`] dereference to it.
pub struct TaskContext<'a> {
    host: &'a mut dyn ProcessorHost,
}

impl<'a> TaskContext<'a> {
    /// Byte-level access to a connected store.
    pub fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError> {
        self.host.store(name)
    }

    /// A connected key-value store, typed with the serdes it was declared with (Kafka Streams'
    /// `getStateStore`): a handle that does not hold the context, whose calls take it
    /// (`totals.get(ctx, &key)`, `totals.put(ctx, &key, &value)`); see [`KeyValueStore`].
    /// [`StoreError::WrongTypes`] when `K` and `V` are not its builder's.
    pub fn get_state_store<K: 'static, V: 'static>(
        &mut self,
        name: &str,
    ) -> Result<KeyValueStore<K, V>, StoreError> {
        let serdes = self.declared_as::<K, V>(name, StoreKind::KeyValue.name())?;
        Ok(KeyValueStore::with_serdes(serdes))
    }

    /// The declared serdes of connected store `name` as `K` and `V`, when it is a store of the
    /// kind named `expected` ([`StoreKind::name`]).
    fn declared_as<K: 'static, V: 'static>(
        &mut self,
        name: &str,
        expected: &'static str,
    ) -> Result<StoreSerdes<K, V>, StoreError> {
        // Connected at all: a misconfigured processor fails where it opens the store.
        self.host.store(name)?;
        let declaration = self
            .host
            .store_declaration(name)
            .ok_or_else(|| StoreError::Undeclared(name.to_string()))?;
        if declaration.kind().name() != expected {
            return Err(StoreError::WrongKind {
                store: name.to_string(),
                expected,
                actual: declaration.kind().name(),
            });
        }
        declaration.serdes(name)
    }

    /// Byte-level access to a connected window, session or buffer store, with its layout, the
    /// stream time and its expiry position (what [`WindowStore`] and [`SessionStore`] open).
    pub fn timed_store(&mut self, name: &str) -> Result<TimedStore<'_>, StoreError> {
        self.host.timed_store(name)
    }

    /// A connected window store, typed with the serdes it was declared with (Kafka Streams'
    /// `WindowStore`): a handle that does not hold the context; see [`WindowStore`].
    pub fn get_window_store<K: 'static, V: 'static>(
        &mut self,
        name: &str,
    ) -> Result<WindowStore<K, V>, StoreError> {
        Ok(WindowStore::with_serdes(self.declared_as(name, "window")?))
    }

    /// A connected session store, typed with the serdes it was declared with (Kafka Streams'
    /// `SessionStore`): a handle that does not hold the context; see [`SessionStore`].
    pub fn get_session_store<K: 'static, V: 'static>(
        &mut self,
        name: &str,
    ) -> Result<SessionStore<K, V>, StoreError> {
        Ok(SessionStore::with_serdes(
            self.declared_as(name, "session")?,
        ))
    }

    /// A connected versioned key-value store (Kafka Streams' `VersionedKeyValueStore`, declared
    /// by the DSL with `Materialized::versioned`), typed with the given serdes: a handle that
    /// does not hold the context; see [`crate::versioned`].
    pub fn versioned_store<K: 'static, V: 'static>(
        &mut self,
        name: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Result<VersionedStore<K, V>, StoreError> {
        // Connected, and versioned: a misconfigured processor fails where it opens the store.
        crate::versioned::VersionedBytes::open(self.host.timed_store(name)?)?;
        Ok(VersionedStore::new(
            name,
            Arc::new(key_serde),
            Arc::new(value_serde),
        ))
    }

    /// The sub-task's stream time: the partition's stream time (largest record timestamp) at the
    /// last record its key range took, the current record included (Kafka Streams'
    /// `currentStreamTimeMs`); `None` before any record.
    pub fn current_stream_time(&self) -> Option<i64> {
        self.host.stream_time()
    }

    /// Counts a record dropped because the windows it belongs to have closed
    /// (`rill_late_records_dropped_total`).
    pub fn late_record_dropped(&mut self, store: &str) {
        self.host.late_record_dropped(store);
    }

    /// Asks for `punctuate` every `interval` of the given clock (Kafka Streams'
    /// `schedule(Duration, PunctuationType, Punctuator)`), from `init`, `process` or
    /// `punctuate`; the handle cancels it, and [`TaskContext::punctuation`] tells which of
    /// several schedules fired. Both clocks count in whole milliseconds, so the interval is
    /// truncated to milliseconds, and is at least 1 ms. Schedules live as long as the sub-task's
    /// processors: after a restart or a factor change only those `init` makes exist again (as
    /// in Kafka Streams, where a task's punctuators are not restored either).
    pub fn schedule(&mut self, interval: Duration, kind: PunctuationType) -> Cancellable {
        self.host.schedule(interval, kind)
    }

    /// The schedule whose punctuation runs now, during `punctuate`: compare it with the
    /// handles `schedule` returned to tell several schedules apart.
    pub fn punctuation(&self) -> Option<Cancellable> {
        self.host.punctuation().cloned()
    }

    /// Counts a record dropped on purpose, under `reason` (a metric label).
    pub fn record_dropped(&mut self, reason: &'static str) {
        self.host.record_dropped(reason);
    }

    /// The value bytes of serialized `key` in global store `store` (a
    /// [`crate::dsl::GlobalKTable`]'s, read-only; see [`crate::global`]).
    pub fn global_get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.host.global_get(store, key)
    }

    /// Topic, partition and offset of the input record.
    pub fn record_meta(&self) -> &RecordMeta {
        self.host.meta()
    }
}

/// The context handed to a typed [`Processor`].
pub struct ProcessorContext<'a, KOut, VOut> {
    task: TaskContext<'a>,
    _types: PhantomData<fn(KOut, VOut)>,
}

impl<'a, KOut, VOut> std::ops::Deref for ProcessorContext<'a, KOut, VOut> {
    type Target = TaskContext<'a>;
    fn deref(&self) -> &TaskContext<'a> {
        &self.task
    }
}

impl<KOut, VOut> std::ops::DerefMut for ProcessorContext<'_, KOut, VOut> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.task
    }
}

impl<'a, KOut: Datum, VOut: Datum> ProcessorContext<'a, KOut, VOut> {
    /// Wraps an engine host.
    pub fn new(host: &'a mut dyn ProcessorHost) -> Self {
        ProcessorContext {
            task: TaskContext { host },
            _types: PhantomData,
        }
    }

    /// Sends `record` to every child node.
    pub fn forward(&mut self, record: Record<KOut, VOut>) {
        self.task.host.forward(erase(record));
    }

    /// Sends `record`, which is about the key whose routing hash is `routing_hash` rather than
    /// the key of the record being processed (what a buffer releases for other keys; the hash
    /// from [`KeyValueBytes::routing_hash_of`] of the released entry): the children's store
    /// writes then land in that key's range. `None` forwards as [`forward`](Self::forward).
    pub fn forward_about(&mut self, record: Record<KOut, VOut>, routing_hash: Option<u64>) {
        match routing_hash {
            Some(hash) => self.task.host.forward_about(erase(record), hash),
            None => self.task.host.forward(erase(record)),
        }
    }

    /// Sends `record` through the record cache (`statestore.cache.max.bytes`), as the DSL's
    /// aggregations do: consecutive updates of one `key` (its serialized bytes, `size` the
    /// serialized key and value length) collapse into the last one before the next commit.
    pub fn forward_cached(&mut self, key: Vec<u8>, size: usize, record: Record<KOut, VOut>) {
        self.task.host.forward_cached(key, size, erase(record));
    }
}

/// A record a [`FixedKeyProcessor`] got or forwards: its key cannot change (Kafka Streams'
/// `FixedKeyRecord`), so no repartition follows a `process_values`.
#[derive(Clone, Debug)]
pub struct FixedKeyRecord<K, V> {
    record: Record<K, V>,
}

impl<K, V> FixedKeyRecord<K, V> {
    /// The key.
    pub fn key(&self) -> Option<&K> {
        self.record.key.as_ref()
    }

    /// The value.
    pub fn value(&self) -> &V {
        &self.record.value
    }

    /// The timestamp.
    pub fn timestamp(&self) -> i64 {
        self.record.timestamp
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.record.headers
    }

    /// The record with another value, same key, timestamp and headers.
    pub fn with_value<V2>(self, value: V2) -> FixedKeyRecord<K, V2> {
        FixedKeyRecord {
            record: Record {
                key: self.record.key,
                value,
                timestamp: self.record.timestamp,
                headers: self.record.headers,
            },
        }
    }

    /// The record with another timestamp.
    pub fn with_timestamp(mut self, timestamp: i64) -> Self {
        self.record.timestamp = timestamp;
        self
    }

    /// The record with other headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.record.headers = headers;
        self
    }

    /// The value, dropping the rest.
    pub fn into_value(self) -> V {
        self.record.value
    }
}

/// The context handed to a [`FixedKeyProcessor`]: it forwards [`FixedKeyRecord`]s only.
pub struct FixedKeyContext<'a, K, VOut> {
    task: TaskContext<'a>,
    _types: PhantomData<fn(K, VOut)>,
}

impl<'a, K, VOut> std::ops::Deref for FixedKeyContext<'a, K, VOut> {
    type Target = TaskContext<'a>;
    fn deref(&self) -> &TaskContext<'a> {
        &self.task
    }
}

impl<K, VOut> std::ops::DerefMut for FixedKeyContext<'_, K, VOut> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.task
    }
}

impl<'a, K: Datum, VOut: Datum> FixedKeyContext<'a, K, VOut> {
    /// Wraps an engine host.
    pub fn new(host: &'a mut dyn ProcessorHost) -> Self {
        FixedKeyContext {
            task: TaskContext { host },
            _types: PhantomData,
        }
    }

    /// Sends `record` to every child node.
    pub fn forward(&mut self, record: FixedKeyRecord<K, VOut>) {
        self.task.host.forward(erase(record.record));
    }
}

/// A processor that may change values but never keys (Kafka Streams' `FixedKeyProcessor`, run by
/// [`crate::dsl::KStream::process_values`]).
pub trait FixedKeyProcessor<K, VIn, VOut>: Send {
    /// Called once per sub-task before the first record; schedule punctuations here.
    fn init(&mut self, _ctx: &mut FixedKeyContext<'_, K, VOut>) -> Result<(), ProcessError> {
        Ok(())
    }
    /// Processes one record.
    fn process(
        &mut self,
        record: FixedKeyRecord<K, VIn>,
        ctx: &mut FixedKeyContext<'_, K, VOut>,
    ) -> Result<(), ProcessError>;
    /// Called when a scheduled punctuation is due, with the clock's current time.
    fn punctuate(
        &mut self,
        _kind: PunctuationType,
        _timestamp: i64,
        _ctx: &mut FixedKeyContext<'_, K, VOut>,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// Adapts a [`FixedKeyProcessor`] to [`ErasedProcessor`].
pub struct FixedKeyTyped<P, K, VIn, VOut> {
    inner: P,
    _types: PhantomData<fn(K, VIn, VOut)>,
}

impl<P, K, VIn, VOut> FixedKeyTyped<P, K, VIn, VOut> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        FixedKeyTyped {
            inner,
            _types: PhantomData,
        }
    }
}

impl<P, K, VIn, VOut> ErasedProcessor for FixedKeyTyped<P, K, VIn, VOut>
where
    P: FixedKeyProcessor<K, VIn, VOut>,
    K: Datum,
    VIn: 'static,
    VOut: Datum,
{
    fn init(&mut self, host: &mut dyn ProcessorHost) -> Result<(), ProcessError> {
        self.inner.init(&mut FixedKeyContext::new(host))
    }

    fn process(
        &mut self,
        record: ErasedRecord,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError> {
        let record = FixedKeyRecord {
            record: unerase::<K, VIn>(record)?,
        };
        self.inner.process(record, &mut FixedKeyContext::new(host))
    }

    fn punctuate(
        &mut self,
        kind: PunctuationType,
        timestamp: i64,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError> {
        self.inner
            .punctuate(kind, timestamp, &mut FixedKeyContext::new(host))
    }
}

/// A user processor, the counterpart of Kafka Streams' `api.Processor`.
///
/// For logic the DSL does not have: a processor takes each record of its key range, may read
/// and write the stores connected to it (through the context), forwards any number of records
/// downstream, and can schedule punctuations. A supplier makes one processor per sub-task
/// (`KStream::process`); state that must survive a restart belongs in a store, not in the
/// processor's fields.
///
/// ```
/// use rill_topology::prelude::*;
///
/// /// Forwards a customer's order only when it is larger than every earlier one.
/// struct NewRecord;
///
/// impl Processor<String, i64, String, i64> for NewRecord {
///     fn process(
///         &mut self,
///         record: Record<String, i64>,
///         ctx: &mut ProcessorContext<'_, String, i64>,
///     ) -> Result<(), ProcessError> {
///         let Some(customer) = record.key.clone() else { return Ok(()) };
///         // A handle: it holds the store's name and serdes, each call takes `ctx` briefly.
///         let largest = ctx.get_state_store::<String, i64>("largest")?;
///         if largest.get(ctx, &customer)?.is_none_or(|l| record.value > l) {
///             let value = record.value;
///             ctx.forward(record);
///             largest.put(ctx, &customer, &value)?;
///         }
///         Ok(())
///     }
/// }
///
/// let builder = StreamsBuilder::new();
/// builder.add_state_store(Stores::key_value_store_builder(
///     Stores::persistent_key_value_store("largest"),
///     StringSerde,
///     I64Serde,
/// ));
/// builder
///     .stream("orders", StringSerde, I64Serde)
///     .process("new-records", || NewRecord, &["largest"])
///     // A processor's output types are its own: the sink names their serdes.
///     .to_with("record-orders", Produced::with(StringSerde, I64Serde));
/// builder.build()?;
/// # Ok::<(), TopologyError>(())
/// ```
pub trait Processor<KIn, VIn, KOut, VOut>: Send {
    /// Called once per sub-task before the first record; schedule punctuations here.
    fn init(&mut self, _ctx: &mut ProcessorContext<'_, KOut, VOut>) -> Result<(), ProcessError> {
        Ok(())
    }
    /// Processes one record.
    fn process(
        &mut self,
        record: Record<KIn, VIn>,
        ctx: &mut ProcessorContext<'_, KOut, VOut>,
    ) -> Result<(), ProcessError>;
    /// Called when a scheduled punctuation is due, with the clock's current time.
    fn punctuate(
        &mut self,
        _kind: PunctuationType,
        _timestamp: i64,
        _ctx: &mut ProcessorContext<'_, KOut, VOut>,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
    /// Called when the stream time moved without a record: the partition's time reached a key
    /// range none of whose keys arrived (see `rill_topology::time`). Release what closed.
    fn on_stream_time(
        &mut self,
        _ctx: &mut ProcessorContext<'_, KOut, VOut>,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// A processor whose record types are erased, as the graph runs it.
pub trait ErasedProcessor: Send {
    /// See [`Processor::init`].
    fn init(&mut self, host: &mut dyn ProcessorHost) -> Result<(), ProcessError>;
    /// See [`Processor::process`].
    fn process(
        &mut self,
        record: ErasedRecord,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError>;
    /// See [`Processor::punctuate`].
    fn punctuate(
        &mut self,
        kind: PunctuationType,
        timestamp: i64,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError>;
    /// See [`Processor::on_stream_time`].
    fn on_stream_time(&mut self, _host: &mut dyn ProcessorHost) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// Adapts a typed [`Processor`] to [`ErasedProcessor`].
pub struct Typed<P, KIn, VIn, KOut, VOut> {
    inner: P,
    _types: PhantomData<fn(KIn, VIn, KOut, VOut)>,
}

impl<P, KIn, VIn, KOut, VOut> Typed<P, KIn, VIn, KOut, VOut> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        Typed {
            inner,
            _types: PhantomData,
        }
    }
}

impl<P, KIn, VIn, KOut, VOut> ErasedProcessor for Typed<P, KIn, VIn, KOut, VOut>
where
    P: Processor<KIn, VIn, KOut, VOut>,
    KIn: 'static,
    VIn: 'static,
    KOut: Datum,
    VOut: Datum,
{
    fn init(&mut self, host: &mut dyn ProcessorHost) -> Result<(), ProcessError> {
        self.inner.init(&mut ProcessorContext::new(host))
    }

    fn process(
        &mut self,
        record: ErasedRecord,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError> {
        let record = unerase::<KIn, VIn>(record)?;
        self.inner.process(record, &mut ProcessorContext::new(host))
    }

    fn punctuate(
        &mut self,
        kind: PunctuationType,
        timestamp: i64,
        host: &mut dyn ProcessorHost,
    ) -> Result<(), ProcessError> {
        self.inner
            .punctuate(kind, timestamp, &mut ProcessorContext::new(host))
    }

    fn on_stream_time(&mut self, host: &mut dyn ProcessorHost) -> Result<(), ProcessError> {
        self.inner.on_stream_time(&mut ProcessorContext::new(host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erased_records_downcast_to_their_own_types() {
        let r = erase(Record::new("k".to_string(), 7i64));
        let boxed = r.key.clone().unwrap();
        assert!((*boxed).as_any().downcast_ref::<String>().is_some());
        let back = unerase::<String, i64>(r).unwrap();
        assert_eq!(back.key.as_deref(), Some("k"));
        assert_eq!(back.value, 7);
        assert!(unerase::<i64, i64>(erase(Record::new("k".to_string(), 1i64))).is_err());
    }
}

/// A scheduled punctuation (Kafka Streams' `Cancellable`): [`Cancellable::cancel`] stops it;
/// two handles are equal when they name the same schedule.
#[derive(Clone, Debug)]
pub struct Cancellable {
    id: u64,
    /// Set once by `cancel`; the sub-task drops the schedule before its next punctuation.
    cancelled: Arc<AtomicBool>,
}

impl Cancellable {
    /// A handle for the schedule numbered `id` (unique within its sub-task).
    pub fn new(id: u64) -> Self {
        Cancellable {
            id,
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops the punctuation: it does not fire again.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether [`Cancellable::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

impl PartialEq for Cancellable {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Cancellable {}
