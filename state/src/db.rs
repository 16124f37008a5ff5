//! The process-wide RocksDB: opening, the FORMAT file, column families and the memory budget.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rill_topology::keyrange::{KeyRange, HASH_ID};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, ErrorKind, Options,
    WriteBufferManager,
};

use crate::cf::{validate_store_name, ColumnFamilyId};
use crate::error::StateError;
use crate::read_cache::ReadBudget;

/// The RocksDB flavour rill uses: column families created and dropped through `&self`.
pub(crate) type Db = rocksdb::DBWithThreadMode<rocksdb::MultiThreaded>;

/// Version of the state directory layout, written to `FORMAT`.
pub const FORMAT_VERSION: u32 = 2;
/// Name of the format file in the state directory.
pub const FORMAT_FILE: &str = "FORMAT";
/// Name of the file in the state directory that records the Kafka cluster id.
pub const CLUSTER_FILE: &str = "CLUSTER";
/// Name of the file in the state directory that records the `application.id` that owns it.
pub const APPLICATION_FILE: &str = "APPLICATION";
/// Name of the RocksDB directory inside the state directory.
pub const ROCKSDB_DIR: &str = "rocksdb";
/// The smallest accepted memory budget (4 MiB).
pub const MIN_MEMORY_BYTES: usize = 4 << 20;
/// The smallest accepted bound on open files (RocksDB raises anything lower to this silently).
pub const MIN_OPEN_FILES: u32 = 20;

/// Files RocksDB keeps out of its table cache's share of `max_open_files` (WAL, MANIFEST, logs).
const NON_TABLE_FILES: u32 = 10;

/// Shard bits for a table cache of `max_open_files - 10` readers that holds no more than that.
///
/// Each shard rounds its share up, so 64 shards (RocksDB's default) of a 10-reader cache keep
/// up to 64 files open. Shards that divide the capacity exactly, each with room for at least 8
/// readers, make the bound hold (only readers pinned by a running read can exceed it).
pub(crate) fn table_cache_shard_bits(max_open_files: u32) -> i32 {
    let capacity = max_open_files.saturating_sub(NON_TABLE_FILES).max(1);
    let exact = capacity.trailing_zeros();
    let roomy = (capacity / 8).max(1).ilog2();
    exact.min(roomy).min(6) as i32
}

/// Smallest per-column-family memtable.
const MIN_WRITE_BUFFER: usize = 1 << 20;
/// Largest per-column-family memtable (RocksDB's default).
const MAX_WRITE_BUFFER: usize = 64 << 20;

/// Where the state lives and how much memory RocksDB may use.
#[derive(Clone, Debug)]
pub struct StateConfig {
    /// The state directory (`state.dir`); RocksDB lives in its `rocksdb/` subdirectory.
    pub dir: PathBuf,
    /// One budget for the block cache, all memtables and the stores' read caches together
    /// (`rocksdb.memory.bytes`).
    pub memory_bytes: usize,
    /// Column families to create when the database has none yet, all in one step at open
    /// (names as [`crate::ColumnFamilyId::name`]); later ones are created one at a time, and
    /// RocksDB rewrites its OPTIONS file with every column family at each, so creating
    /// hundreds at assignment took about a minute.
    pub create_column_families: Vec<String>,
    /// Bound on the SST files RocksDB keeps open (`rocksdb.max.open.files`); `None` keeps every
    /// one open (RocksDB's and Kafka Streams' default). At least [`MIN_OPEN_FILES`].
    pub max_open_files: Option<u32>,
}

/// Memory RocksDB currently uses, as charged to the shared budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Usage of the shared block cache. Memtables are charged to this cache too (through the
    /// write-buffer manager), so this is the process total held against the budget.
    pub block_cache_bytes: usize,
    /// Memory of all memtables (mutable and immutable) of all column families.
    pub memtable_bytes: usize,
    /// Bytes held by the stores' read caches (outside RocksDB, within `rocksdb.memory.bytes`).
    pub read_cache_bytes: usize,
}

/// How the memory budget is split (see [`StateDb::open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoryPlan {
    /// Capacity of the shared LRU cache: the budget less the read caches'.
    pub cache_bytes: usize,
    /// Bytes the stores' read caches may hold together (see `read_cache`): an eighth.
    pub read_cache_bytes: usize,
    /// Limit of the write-buffer manager (charged to the cache): half the budget.
    pub memtable_bytes: usize,
    /// `write_buffer_size` of every column family.
    pub write_buffer_size: usize,
    /// `arena_block_size` of every column family.
    pub arena_block_size: usize,
    /// `max_total_wal_size` of the database.
    pub max_total_wal_size: u64,
}

impl MemoryPlan {
    /// Splits `memory_bytes`.
    ///
    /// - The stores' read caches of committed values get an eighth (reads of a key written
    ///   since its last flush search every version of the memtable otherwise).
    /// - The LRU cache gets the rest as capacity, and the write-buffer manager charges
    ///   every memtable to that cache, so blocks + memtables stay under one limit (the scheme of
    ///   RocksDB's "cost write buffer to cache", also used by Kafka Streams' bounded-memory
    ///   config). Memtables may take up to half of it; blocks get the rest.
    /// - Per column family, `write_buffer_size = memtables / 8`, clamped to 1..=64 MiB: a hot
    ///   column family fills at most an eighth of the memtable budget before it is flushed, so
    ///   several ranges can be hot at once, while with hundreds of column families the
    ///   write-buffer manager (which flushes the largest memtable when the total is reached)
    ///   bounds the total whatever the count. `arena_block_size = write_buffer_size / 16`
    ///   (64 KiB..=1 MiB) keeps the minimum footprint of a touched memtable small, so hundreds
    ///   of lightly written column families do not reserve a large block each.
    /// - `max_total_wal_size = 4 x memtables` (at least 64 MiB): a rarely written column family
    ///   would otherwise pin old WAL files forever; past this size RocksDB flushes the column
    ///   families that hold the oldest WAL.
    pub fn new(memory_bytes: usize) -> Self {
        let read_cache_bytes = memory_bytes / 8;
        let memtable_bytes = memory_bytes / 2;
        let write_buffer_size = (memtable_bytes / 8).clamp(MIN_WRITE_BUFFER, MAX_WRITE_BUFFER);
        let arena_block_size = (write_buffer_size / 16).clamp(64 << 10, 1 << 20);
        let max_total_wal_size = (memtable_bytes as u64).saturating_mul(4).max(64 << 20);
        MemoryPlan {
            cache_bytes: memory_bytes - read_cache_bytes,
            read_cache_bytes,
            memtable_bytes,
            write_buffer_size,
            arena_block_size,
            max_total_wal_size,
        }
    }
}

/// The entries of a column family kept on the heap: RocksDB's keys and values (progress and
/// data), in key order.
pub(crate) type MemoryTable = BTreeMap<Vec<u8>, Vec<u8>>;

/// A heap column family. The lock is only ever taken by the one `SubTaskState` that owns the
/// column family (see [`Registry`]), or by the re-split that owns it instead: it is never
/// contended, and is a `Mutex` only so that the table is `Send + Sync`.
pub(crate) type SharedTable = Arc<Mutex<MemoryTable>>;

/// Which column families exist and which are owned by a live `SubTaskState`.
#[derive(Default)]
struct Registry {
    /// Names of every column family of the database (rill's and others, `default` included),
    /// and of every heap column family.
    existing: BTreeSet<String>,
    /// Names owned by a live `SubTaskState`.
    claimed: HashSet<String>,
    /// Stores kept on the heap ([`StateDb::keep_in_memory`]).
    memory_stores: BTreeSet<String>,
    /// The heap column families by name (gone with the process).
    tables: BTreeMap<String, SharedTable>,
    /// Stores whose changelog gets every write ([`StateDb::log_every_write`]).
    every_write: BTreeSet<String>,
}

impl Registry {
    /// Whether column family `name` belongs to a store kept on the heap.
    fn in_memory(&self, name: &str) -> bool {
        ColumnFamilyId::parse(name).is_some_and(|id| self.memory_stores.contains(&id.store))
    }
}

/// The process-wide RocksDB under `state.dir`, shared by every sub-task through an `Arc`.
pub struct StateDb {
    // Field order matters for drop: the database closes before the cache and the write-buffer
    // manager it uses are released.
    db: Db,
    dir: PathBuf,
    cache: Cache,
    write_buffer_manager: WriteBufferManager,
    /// The budget of every store's read cache.
    read_budget: Arc<ReadBudget>,
    plan: MemoryPlan,
    /// Guards column family creation and dropping, and ownership by sub-tasks. Invariant: a
    /// column family is owned by at most one live `SubTaskState`, and is only dropped when no
    /// one owns it. So each sub-task writes only column families no one else writes or drops,
    /// and sub-tasks of different ranges never contend on a memtable.
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for StateDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateDb")
            .field("dir", &self.dir)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl StateDb {
    /// Opens (creating when new) the state directory `cfg.dir` and its RocksDB with every
    /// existing column family. Never wipes or recreates anything: a directory it cannot use is
    /// an error saying what to do.
    pub fn open(cfg: &StateConfig) -> Result<Arc<StateDb>, StateError> {
        if cfg.memory_bytes < MIN_MEMORY_BYTES {
            return Err(StateError::MemoryBudgetTooSmall {
                bytes: cfg.memory_bytes,
                min: MIN_MEMORY_BYTES,
            });
        }
        if let Some(n) = cfg.max_open_files.filter(|&n| n < MIN_OPEN_FILES) {
            return Err(StateError::OpenFilesTooFew {
                files: n,
                min: MIN_OPEN_FILES,
            });
        }
        let dir = cfg.dir.clone();
        fs::create_dir_all(&dir).map_err(|e| StateError::io(&dir, e))?;
        let rocks_dir = dir.join(ROCKSDB_DIR);
        let rocks_has_files = dir_has_entries(&rocks_dir)?;

        let format_path = dir.join(FORMAT_FILE);
        match fs::read_to_string(&format_path) {
            Ok(text) => {
                check_format(&dir, &text)?;
                if !rocks_has_files {
                    tracing::warn!(
                        dir = %dir.display(),
                        "the state directory has no database ({ROCKSDB_DIR}/ is missing or \
                         empty): creating an empty one; stores rebuild from their changelogs"
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if rocks_has_files {
                    return Err(StateError::WrongFormat {
                        dir,
                        detail: format!(
                            "it holds a RocksDB database ({ROCKSDB_DIR}/) but no {FORMAT_FILE} \
                             file, so rill cannot tell who wrote it. If it is rill's state, \
                             restore {FORMAT_FILE} (`{}`); otherwise set another state.dir",
                            format_text().escape_debug()
                        ),
                    });
                }
                write_format(&dir)?;
            }
            Err(e) => return Err(StateError::io(format_path, e)),
        }

        let current_exists = rocks_dir.join("CURRENT").exists();
        if rocks_has_files && !current_exists {
            return Err(StateError::Corrupt {
                dir,
                detail: format!("{ROCKSDB_DIR}/ holds files but no CURRENT file"),
            });
        }

        let plan = MemoryPlan::new(cfg.memory_bytes);
        let cache = Cache::new_lru_cache(plan.cache_bytes);
        let write_buffer_manager = WriteBufferManager::new_write_buffer_manager_with_cache(
            plan.memtable_bytes,
            false,
            cache.clone(),
        );

        let mut db_opts = Options::default();
        // Only a brand-new directory gets a new database; an existing one must open as it is.
        db_opts.create_if_missing(!current_exists);
        db_opts.create_missing_column_families(false);
        db_opts.set_write_buffer_manager(&write_buffer_manager);
        db_opts.set_max_total_wal_size(plan.max_total_wal_size);
        db_opts.set_keep_log_file_num(5);
        db_opts.set_max_log_file_size(16 << 20);
        // RocksDB keeps `max_open_files - 10` table readers in its table cache (the rest is
        // for the WAL, MANIFEST and logs); -1 opens every SST file at open and keeps it open.
        // The shard count decides whether that capacity is a bound (see table_cache_shard_bits).
        db_opts.set_max_open_files(
            cfg.max_open_files
                .map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX)),
        );
        if let Some(n) = cfg.max_open_files {
            db_opts.set_table_cache_num_shard_bits(table_cache_shard_bits(n));
        }
        // The WAL stays on: a range's data and progress share one WriteBatch, so they survive
        // (or are lost) together on a crash.

        let mut names = if current_exists {
            Db::list_cf(&db_opts, &rocks_dir).map_err(|e| classify_open_error(&dir, e))?
        } else {
            vec![rocksdb::DEFAULT_COLUMN_FAMILY_NAME.to_string()]
        };
        // Only into a database without column families of its own: state from an earlier run
        // is left as it is (a factor change re-splits it at assignment).
        if names.len() == 1 && !cfg.create_column_families.is_empty() {
            let unique: BTreeSet<&String> = cfg
                .create_column_families
                .iter()
                .filter(|n| n.as_str() != rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
                .collect();
            names.extend(unique.into_iter().cloned());
            db_opts.create_missing_column_families(true);
        }
        let descriptors = names
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(name, cf_options(&plan, &cache)));
        let db = Db::open_cf_descriptors(&db_opts, &rocks_dir, descriptors)
            .map_err(|e| classify_open_error(&dir, e))?;
        tracing::info!(
            dir = %dir.display(),
            column_families = names.len(),
            memory_bytes = cfg.memory_bytes,
            write_buffer_size = plan.write_buffer_size,
            "state database open"
        );
        Ok(Arc::new(StateDb {
            db,
            dir,
            cache,
            write_buffer_manager,
            read_budget: ReadBudget::new(plan.read_cache_bytes),
            plan,
            registry: Mutex::new(Registry {
                existing: names.into_iter().collect(),
                ..Registry::default()
            }),
        }))
    }

    /// [`StateDb::open`], except that a corrupt database (a truncated MANIFEST or SST file,
    /// a missing CURRENT: [`StateError::Corrupt`]) is moved aside to `rocksdb.corrupt-<unix
    /// seconds>/` (kept for inspection, never deleted) and an empty one is opened in its place:
    /// every store then rebuilds from its changelog. Any other error is returned as it is.
    pub fn open_or_rebuild(cfg: &StateConfig) -> Result<Arc<StateDb>, StateError> {
        match Self::open(cfg) {
            Err(StateError::Corrupt { dir, detail }) => {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let aside = dir.join(format!("{ROCKSDB_DIR}.corrupt-{stamp}"));
                fs::rename(dir.join(ROCKSDB_DIR), &aside).map_err(|e| StateError::io(&aside, e))?;
                tracing::warn!(
                    dir = %dir.display(),
                    moved_to = %aside.display(),
                    corruption = %detail,
                    "the state database is corrupt: moved it aside; stores rebuild from their changelogs"
                );
                Self::open(cfg)
            }
            other => other,
        }
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Binds the state to Kafka cluster `cluster_id`: records it on first use, refuses another
    /// cluster later ([`StateError::OtherCluster`]). Offsets in the state are only meaningful on
    /// the cluster that issued them.
    pub fn bind_cluster(&self, cluster_id: &str) -> Result<(), StateError> {
        let path = self.dir.join(CLUSTER_FILE);
        match fs::read_to_string(&path) {
            Ok(recorded) if recorded.trim() == cluster_id => Ok(()),
            Ok(recorded) => Err(StateError::OtherCluster {
                dir: self.dir.clone(),
                recorded: recorded.trim().to_string(),
                current: cluster_id.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::write(&path, format!("{cluster_id}\n"))
                    .map_err(|source| StateError::Io { path, source })
            }
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Binds the state to application `application_id` whose topology has the stores `stores`:
    /// records the application on first use and refuses another application's directory later
    /// ([`StateError::OtherApplication`]); refuses a directory holding stores the topology does
    /// not have ([`StateError::OtherTopology`]), which another topology wrote. Stores the
    /// directory lacks are fine: they are new, or rebuild from their changelogs.
    pub fn bind_application(
        &self,
        application_id: &str,
        stores: &[&str],
    ) -> Result<(), StateError> {
        let path = self.dir.join(APPLICATION_FILE);
        match fs::read_to_string(&path) {
            Ok(recorded) if recorded.trim() == application_id => {}
            Ok(recorded) => {
                return Err(StateError::OtherApplication {
                    dir: self.dir.clone(),
                    recorded: recorded.trim().to_string(),
                    current: application_id.to_string(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::write(&path, format!("{application_id}\n"))
                    .map_err(|source| StateError::Io { path, source })?;
            }
            Err(source) => return Err(StateError::Io { path, source }),
        }
        let unknown: BTreeSet<String> = self
            .column_families()
            .into_iter()
            .map(|cf| cf.store)
            .filter(|s| !stores.contains(&s.as_str()))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            let mut known: Vec<String> = stores.iter().map(|s| s.to_string()).collect();
            known.sort();
            Err(StateError::OtherTopology {
                dir: self.dir.clone(),
                unknown: unknown.into_iter().collect(),
                known,
            })
        }
    }

    /// Every column family rill knows of, parsed from its name, in id order.
    pub fn column_families(&self) -> Vec<ColumnFamilyId> {
        let registry = self.registry.lock();
        let mut ids: Vec<ColumnFamilyId> = registry
            .existing
            .iter()
            .filter_map(|name| ColumnFamilyId::parse(name))
            .collect();
        ids.sort();
        ids
    }

    /// Drops the column families of (store, partition), e.g. when a partition is revoked and its
    /// state is given up. Fails with [`StateError::InUse`] while a sub-task owns one of them.
    pub fn drop_partition(&self, store: &str, partition: u32) -> Result<(), StateError> {
        validate_store_name(store)?;
        let mut registry = self.registry.lock();
        let victims: Vec<String> = registry
            .existing
            .iter()
            .filter(|name| {
                ColumnFamilyId::parse(name)
                    .is_some_and(|id| id.store == store && id.partition == partition)
            })
            .cloned()
            .collect();
        if let Some(cf) = victims.iter().find(|name| registry.claimed.contains(*name)) {
            return Err(StateError::InUse { cf: cf.clone() });
        }
        for name in victims {
            self.drop_cf(&mut registry, &name)?;
        }
        Ok(())
    }

    /// Drops the column family of (store, partition, range) if it exists. Fails with
    /// [`StateError::InUse`] while a sub-task owns it.
    pub fn drop_range(
        &self,
        store: &str,
        partition: u32,
        range: KeyRange,
    ) -> Result<(), StateError> {
        let name = ColumnFamilyId::new(store, partition, range)?.name();
        let mut registry = self.registry.lock();
        if registry.claimed.contains(&name) {
            return Err(StateError::InUse { cf: name });
        }
        if registry.existing.contains(&name) {
            self.drop_cf(&mut registry, &name)?;
        }
        Ok(())
    }

    /// Drops column family `name`, on disk or on the heap (the registry is locked by the caller).
    fn drop_cf(&self, registry: &mut Registry, name: &str) -> Result<(), StateError> {
        if registry.tables.remove(name).is_none() {
            self.db
                .drop_cf(name)
                .map_err(|e| StateError::backend(format!("drop column family `{name}`"), e))?;
        }
        registry.existing.remove(name);
        tracing::info!(cf = %name, "dropped column family");
        Ok(())
    }

    /// Keeps the column families of `stores` on the heap from now on (Kafka Streams' in-memory
    /// stores): they are gone with the process, and a task restores them from their changelogs
    /// (see [`SubTaskState::lost_in_memory`](crate::SubTaskState::lost_in_memory)). Column
    /// families of these stores left on disk by an earlier run (when they were persistent) are
    /// dropped. Call it before any sub-task opens a state.
    pub fn keep_in_memory(&self, stores: &[String]) -> Result<(), StateError> {
        let mut registry = self.registry.lock();
        registry.memory_stores.extend(stores.iter().cloned());
        let on_disk: Vec<String> = registry
            .existing
            .iter()
            .filter(|name| registry.in_memory(name) && !registry.tables.contains_key(*name))
            .cloned()
            .collect();
        if let Some(cf) = on_disk.iter().find(|n| registry.claimed.contains(*n)) {
            return Err(StateError::InUse { cf: cf.clone() });
        }
        for name in on_disk {
            self.drop_cf(&mut registry, &name)?;
        }
        Ok(())
    }

    /// Sends every write of `stores` to the changelog, in order, instead of the last write per
    /// key and commit (Kafka Streams' stores without caching). Reads and commits are unchanged:
    /// the entries and the progress of a commit are still written in one batch.
    pub fn log_every_write(&self, stores: &[String]) {
        self.registry
            .lock()
            .every_write
            .extend(stores.iter().cloned());
    }

    /// Whether the changelog of `store` gets every write.
    pub(crate) fn logs_every_write(&self, store: &str) -> bool {
        self.registry.lock().every_write.contains(store)
    }

    /// The heap table of column family `name`, when its store is kept in memory.
    pub(crate) fn memory_table(&self, name: &str) -> Option<SharedTable> {
        self.registry.lock().tables.get(name).cloned()
    }

    /// Memory currently charged to the budget, from the shared cache and write-buffer manager.
    pub fn memory_usage(&self) -> MemoryUsage {
        MemoryUsage {
            block_cache_bytes: self.cache.get_usage(),
            memtable_bytes: self.write_buffer_manager.get_usage(),
            read_cache_bytes: self.read_budget.used(),
        }
    }

    /// The budget the stores' read caches share.
    pub(crate) fn read_budget(&self) -> Arc<ReadBudget> {
        self.read_budget.clone()
    }

    /// The RocksDB handle.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    /// Creates the missing column families among `names` and marks all of them owned.
    ///
    /// Fails without owning anything when one is already owned or cannot be created.
    pub(crate) fn claim(&self, names: &[String]) -> Result<(), StateError> {
        let mut registry = self.registry.lock();
        if let Some(cf) = names.iter().find(|n| registry.claimed.contains(*n)) {
            return Err(StateError::InUse { cf: cf.clone() });
        }
        let mut unique = HashSet::new();
        if let Some(cf) = names.iter().find(|n| !unique.insert(*n)) {
            return Err(StateError::InUse { cf: cf.clone() });
        }
        for name in names {
            if registry.in_memory(name) {
                if !registry.tables.contains_key(name) {
                    registry.tables.insert(name.clone(), SharedTable::default());
                    registry.existing.insert(name.clone());
                }
            } else if !registry.existing.contains(name) {
                // Under the registry lock: no other thread creates or drops concurrently.
                self.db
                    .create_cf(name, &cf_options(&self.plan, &self.cache))
                    .map_err(|e| {
                        StateError::backend(format!("create column family `{name}`"), e)
                    })?;
                registry.existing.insert(name.clone());
                tracing::debug!(cf = %name, "created column family");
            }
        }
        registry.claimed.extend(names.iter().cloned());
        Ok(())
    }

    /// Gives up ownership of `names` (a `SubTaskState` is dropped).
    pub(crate) fn release(&self, names: &[String]) {
        let mut registry = self.registry.lock();
        for name in names {
            registry.claimed.remove(name);
        }
    }
}

/// Options of every column family: the shared block cache, small memtables (see [`MemoryPlan`]).
fn cf_options(plan: &MemoryPlan, cache: &Cache) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    // Index and filter blocks live in the shared cache too, so they count against the budget.
    table.set_cache_index_and_filter_blocks(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table.set_bloom_filter(10.0, false);
    table.set_optimize_filters_for_memory(true);
    let mut opts = Options::default();
    opts.set_block_based_table_factory(&table);
    opts.set_write_buffer_size(plan.write_buffer_size);
    opts.set_arena_block_size(plan.arena_block_size);
    opts.set_max_write_buffer_number(2);
    opts.set_compression_type(DBCompressionType::Lz4);
    opts
}

/// Maps a RocksDB error from opening the database to what the operator should do.
fn classify_open_error(dir: &Path, err: rocksdb::Error) -> StateError {
    // RocksDB messages may end with a period; the error text adds its own sentences.
    let message = err.to_string().trim_end().trim_end_matches('.').to_string();
    match err.kind() {
        ErrorKind::Corruption | ErrorKind::NotFound => StateError::Corrupt {
            dir: dir.to_path_buf(),
            detail: message,
        },
        ErrorKind::IOError if is_lock_error(&message) => StateError::Locked {
            dir: dir.to_path_buf(),
        },
        ErrorKind::IOError => StateError::io(dir.join(ROCKSDB_DIR), std::io::Error::other(message)),
        _ => StateError::backend(format!("open {}", dir.join(ROCKSDB_DIR).display()), message),
    }
}

/// Whether a RocksDB IOError is about the LOCK file (held by another process, or by another
/// handle in this process: "lock hold by current process").
fn is_lock_error(message: &str) -> bool {
    message.contains("/LOCK") || message.contains("lock hold by current process")
}

/// Whether `dir` exists and has at least one entry.
fn dir_has_entries(dir: &Path) -> Result<bool, StateError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StateError::io(dir, e)),
    }
}

/// The FORMAT file this crate writes.
fn format_text() -> String {
    format!("rill-state {FORMAT_VERSION}\nhash-id {HASH_ID}\n")
}

/// Writes FORMAT atomically (temporary file, fsync, rename, fsync of the directory).
fn write_format(dir: &Path) -> Result<(), StateError> {
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    let path = dir.join(FORMAT_FILE);
    let mut file = fs::File::create(&tmp).map_err(|e| StateError::io(&tmp, e))?;
    file.write_all(format_text().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| StateError::io(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| StateError::io(&path, e))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StateError::io(dir, e))
}

/// Checks the FORMAT file's text against this crate's format version and hash id.
pub(crate) fn check_format(dir: &Path, text: &str) -> Result<(), StateError> {
    let wrong = |detail: String| StateError::WrongFormat {
        dir: dir.to_path_buf(),
        detail,
    };
    let mut version = None;
    let mut hash_id = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        let slot = match key {
            "rill-state" => &mut version,
            "hash-id" => &mut hash_id,
            _ => continue,
        };
        *slot = Some(value.trim().parse::<u32>().map_err(|_| {
            wrong(format!(
                "{FORMAT_FILE} line `{line}` is not `{key} <number>`; it was not written by \
                 rill-state or was damaged: restore it (`{}`) or move the directory away",
                format_text().escape_debug()
            ))
        })?);
    }
    let (Some(version), Some(hash_id)) = (version, hash_id) else {
        return Err(wrong(format!(
            "{FORMAT_FILE} lacks the `rill-state` or `hash-id` line; it was not written by \
             rill-state or was damaged: restore it (`{}`) or move the directory away",
            format_text().escape_debug()
        )));
    };
    if version != FORMAT_VERSION {
        return Err(wrong(format!(
            "it is rill-state format {version}, this rill reads format {FORMAT_VERSION}: run the \
             rill version that wrote it, or move the directory away and restart to rebuild the \
             state from the changelog"
        )));
    }
    if hash_id != HASH_ID {
        return Err(wrong(format!(
            "its key ranges use key-hash id {hash_id}, this rill uses {HASH_ID}: run the rill \
             version that wrote it, or move the directory away and restart to rebuild the state \
             from the changelog"
        )));
    }
    Ok(())
}
