//! rill's state: one shared RocksDB per process, a column family per (store, partition, key
//! range), write caches, and atomic commits of state together with progress.
//!
//! Applications do not use this crate directly: the runtime of the `rill` crate owns the state
//! directory and opens, commits and restores it for the topology's stores, which processors
//! reach through the topology's store traits. It is re-exported as `rill::state` for tools that
//! inspect a state directory and for rill's own tests and benchmarks.
//!
//! # Layout
//!
//! ```text
//! state.dir/
//!   FORMAT        "rill-state 2\nhash-id 1\n": layout version and key-hash id (checked at open)
//!   CLUSTER       the Kafka cluster id the state's offsets belong to (checked by the runtime)
//!   rocksdb/      ONE RocksDB for the whole process (multi-threaded column families)
//!     column family "{store}.p{partition}.r{start:016x}-{end:016x}", e.g.
//!     "counts.p3.r8000000000000000-ffffffffffffffff"
//!       0x00 "progress"   the sub-task's Progress record (prost, versioned)
//!       0x01 ++ key       the store's data, one entry per user key: the routing hash of the
//!                         record that wrote it (8 bytes, big-endian), then the value
//! ```
//!
//! - [`StateDb`] opens the database with every existing column family and owns the single memory
//!   budget: one LRU block cache shared by every column family, and one write-buffer manager that
//!   charges all memtables to that cache, so memory stays bounded whatever the number of column
//!   families ([`StateDb::memory_usage`]).
//! - A sub-task is (task, key range). [`SubTaskState`] owns the column family of each of its
//!   stores for its partition and range, so no two sub-tasks write the same memtable and
//!   sub-tasks commit from different threads without contention.
//! - Processors read and write a store through [`SubTaskState::store`] (the topology's
//!   [`KeyValueBytes`](rill_topology::store::KeyValueBytes)). Writes go to a per-store write
//!   cache (last write per key; reads see them); nothing reaches RocksDB until the commit.
//!   Below it, a read cache keeps the committed values of keys read or committed recently, in
//!   an eighth of the memory budget, so that hot keys are not searched in RocksDB again.
//! - [`SubTaskState::commit`] writes every store's cache **and** the sub-task's [`Progress`]
//!   (into each store's column family) in ONE WriteBatch with the WAL on: after any crash, a
//!   range's data and its progress are both there or both absent, so the range resumes exactly
//!   where its state stops. The commit returns the applied entries for the changelog.
//! - Nothing is ever wiped: a directory of another format, a corrupt database or a locked one is
//!   a [`StateError`] that says what to do.
//!
//! ```no_run
//! # fn main() -> Result<(), rill_state::StateError> {
//! use rill_state::{Progress, StateConfig, StateDb, SubTaskState};
//! use rill_topology::keyrange::KeyRange;
//!
//! let db = StateDb::open(&StateConfig {
//!     dir: "/var/lib/rill".into(),
//!     memory_bytes: 256 << 20,
//!     create_column_families: Vec::new(),
//!     max_open_files: None,
//! })?;
//! let range = KeyRange::nth(0, 4);
//! let mut state = SubTaskState::open(db.clone(), &["counts".to_string()], 0, range)?;
//! let resume_at = state.committed_progress().map_or(0, |p| p.next_offset("orders").unwrap_or(0));
//! if let Some(store) = state.store("counts") {
//!     store.put(b"word", b"1").ok();
//! }
//! let changelog = state.commit(Progress::new(range, "orders", resume_at + 1))?;
//! # let _ = changelog;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![warn(unnameable_types)]

pub mod carry;
mod cf;
mod db;
mod error;
pub mod inspect;
mod progress;
mod read_cache;
pub mod resplit;
mod subtask;

#[cfg(test)]
mod tests;

pub use cf::{sub_task_column_families, validate_store_name, ColumnFamilyId, MAX_STORE_NAME_LEN};
pub use db::{
    MemoryUsage, StateConfig, StateDb, APPLICATION_FILE, CLUSTER_FILE, FORMAT_FILE, FORMAT_VERSION,
    MIN_MEMORY_BYTES, MIN_OPEN_FILES, ROCKSDB_DIR,
};
pub use error::StateError;
pub use progress::{CarriedOffset, Origin, Progress, StoreTime, TopicOffset, PROGRESS_VERSION};
pub use subtask::{StoreEntries, StoreWrite, SubTaskState, DATA_PREFIX, PROGRESS_KEY};
