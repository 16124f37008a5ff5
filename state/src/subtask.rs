//! The state of one sub-task: a write cache per store and the atomic commit.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

use rill_topology::keyrange::{key_hash, KeyRange, HASH_ID};
use rill_topology::store::{Entries, KeyValueBytes, StoreError};
use rocksdb::{BoundColumnFamily, Direction, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::cf::{sub_task_column_families, ColumnFamilyId};
use crate::db::{SharedTable, StateDb};
use crate::error::StateError;
use crate::progress::{Progress, PROGRESS_VERSION};
use crate::read_cache::ReadCache;

/// First byte of every data key in a column family (`0x01 ++ user_key`).
pub const DATA_PREFIX: u8 = 0x01;
/// Key of the progress record in every column family (`0x00 ++ "progress"`).
pub const PROGRESS_KEY: &[u8] = b"\x00progress";

/// One write to a store: a key's new value (`None`: deleted) and the routing hash of the key it
/// is about (so the entry can follow its key range when the factor changes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreWrite {
    /// The store key.
    pub key: Vec<u8>,
    /// The new value; `None` for a delete.
    pub value: Option<Vec<u8>>,
    /// The routing hash of the key the entry is about (see [`SubTaskState::set_routing_hash`]).
    pub hash: u64,
}

/// Writes a commit applied to one store: the last write per key.
pub type StoreEntries = Vec<StoreWrite>;

/// A store's pending writes: the last write per user key as (routing hash, value or `None`).
type WriteCache = BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)>;

/// Length of the routing-hash prefix of every stored value.
const HASH_LEN: usize = 8;

/// A value as RocksDB stores it: the routing hash (big-endian), then the value.
fn stored_value(hash: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HASH_LEN + value.len());
    v.extend_from_slice(&hash.to_be_bytes());
    v.extend_from_slice(value);
    v
}

/// Splits a stored value into (routing hash, value); `None` when it is too short to be one.
fn split_stored(stored: &[u8]) -> Option<(u64, &[u8])> {
    let (hash, value) = stored.split_first_chunk::<HASH_LEN>()?;
    Some((u64::from_be_bytes(*hash), value))
}

/// `0x01 ++ key`.
fn data_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(DATA_PREFIX);
    k.extend_from_slice(key);
    k
}

/// The column family `name`, looked up where it is used (the handle borrows the database).
fn cf_handle<'a>(db: &'a StateDb, name: &str) -> Result<Arc<BoundColumnFamily<'a>>, String> {
    db.db()
        .cf_handle(name)
        .ok_or_else(|| format!("column family `{name}` does not exist (was it dropped?)"))
}

/// Where a store's column family lives: in RocksDB, or on the heap (an in-memory store).
enum Target<'a> {
    Disk(Arc<BoundColumnFamily<'a>>),
    Heap(SharedTable),
}

/// A write to a heap table, applied after the RocksDB part of its batch succeeded.
enum HeapWrite {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Every progress and data key (a `clear`).
    Clear,
}

/// One atomic write over column families on disk and on the heap. The heap part is applied once
/// the RocksDB WriteBatch is written, so a failed write changes neither; a crash loses the heap
/// tables whole, so they cannot be left half-written either.
#[derive(Default)]
struct Batch {
    disk: WriteBatch,
    heap: Vec<(SharedTable, HeapWrite)>,
}

impl Batch {
    fn put(&mut self, target: &Target<'_>, key: &[u8], value: &[u8]) {
        match target {
            Target::Disk(cf) => self.disk.put_cf(cf, key, value),
            Target::Heap(t) => self
                .heap
                .push((t.clone(), HeapWrite::Put(key.to_vec(), value.to_vec()))),
        }
    }

    fn delete(&mut self, target: &Target<'_>, key: &[u8]) {
        match target {
            Target::Disk(cf) => self.disk.delete_cf(cf, key),
            Target::Heap(t) => self.heap.push((t.clone(), HeapWrite::Delete(key.to_vec()))),
        }
    }

    /// Deletes the progress record and every data key.
    fn clear(&mut self, target: &Target<'_>) {
        match target {
            // Progress (0x00 ..) and data (0x01 ..) keys both sort below 0x02.
            Target::Disk(cf) => {
                self.disk
                    .delete_range_cf(cf, [0x00u8].as_slice(), [DATA_PREFIX + 1].as_slice())
            }
            Target::Heap(t) => self.heap.push((t.clone(), HeapWrite::Clear)),
        }
    }

    fn write(self, db: &StateDb) -> Result<(), rocksdb::Error> {
        db.db().write_opt(self.disk, &WriteOptions::default())?;
        for (table, write) in self.heap {
            let mut table = table.lock();
            match write {
                HeapWrite::Put(k, v) => {
                    table.insert(k, v);
                }
                HeapWrite::Delete(k) => {
                    table.remove(&k);
                }
                HeapWrite::Clear => table.clear(),
            }
        }
        Ok(())
    }
}

/// One store of a sub-task: its column family, its write cache and its sealed writes.
struct StoreHandle {
    name: String,
    cf: String,
    db: Arc<StateDb>,
    /// The heap table of an in-memory store (`None`: the column family is in RocksDB).
    memory: Option<SharedTable>,
    /// Every write since the last seal, in order, for a store whose changelog gets each write
    /// ([`StateDb::log_every_write`]); `None`: the changelog gets the last write per key.
    journal: Option<StoreEntries>,
    /// Writes since the last seal.
    cache: WriteCache,
    /// Writes of the sealed commit, waiting to be written (read below the cache).
    sealed: WriteCache,
    /// Committed values read recently (read below `sealed`). A cell: reads take `&self`, and
    /// one thread at a time uses a sub-task's state (`&mut SubTaskState` to reach a store).
    clean: RefCell<ReadCache>,
    /// The routing hash of the record being processed; `None` outside of one (punctuation).
    hash: Option<u64>,
    /// The sub-task's key range (where a new entry outside of a record may lie).
    range: KeyRange,
}

/// The routing hash of a new entry that no record's key gives: its key's own hash when the range
/// holds it (the DSL's key-value stores are keyed by the serialized routing key), else the
/// range's start (a store keyed otherwise has no routing key to follow).
fn own_hash(range: KeyRange, key: &[u8]) -> u64 {
    let h = key_hash(key);
    if range.contains(h) {
        h
    } else {
        range.start
    }
}

impl StoreHandle {
    fn backend(&self, message: impl std::fmt::Display) -> StoreError {
        StoreError::Backend {
            store: self.name.clone(),
            message: message.to_string(),
        }
    }

    fn corrupt_value(&self, key: &[u8]) -> StoreError {
        self.backend(format!(
            "the value of a key of {} bytes in `{}` has no routing hash: the state dir was written by another rill version or is corrupt",
            key.len(),
            self.cf
        ))
    }

    /// Puts a write in the write cache (and the journal, when the store keeps one).
    fn write(&mut self, key: &[u8], hash: u64, value: Option<Vec<u8>>) {
        if let Some(journal) = &mut self.journal {
            journal.push(StoreWrite {
                key: key.to_vec(),
                value: value.clone(),
                hash,
            });
        }
        self.cache.insert(key.to_vec(), (hash, value));
    }

    /// The writes since the last seal for the changelog: the journal when the store keeps one
    /// (each write with its key's last hash, so that one commit never puts a key in two
    /// ranges), else the last write per key of `sealed`.
    fn sealed_entries(&mut self) -> StoreEntries {
        match &mut self.journal {
            Some(journal) => std::mem::take(journal)
                .into_iter()
                .map(|mut w| {
                    if let Some((hash, _)) = self.sealed.get(&w.key) {
                        w.hash = *hash;
                    }
                    w
                })
                .collect(),
            None => self
                .sealed
                .iter()
                .map(|(k, (hash, v))| StoreWrite {
                    key: k.clone(),
                    value: v.clone(),
                    hash: *hash,
                })
                .collect(),
        }
    }

    /// Where the store's writes go.
    fn target<'a>(&self, db: &'a StateDb) -> Result<Target<'a>, String> {
        match &self.memory {
            Some(table) => Ok(Target::Heap(table.clone())),
            None => cf_handle(db, &self.cf).map(Target::Disk),
        }
    }

    /// `read` of the stored bytes of RocksDB key `key` (a progress or data key), read in place.
    fn get_raw<T>(&self, key: &[u8], read: impl FnOnce(&[u8]) -> T) -> Result<Option<T>, String> {
        if let Some(table) = &self.memory {
            return Ok(table.lock().get(key).map(|v| read(v)));
        }
        let cf = cf_handle(&self.db, &self.cf)?;
        self.db
            .db()
            .get_pinned_cf(&cf, key)
            .map(|v| v.map(|v| read(&v)))
            .map_err(|e| format!("get from `{}`: {e}", self.cf))
    }

    /// The committed (key, routing hash, value) entries between `from` and `to` in RocksDB,
    /// without the write caches.
    fn scan_stored(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> Result<StoreEntries, StoreError> {
        // Iterator bounds on the prefixed RocksDB keys: lower inclusive, upper exclusive.
        let lower = match from {
            Bound::Included(k) => data_key(k),
            Bound::Excluded(k) => {
                let mut k = data_key(k);
                k.push(0);
                k
            }
            Bound::Unbounded => vec![DATA_PREFIX],
        };
        let upper = match to {
            Bound::Included(k) => {
                let mut k = data_key(k);
                k.push(0);
                k
            }
            Bound::Excluded(k) => data_key(k),
            Bound::Unbounded => vec![DATA_PREFIX + 1],
        };
        if lower >= upper {
            return Ok(Vec::new());
        }
        let decode = |k: &[u8], v: &[u8]| {
            let (hash, value) = split_stored(v).ok_or_else(|| self.corrupt_value(k))?;
            Ok(StoreWrite {
                key: k.to_vec(),
                value: Some(value.to_vec()),
                hash,
            })
        };
        if let Some(table) = &self.memory {
            return table
                .lock()
                .range(lower..upper)
                .filter_map(|(k, v)| Some((k.strip_prefix(&[DATA_PREFIX])?, v)))
                .map(|(k, v)| decode(k, v))
                .collect();
        }
        let cf = cf_handle(&self.db, &self.cf).map_err(|e| self.backend(e))?;
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(lower.clone());
        opts.set_iterate_upper_bound(upper);
        let iter =
            self.db
                .db()
                .iterator_cf_opt(&cf, opts, IteratorMode::From(&lower, Direction::Forward));
        let mut stored = Vec::new();
        for item in iter {
            let (k, v) = item.map_err(|e| self.backend(format!("scan `{}`: {e}", self.cf)))?;
            // The bounds keep the scan on data keys; skip anything else defensively.
            if let Some(k) = k.strip_prefix(&[DATA_PREFIX]) {
                stored.push(decode(k, &v)?);
            }
        }
        Ok(stored)
    }

    /// The routing hash of the pending or committed entry of `key`, if it has one.
    fn entry_hash(&self, key: &[u8]) -> Result<Option<u64>, StoreError> {
        if let Some((hash, _)) = self.cache.get(key).or_else(|| self.sealed.get(key)) {
            return Ok(Some(*hash));
        }
        if self.clean.borrow().get(key) == Some(None) {
            return Ok(None);
        }
        Ok(self.get_stored(key)?.map(|(hash, _)| hash))
    }

    /// The routing hash a write of `key` carries (the factor and restore invariants, DESIGN.md).
    /// A record's put carries the record's hash: the DSL writes only the record's own key while
    /// handling it, and a store keyed otherwise keeps its entries where the records that wrote
    /// them are routed; deciding by the record costs no read. A delete, and every write outside
    /// of a record, keeps the hash of the entry it replaces: a tombstone or a punctuator's rewrite
    /// goes where the entry is, whoever caused it. A new entry outside of a record: [`own_hash`].
    fn write_hash(&self, key: &[u8], delete: bool) -> Result<u64, StoreError> {
        match self.hash {
            Some(hash) if !delete => Ok(hash),
            hash => Ok(self
                .entry_hash(key)?
                .or(hash)
                .unwrap_or_else(|| own_hash(self.range, key))),
        }
    }

    /// The committed (routing hash, value) of `key`, without the write caches.
    fn get_stored(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let decode = |v: &[u8]| split_stored(v).map(|(hash, value)| (hash, value.to_vec()));
        match self.get_raw(&data_key(key), decode) {
            Err(e) => Err(self.backend(e)),
            Ok(None) => Ok(None),
            Ok(Some(decoded)) => decoded.map(Some).ok_or_else(|| self.corrupt_value(key)),
        }
    }
}

impl KeyValueBytes for StoreHandle {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some((_, pending)) = self.cache.get(key).or_else(|| self.sealed.get(key)) {
            return Ok(pending.clone());
        }
        if let Some(committed) = self.clean.borrow().get(key) {
            return Ok(committed.map(<[u8]>::to_vec));
        }
        let value = self.get_stored(key)?.map(|(_, v)| v);
        self.clean.borrow_mut().remember(key, value.as_deref());
        Ok(value)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let hash = self.write_hash(key, false)?;
        self.write(key, hash, Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let hash = self.write_hash(key, true)?;
        self.write(key, hash, None);
        Ok(())
    }

    fn routing_hash_of(&self, key: &[u8]) -> Result<Option<u64>, StoreError> {
        self.entry_hash(key)
    }

    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Entries, StoreError> {
        if is_empty_range(from, to) {
            return Ok(Vec::new());
        }
        let stored = self.scan_stored(from, to)?;
        let bounds = (from.map(<[u8]>::to_vec), to.map(<[u8]>::to_vec));
        let below = merge(
            stored
                .into_iter()
                .filter_map(|w| Some((w.key, w.value?)))
                .peekable(),
            self.sealed
                .range::<Vec<u8>, _>(bounds.clone())
                .map(|(k, (_, v))| (k, v))
                .peekable(),
        );
        Ok(merge(
            below.into_iter().peekable(),
            self.cache
                .range::<Vec<u8>, _>(bounds)
                .map(|(k, (_, v))| (k, v))
                .peekable(),
        ))
    }
}

/// Whether no key lies between `from` and `to` (BTreeMap ranges panic on such bounds).
fn is_empty_range(from: Bound<&[u8]>, to: Bound<&[u8]>) -> bool {
    match (from, to) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
        _ => false,
    }
}

/// Merges stored entries with the write cache, both in key order: the cache wins, and its
/// deletes hide stored entries.
fn merge<'c>(
    mut stored: Peekable<impl Iterator<Item = (Vec<u8>, Vec<u8>)>>,
    mut cache: Peekable<impl Iterator<Item = (&'c Vec<u8>, &'c Option<Vec<u8>>)>>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let order = match (stored.peek(), cache.peek()) {
            (None, None) => return out,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((s, _)), Some((c, _))) => s.as_slice().cmp(c.as_slice()),
        };
        if order == Ordering::Equal {
            stored.next(); // shadowed by the cache
        }
        if order == Ordering::Less {
            if let Some(entry) = stored.next() {
                out.push(entry);
            }
        } else if let Some((k, Some(v))) = cache.next() {
            out.push((k.clone(), v.clone()));
        }
    }
}

/// The state of one sub-task, (partition, key range) over its stores: write caches and the
/// atomic commit of state plus progress.
///
/// Concurrency: a `SubTaskState` owns its column families (one per store) for its whole life;
/// [`StateDb`] refuses a second owner ([`StateError::InUse`]) and refuses to drop an owned column
/// family. Different sub-tasks therefore write disjoint column families and can commit from
/// different threads at once; one `SubTaskState` is used by one thread at a time (`&mut self`).
pub struct SubTaskState {
    db: Arc<StateDb>,
    partition: u32,
    range: KeyRange,
    stores: Vec<StoreHandle>,
    /// Column family names, in store order (what this sub-task owns).
    cf_names: Vec<String>,
    committed: Option<Progress>,
    /// Whether the stores' `sealed` writes wait for `write_sealed`.
    has_sealed: bool,
    /// In-memory stores that had no progress record at open next to stores that had one.
    lost: Vec<String>,
}

impl std::fmt::Debug for SubTaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubTaskState")
            .field("partition", &self.partition)
            .field("range", &self.range)
            .field("column_families", &self.cf_names)
            .field("pending_writes", &self.pending_writes())
            .finish_non_exhaustive()
    }
}

impl SubTaskState {
    /// Opens (creating when missing) the column family of each store for (partition, range),
    /// and reads the progress of the last commit.
    pub fn open(
        db: Arc<StateDb>,
        stores: &[String],
        partition: u32,
        range: KeyRange,
    ) -> Result<Self, StateError> {
        let ids = sub_task_column_families(stores, partition, range)?;
        let cf_names: Vec<String> = ids.iter().map(ColumnFamilyId::name).collect();
        db.claim(&cf_names)?;
        // From here on, Drop releases the claim, also when reading the progress fails.
        let mut state = SubTaskState {
            stores: ids
                .iter()
                .zip(&cf_names)
                .map(|(id, cf)| StoreHandle {
                    name: id.store.clone(),
                    cf: cf.clone(),
                    memory: db.memory_table(cf),
                    journal: db.logs_every_write(&id.store).then(Vec::new),
                    db: db.clone(),
                    cache: WriteCache::new(),
                    sealed: WriteCache::new(),
                    clean: RefCell::new(ReadCache::new(db.read_budget())),
                    hash: None,
                    range,
                })
                .collect(),
            db,
            partition,
            range,
            cf_names,
            committed: None,
            has_sealed: false,
            lost: Vec::new(),
        };
        state.committed = state.read_progress()?;
        if state.committed.is_some() {
            for store in &state.stores {
                if store.memory.is_some()
                    && store.get_raw(PROGRESS_KEY, |_| ()).ok().flatten().is_none()
                {
                    state.lost.push(store.name.clone());
                }
            }
        }
        Ok(state)
    }

    /// Reads the progress record of every store; all present records must agree.
    fn read_progress(&self) -> Result<Option<Progress>, StateError> {
        let mut found: Option<(&str, Progress)> = None;
        for store in &self.stores {
            let corrupt = |detail: String| StateError::Corrupt {
                dir: self.db.dir().to_path_buf(),
                detail: format!("column family `{}`: {detail}", store.cf),
            };
            let read = store
                .get_raw(PROGRESS_KEY, Progress::from_bytes)
                .map_err(|e| corrupt(format!("reading the progress record: {e}")))?;
            let Some(read) = read else { continue };
            let progress = read.map_err(corrupt)?;
            if progress.range() != self.range {
                return Err(corrupt(format!(
                    "its progress record is for range {}",
                    progress.range()
                )));
            }
            match &found {
                None => found = Some((&store.name, progress)),
                Some((first, p)) if *p != progress => {
                    return Err(StateError::ProgressMismatch {
                        partition: self.partition,
                        range: self.range,
                        detail: format!(
                            "store `{first}` is at offsets {:?}, store `{}` at offsets {:?}",
                            p.offsets, store.name, progress.offsets
                        ),
                    });
                }
                Some(_) => {}
            }
        }
        // A store without a record next to stores with one was added to the topology since
        // the last commit: it starts empty, as a new store would.
        Ok(found.map(|(_, p)| p))
    }

    /// The input partition.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The key range.
    pub fn range(&self) -> KeyRange {
        self.range
    }

    /// The in-memory stores whose entries were lost with the process that held them: they had no
    /// progress record when this state was opened, while its other stores had one. The task
    /// must restore them from their changelogs before it trusts the other stores' progress.
    pub fn lost_in_memory(&self) -> &[String] {
        &self.lost
    }

    /// The progress record of the last commit, if any (read from disk at open, then updated by
    /// every successful [`commit`](Self::commit)).
    pub fn committed_progress(&self) -> Option<&Progress> {
        self.committed.as_ref()
    }

    /// Byte-level access to one store; reads see uncommitted writes in the write cache.
    pub fn store(&mut self, name: &str) -> Option<&mut dyn KeyValueBytes> {
        self.stores
            .iter_mut()
            .find(|s| s.name == name)
            .map(|s| s as &mut dyn KeyValueBytes)
    }

    /// The routing hash of the record whose writes are being made (`None` outside of one, and
    /// without stores).
    pub fn routing_hash(&self) -> Option<u64> {
        self.stores.first().and_then(|s| s.hash)
    }

    /// Tags the puts that follow with `hash`, the routing hash of the record being processed
    /// (deletes keep their entry's hash: see [`KeyValueBytes::routing_hash_of`]).
    pub fn set_routing_hash(&mut self, hash: u64) {
        for s in &mut self.stores {
            s.hash = Some(hash);
        }
    }

    /// The writes that follow are caused by no record (punctuation, init): each keeps the hash of
    /// the entry it replaces, and a new entry takes its key's hash when the range holds it, else
    /// the range's start.
    pub fn clear_routing_hash(&mut self) {
        for s in &mut self.stores {
            s.hash = None;
        }
    }

    /// Makes the next commit write `key` of `store` again with its committed value and routing
    /// hash (a delete when absent), unless the write cache already has it.
    pub fn touch(&mut self, store: &str, key: &[u8]) -> Result<(), StateError> {
        let range = self.range;
        let Some(s) = self.stores.iter_mut().find(|s| s.name == store) else {
            return Ok(());
        };
        if s.cache.contains_key(key) {
            return Ok(());
        }
        let write = match s.sealed.get(key) {
            Some(pending) => pending.clone(),
            None => match s
                .get_stored(key)
                .map_err(|e| StateError::backend("repair", e))?
            {
                Some((hash, value)) => (hash, Some(value)),
                None => (own_hash(range, key), None),
            },
        };
        s.write(key, write.0, write.1);
        Ok(())
    }

    /// Whether `store` has a committed entry for `key`.
    pub fn holds_committed(&self, store: &str, key: &[u8]) -> Result<bool, StateError> {
        let Some(s) = self.stores.iter().find(|s| s.name == store) else {
            return Ok(false);
        };
        s.get_stored(key)
            .map(|v| v.is_some())
            .map_err(|e| StateError::backend("read", e))
    }

    /// Every committed entry of `store` with its routing hash, in key order (for moving entries
    /// between ranges).
    pub fn committed_entries(&self, store: &str) -> Result<StoreEntries, StateError> {
        let Some(s) = self.stores.iter().find(|s| s.name == store) else {
            return Ok(Vec::new());
        };
        s.scan_stored(Bound::Unbounded, Bound::Unbounded)
            .map_err(|e| StateError::backend("scan", e))
    }

    /// Whether any store has writes since the last seal or commit.
    pub fn is_dirty(&self) -> bool {
        self.stores.iter().any(|s| !s.cache.is_empty())
    }

    /// Number of uncommitted entries (distinct keys written) over all stores.
    pub fn pending_writes(&self) -> usize {
        self.stores
            .iter()
            .map(|s| s.cache.len() + s.sealed.len())
            .sum()
    }

    /// Applies every store's write cache and `progress` in ONE RocksDB WriteBatch (the progress
    /// record goes into each store's column family), clears the caches, and returns the entries
    /// applied, per store in the order given at open (deduplicated: the last write per key;
    /// `None` = delete). The same as [`seal`](Self::seal) then [`write_sealed`](Self::write_sealed).
    ///
    /// On error nothing is applied and the writes stay sealed. A sub-task without stores writes
    /// nothing (its progress lives in the commit metadata only).
    pub fn commit(
        &mut self,
        progress: Progress,
    ) -> Result<Vec<(String, StoreEntries)>, StateError> {
        self.check_progress(&progress)?;
        let entries = self.seal()?;
        self.write_sealed(progress)?;
        Ok(entries)
    }

    /// Freezes the write caches as the next commit, to be written later by
    /// [`write_sealed`](Self::write_sealed) (once the outputs it covers are durable), and returns
    /// its entries per store (for the changelog). Reads keep seeing the sealed writes; new writes
    /// go to fresh caches.
    ///
    /// Fails when a commit is already sealed: write it first.
    pub fn seal(&mut self) -> Result<Vec<(String, StoreEntries)>, StateError> {
        if self.has_sealed {
            return Err(StateError::InvalidProgress {
                cf_prefix: format!("partition {} range {}", self.partition, self.range),
                detail: "a commit is already sealed; write it before sealing the next".into(),
            });
        }
        self.has_sealed = true;
        Ok(self
            .stores
            .iter_mut()
            .map(|store| {
                store.sealed = std::mem::take(&mut store.cache);
                (store.name.clone(), store.sealed_entries())
            })
            .collect())
    }

    /// Whether a sealed commit waits to be written.
    pub fn has_sealed(&self) -> bool {
        self.has_sealed
    }

    /// Writes the sealed writes with `progress` in one WriteBatch (see [`commit`](Self::commit));
    /// without a sealed commit, writes `progress` alone. On error nothing is applied and the
    /// writes stay sealed.
    pub fn write_sealed(&mut self, progress: Progress) -> Result<(), StateError> {
        self.check_progress(&progress)?;
        self.write_batch(&progress)?;
        for store in &mut self.stores {
            let clean = store.clean.get_mut();
            for (key, (_, value)) in std::mem::take(&mut store.sealed) {
                clean.committed(key, value);
            }
        }
        self.has_sealed = false;
        self.committed = Some(progress);
        Ok(())
    }

    /// Writes restored changelog entries of `store` straight to its column family, with
    /// `progress` (in every store's column family) when given, in one WriteBatch. Restore replays
    /// absolute values, so applying the same entries again is harmless.
    pub fn apply_restored(
        &mut self,
        store: &str,
        entries: &[StoreWrite],
        progress: Option<Progress>,
    ) -> Result<(), StateError> {
        if let Some(p) = &progress {
            self.check_progress(p)?;
        }
        let mut batch = Batch::default();
        for s in &self.stores {
            let cf = s
                .target(&self.db)
                .map_err(|e| StateError::backend("restore", e))?;
            if s.name == store {
                for w in entries {
                    match &w.value {
                        Some(v) => batch.put(&cf, &data_key(&w.key), &stored_value(w.hash, v)),
                        None => batch.delete(&cf, &data_key(&w.key)),
                    }
                }
            }
            if let Some(p) = &progress {
                batch.put(&cf, PROGRESS_KEY, &p.to_bytes());
            }
        }
        batch
            .write(&self.db)
            .map_err(|e| StateError::backend(format!("restore into `{store}`"), e))?;
        if let Some(s) = self.stores.iter_mut().find(|s| s.name == store) {
            let clean = s.clean.get_mut();
            for w in entries {
                clean.written(&w.key, w.value.as_deref());
            }
        }
        if progress.is_some() {
            self.committed = progress;
        }
        Ok(())
    }

    /// One WriteBatch: every store's sealed writes plus `progress` in each store's column family.
    fn write_batch(&self, progress: &Progress) -> Result<(), StateError> {
        if self.stores.is_empty() {
            return Ok(());
        }
        let encoded = progress.to_bytes();
        let mut batch = Batch::default();
        for store in &self.stores {
            let cf = store
                .target(&self.db)
                .map_err(|e| StateError::backend("commit", e))?;
            for (key, (hash, value)) in &store.sealed {
                match value {
                    Some(v) => batch.put(&cf, &data_key(key), &stored_value(*hash, v)),
                    None => batch.delete(&cf, &data_key(key)),
                }
            }
            batch.put(&cf, PROGRESS_KEY, &encoded);
        }
        // WAL on, no fsync per commit: a process crash keeps the commit (it is in the OS
        // page cache); a machine crash may lose the last commits, state and progress
        // together, and the range then catches up from its recorded position.
        batch.write(&self.db).map_err(|e| {
            StateError::backend(
                format!(
                    "commit partition {} range {} ({})",
                    self.partition,
                    self.range,
                    self.cf_names.join(", ")
                ),
                e,
            )
        })
    }

    /// Checks that `progress` is a current-version record for this sub-task's range.
    fn check_progress(&self, progress: &Progress) -> Result<(), StateError> {
        let problem = if progress.version != PROGRESS_VERSION {
            Some(format!(
                "version {} (expected {PROGRESS_VERSION}; build it with Progress::new)",
                progress.version
            ))
        } else if progress.hash_id != HASH_ID {
            Some(format!("hash id {} (expected {HASH_ID})", progress.hash_id))
        } else if progress.range() != self.range {
            Some(format!(
                "range {} (this sub-task's range is {})",
                progress.range(),
                self.range
            ))
        } else {
            None
        };
        match problem {
            Some(detail) => Err(StateError::InvalidProgress {
                cf_prefix: format!("partition {} range {}", self.partition, self.range),
                detail,
            }),
            None => Ok(()),
        }
    }

    /// Deletes every entry and the progress record of this sub-task's stores in one WriteBatch,
    /// and drops uncommitted writes: the range then restores from scratch (used when its local
    /// state cannot be trusted).
    pub fn clear(&mut self) -> Result<(), StateError> {
        for s in &mut self.stores {
            s.clean.get_mut().clear();
        }
        let mut batch = Batch::default();
        for s in &self.stores {
            let cf = s
                .target(&self.db)
                .map_err(|e| StateError::backend("clear", e))?;
            batch.clear(&cf);
        }
        batch.write(&self.db).map_err(|e| {
            StateError::backend(
                format!("clear partition {} range {}", self.partition, self.range),
                e,
            )
        })?;
        self.discard();
        self.committed = None;
        Ok(())
    }

    /// Drops uncommitted writes, sealed ones included (used when a sub-task is abandoned).
    pub fn discard(&mut self) {
        for store in &mut self.stores {
            store.cache.clear();
            store.sealed.clear();
            if let Some(journal) = &mut store.journal {
                journal.clear();
            }
        }
        self.has_sealed = false;
    }
}

/// Writes `progress[i]` as the progress of `new[i]` and deletes the progress of every `old`
/// state, in ONE WriteBatch (the switch of a re-split; see [`crate::resplit`]).
///
/// The stores in `lost` (in-memory stores lost with an earlier process) get no progress record in
/// the new ranges, so that their loss is still seen when the new ranges open
/// ([`SubTaskState::lost_in_memory`]).
pub(crate) fn swap_progress(
    new: &mut [SubTaskState],
    progress: Vec<Option<Progress>>,
    old: &mut [SubTaskState],
    lost: &BTreeSet<String>,
) -> Result<(), StateError> {
    let Some(db) = new.first().map(|s| s.db.clone()) else {
        return Ok(());
    };
    let mut batch = Batch::default();
    for (state, p) in new.iter().zip(&progress) {
        let Some(p) = p else { continue };
        state.check_progress(p)?;
        let encoded = p.to_bytes();
        for store in state.stores.iter().filter(|s| !lost.contains(&s.name)) {
            let cf = store
                .target(&db)
                .map_err(|e| StateError::backend("re-split", e))?;
            batch.put(&cf, PROGRESS_KEY, &encoded);
        }
    }
    for state in old.iter() {
        for store in &state.stores {
            let cf = store
                .target(&db)
                .map_err(|e| StateError::backend("re-split", e))?;
            batch.delete(&cf, PROGRESS_KEY);
        }
    }
    batch
        .write(&db)
        .map_err(|e| StateError::backend("re-split", e))?;
    for (state, p) in new.iter_mut().zip(progress) {
        state.committed = p;
    }
    for state in old.iter_mut() {
        state.committed = None;
    }
    Ok(())
}

impl Drop for SubTaskState {
    /// Releases the column families; uncommitted writes are dropped, as by `discard`.
    fn drop(&mut self) {
        self.db.release(&self.cf_names);
    }
}
