//! Declaring Processor-API state stores once, with their serdes (Kafka Streams' `Stores`,
//! `StoreBuilder` and the store suppliers).
//!
//! ```
//! # use rill_topology::prelude::*;
//! let b = StreamsBuilder::new();
//! b.add_state_store(Stores::key_value_store_builder(
//!     Stores::persistent_key_value_store("totals"),
//!     StringSerde,
//!     I64Serde,
//! ));
//! // In a processor connected to "totals", a handle that does not hold the context:
//! // let totals = ctx.get_state_store::<String, i64>("totals")?;
//! // let total = totals.get(ctx, &key)?.unwrap_or(0) + 1;
//! // ctx.forward(record);
//! // totals.put(ctx, &key, &total)?;
//! ```
//!
//! Where rill differs from Kafka Streams:
//! - In-memory stores (`Stores::in_memory_key_value_store` and friends) keep their column
//!   families on the heap instead of in RocksDB, behind the same write cache and range commits:
//!   nothing of them is on disk, and a process start restores them from their changelogs. rill
//!   commits a task's stores together, so that restore covers the task's persistent stores as
//!   well (Kafka Streams restores only the in-memory ones). Their memory is outside
//!   `rocksdb.memory.bytes`.
//! - Logging can be turned off ([`StoreBuilder::with_logging_disabled`]), with Kafka Streams'
//!   meaning: the store has no changelog topic and is not fault tolerant. Its entries live in
//!   the local state dir only, committed with the range's progress in one WriteBatch, so they
//!   survive restarts and factor changes on this instance; when the task restores from the
//!   changelogs instead (a lost or distrusted state dir, or the task moving to another
//!   instance) the store starts empty and the input is not replayed for it; a commit that
//!   reached the changelogs but not the local state dir (a crash between the two) is lost for it
//!   the same way. A commit writes its
//!   markers to the logged stores only, and the last logged store decides a restore; a
//!   sub-topology whose stores are all unlogged resumes from the committed offsets' metadata,
//!   as a stateless one does.
//! - Caching is on by default (Kafka Streams' `StoreBuilder` has it off): a store's writes wait
//!   in the sub-task's write cache until the range commits, one changelog record per key and
//!   commit. [`StoreBuilder::with_caching_disabled`] sends every write to the changelog, in
//!   order, as Kafka Streams' uncached store does; the writes still reach RocksDB (or the heap)
//!   at the range commit, in one batch with the range's progress, and reads see them before.
//!   The downstream record cache is the DSL's (`statestore.cache.max.bytes`, and
//!   `Materialized::with_caching_disabled` per aggregation).
//! - Window stores keep one value per key and window start (no `retainDuplicates`).

use std::any::{type_name, Any};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::serdes::Serde;
use crate::store::{SessionStoreSpec, StoreError, StoreKind, StoreSerdes, WindowStoreSpec};
use crate::time::millis;
use crate::window::serde::ValueAndTimestampSerde;
use crate::window::ValueAndTimestamp;

/// Factory of store suppliers and builders (Kafka Streams' `Stores`).
pub struct Stores;

/// A key-value store by name (Kafka Streams' `KeyValueBytesStoreSupplier`).
#[derive(Clone, Debug)]
pub struct KeyValueStoreSupplier {
    name: String,
    in_memory: bool,
}

/// A window store: name, retention and window size (Kafka Streams' `WindowBytesStoreSupplier`).
#[derive(Clone, Debug)]
pub struct WindowStoreSupplier {
    name: String,
    spec: WindowStoreSpec,
    in_memory: bool,
}

/// A session store: name and retention (Kafka Streams' `SessionBytesStoreSupplier`).
#[derive(Clone, Debug)]
pub struct SessionStoreSupplier {
    name: String,
    spec: SessionStoreSpec,
    in_memory: bool,
}

impl Stores {
    /// A persistent key-value store (`Stores.persistentKeyValueStore`).
    pub fn persistent_key_value_store(name: &str) -> KeyValueStoreSupplier {
        KeyValueStoreSupplier {
            name: name.to_string(),
            in_memory: false,
        }
    }

    /// A key-value store kept on the heap (`Stores.inMemoryKeyValueStore`); a process start
    /// restores it from its changelog (see the module docs).
    pub fn in_memory_key_value_store(name: &str) -> KeyValueStoreSupplier {
        KeyValueStoreSupplier {
            name: name.to_string(),
            in_memory: true,
        }
    }

    /// A persistent key-value store for timestamped values
    /// (`Stores.persistentTimestampedKeyValueStore`); give it to
    /// [`Stores::timestamped_key_value_store_builder`].
    pub fn persistent_timestamped_key_value_store(name: &str) -> KeyValueStoreSupplier {
        Self::persistent_key_value_store(name)
    }

    /// A persistent window store of windows of `window_size`, kept for `retention` of stream
    /// time after their start (`Stores.persistentWindowStore`, without duplicates).
    pub fn persistent_window_store(
        name: &str,
        retention: Duration,
        window_size: Duration,
    ) -> WindowStoreSupplier {
        WindowStoreSupplier {
            name: name.to_string(),
            spec: WindowStoreSpec {
                retention_ms: millis(retention),
                window_size_ms: millis(window_size),
                indexed: true,
                timestamped: false,
            },
            in_memory: false,
        }
    }

    /// A window store kept on the heap (`Stores.inMemoryWindowStore`, without duplicates); a
    /// process start restores it from its changelog.
    pub fn in_memory_window_store(
        name: &str,
        retention: Duration,
        window_size: Duration,
    ) -> WindowStoreSupplier {
        WindowStoreSupplier {
            in_memory: true,
            ..Self::persistent_window_store(name, retention, window_size)
        }
    }

    /// A persistent session store whose sessions are kept for `retention` of stream time after
    /// their end (`Stores.persistentSessionStore`).
    pub fn persistent_session_store(name: &str, retention: Duration) -> SessionStoreSupplier {
        SessionStoreSupplier {
            name: name.to_string(),
            spec: SessionStoreSpec {
                retention_ms: millis(retention),
            },
            in_memory: false,
        }
    }

    /// A session store kept on the heap (`Stores.inMemorySessionStore`); a process start
    /// restores it from its changelog.
    pub fn in_memory_session_store(name: &str, retention: Duration) -> SessionStoreSupplier {
        SessionStoreSupplier {
            in_memory: true,
            ..Self::persistent_session_store(name, retention)
        }
    }

    /// A key-value store with its serdes (`Stores.keyValueStoreBuilder`); processors open a
    /// handle on it with `ctx.get_state_store::<K, V>(name)`.
    pub fn key_value_store_builder<K: 'static, V: 'static>(
        supplier: KeyValueStoreSupplier,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> StoreBuilder<K, V> {
        StoreBuilder::new(
            supplier.name,
            StoreKind::KeyValue,
            supplier.in_memory,
            key_serde,
            value_serde,
        )
    }

    /// A key-value store of values with a timestamp (`Stores.timestampedKeyValueStoreBuilder`);
    /// processors open it with `ctx.get_state_store::<K, ValueAndTimestamp<V>>(name)`.
    pub fn timestamped_key_value_store_builder<K: 'static, V: 'static>(
        supplier: KeyValueStoreSupplier,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> StoreBuilder<K, ValueAndTimestamp<V>> {
        StoreBuilder::new(
            supplier.name,
            StoreKind::KeyValue,
            supplier.in_memory,
            key_serde,
            ValueAndTimestampSerde::new(Arc::new(value_serde)),
        )
    }

    /// A window store with its serdes (`Stores.windowStoreBuilder`); processors open it with
    /// `ctx.get_window_store::<K, V>(name)`.
    pub fn window_store_builder<K: 'static, V: 'static>(
        supplier: WindowStoreSupplier,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> StoreBuilder<K, V> {
        StoreBuilder::new(
            supplier.name,
            StoreKind::Window(supplier.spec),
            supplier.in_memory,
            key_serde,
            value_serde,
        )
    }

    /// A session store with its serdes (`Stores.sessionStoreBuilder`); processors open it with
    /// `ctx.get_session_store::<K, V>(name)`.
    pub fn session_store_builder<K: 'static, V: 'static>(
        supplier: SessionStoreSupplier,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> StoreBuilder<K, V> {
        StoreBuilder::new(
            supplier.name,
            StoreKind::Session(supplier.spec),
            supplier.in_memory,
            key_serde,
            value_serde,
        )
    }
}

/// A store to declare with `StreamsBuilder::add_state_store` (Kafka Streams' `StoreBuilder`):
/// its name, layout, serdes and changelog topic configs.
pub struct StoreBuilder<K, V> {
    name: String,
    kind: StoreKind,
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
    changelog_configs: BTreeMap<String, String>,
    logging: bool,
    in_memory: bool,
    caching: bool,
}

impl<K: 'static, V: 'static> StoreBuilder<K, V> {
    fn new(
        name: String,
        kind: StoreKind,
        in_memory: bool,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Self {
        StoreBuilder {
            name,
            kind,
            key_serde: Arc::new(key_serde),
            value_serde: Arc::new(value_serde),
            changelog_configs: BTreeMap::new(),
            logging: true,
            in_memory,
            caching: true,
        }
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates the store's changelog topic with these topic configs besides rill's own
    /// (`StoreBuilder.withLoggingEnabled`). `cleanup.policy` must keep `compact`; a topic that
    /// exists already keeps its configs, and the embedded cluster (no `bootstrap.servers`, new on
    /// every start) takes none.
    pub fn with_logging_enabled(mut self, topic_configs: BTreeMap<String, String>) -> Self {
        self.changelog_configs = topic_configs;
        self.logging = true;
        self
    }

    /// Gives the store no changelog topic (`StoreBuilder.withLoggingDisabled`): its entries are
    /// kept in the local state dir only, and a restore from the changelogs (a lost state dir, or
    /// the task moving to another instance) starts it empty (see the module docs).
    pub fn with_logging_disabled(mut self) -> Self {
        self.changelog_configs.clear();
        self.logging = false;
        self
    }

    /// Whether the store has a changelog topic.
    pub fn logging_enabled(&self) -> bool {
        self.logging
    }

    /// Sends one changelog record per key and commit, the key's last write
    /// (`StoreBuilder.withCachingEnabled`; rill's default).
    pub fn with_caching_enabled(mut self) -> Self {
        self.caching = true;
        self
    }

    /// Sends every write to the changelog, in order (`StoreBuilder.withCachingDisabled`); the
    /// writes still reach the store at the range commit (see the module docs).
    pub fn with_caching_disabled(mut self) -> Self {
        self.caching = false;
        self
    }

    /// The changelog topic configs given with [`StoreBuilder::with_logging_enabled`].
    pub fn changelog_configs(&self) -> &BTreeMap<String, String> {
        &self.changelog_configs
    }

    /// The store's name, layout and type-erased declaration.
    pub(crate) fn into_declaration(self) -> (String, StoreKind, StoreDeclaration) {
        let serdes = TypedSerdes::<K, V> {
            key: self.key_serde,
            value: self.value_serde,
        };
        let declaration = StoreDeclaration {
            kind: self.kind,
            serdes: Arc::new(serdes),
            key_type: type_name::<K>(),
            value_type: type_name::<V>(),
            changelog_configs: self.changelog_configs,
            logging: self.logging,
            in_memory: self.in_memory,
            caching: self.caching,
        };
        (self.name, self.kind, declaration)
    }
}

/// The serdes a builder declared, by type.
struct TypedSerdes<K, V> {
    key: Arc<dyn Serde<K>>,
    value: Arc<dyn Serde<V>>,
}

/// What a `Stores` builder declared for a store, with its serdes' types erased: the topology
/// keeps it and hands the serdes back to processors that open the store with the same types.
#[derive(Clone)]
pub struct StoreDeclaration {
    kind: StoreKind,
    serdes: Arc<dyn Any + Send + Sync>,
    key_type: &'static str,
    value_type: &'static str,
    changelog_configs: BTreeMap<String, String>,
    logging: bool,
    in_memory: bool,
    caching: bool,
}

impl StoreDeclaration {
    /// What the store holds.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// The changelog topic configs the builder asked for.
    pub fn changelog_configs(&self) -> &BTreeMap<String, String> {
        &self.changelog_configs
    }

    /// Whether the store has a changelog topic ([`StoreBuilder::with_logging_disabled`]).
    pub fn logging_enabled(&self) -> bool {
        self.logging
    }

    /// Whether the store is kept on the heap (an `in_memory_*` supplier).
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// Whether the changelog gets one record per key and commit rather than every write
    /// ([`StoreBuilder::with_caching_disabled`]).
    pub fn caching_enabled(&self) -> bool {
        self.caching
    }

    /// The declared serdes of store `store` as `K` and `V`; [`StoreError::WrongTypes`] when
    /// the declaration has other types.
    pub(crate) fn serdes<K: 'static, V: 'static>(
        &self,
        store: &str,
    ) -> Result<StoreSerdes<K, V>, StoreError> {
        match self.serdes.downcast_ref::<TypedSerdes<K, V>>() {
            Some(s) => Ok(StoreSerdes::new(store, s.key.clone(), s.value.clone())),
            None => Err(StoreError::WrongTypes {
                store: store.to_string(),
                declared: format!("({}, {})", self.key_type, self.value_type).into(),
                requested: format!("({}, {})", type_name::<K>(), type_name::<V>()).into(),
            }),
        }
    }
}

impl std::fmt::Debug for StoreDeclaration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreDeclaration")
            .field("kind", &self.kind)
            .field("key_type", &self.key_type)
            .field("value_type", &self.value_type)
            .field("changelog_configs", &self.changelog_configs)
            .field("logging", &self.logging)
            .field("in_memory", &self.in_memory)
            .field("caching", &self.caching)
            .finish()
    }
}
