//! Errors of the state layer. Each message says what the operator (or the caller) should do.

use std::path::PathBuf;

use rill_topology::keyrange::KeyRange;

/// Why a state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state directory was written by another format version or key-hash function.
    #[error("state directory {dir} has the wrong format: {detail}")]
    WrongFormat {
        /// The state directory.
        dir: PathBuf,
        /// What differs, and what to do about it.
        detail: String,
    },
    /// RocksDB (or rill's own records in it) reports corruption.
    #[error(
        "state directory {dir} is corrupt: {detail}. rill never wipes state by itself: set \
         state.corruption.handler=rebuild (the database is moved aside and the stores rebuild \
         from their changelogs), or move the directory away and restart"
    )]
    Corrupt {
        /// The state directory.
        dir: PathBuf,
        /// What RocksDB (or rill) found.
        detail: String,
    },
    /// The RocksDB LOCK file of the state directory is held by someone else.
    #[error(
        "state directory {dir} is locked: another rill process (or another StateDb in this \
         process) uses it: stop it or set another state.dir"
    )]
    Locked {
        /// The state directory.
        dir: PathBuf,
    },
    /// A file-system operation on the state directory failed.
    #[error("state directory I/O failed on {path}: {source}. Check that the path exists, is writable and the disk is not full")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The state belongs to another Kafka cluster than the one the brokers are.
    #[error(
        "state directory {dir} holds the state of Kafka cluster `{recorded}`, but the brokers are \
         cluster `{current}`: its offsets mean nothing there (a rebuilt cluster, or another one). \
         Point state.dir at a new directory, or move this one away to start from the new cluster's \
         changelogs"
    )]
    OtherCluster {
        /// The state directory.
        dir: PathBuf,
        /// The cluster id recorded in it.
        recorded: String,
        /// The cluster id of the brokers now.
        current: String,
    },
    /// The state belongs to another `application.id`.
    #[error(
        "state directory {dir} belongs to application.id `{recorded}`, not `{current}`: \
         applications must not share a state dir. Set state.dir to a directory of this \
         application's own, or move this one away"
    )]
    OtherApplication {
        /// The state directory.
        dir: PathBuf,
        /// The application id recorded in it.
        recorded: String,
        /// The application id configured now.
        current: String,
    },
    /// The state holds stores the topology does not have: another topology wrote it.
    #[error(
        "state directory {dir} holds the stores {unknown:?}, which this topology does not have \
         (its stores: {known:?}): another topology wrote it. Set state.dir to a directory of \
         this topology's own, or move this one away (stores rebuild from their changelogs)"
    )]
    OtherTopology {
        /// The state directory.
        dir: PathBuf,
        /// Stores in the directory that the topology lacks.
        unknown: Vec<String>,
        /// The topology's stores.
        known: Vec<String>,
    },
    /// A store name that cannot be part of a column family name.
    #[error("invalid store name `{name}`: {reason}")]
    InvalidStoreName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A key range whose start is above its end.
    #[error("invalid key range {range:?}: start is above end")]
    InvalidRange {
        /// The rejected range.
        range: KeyRange,
    },
    /// The memory budget is too small to run RocksDB.
    #[error("rocksdb.memory.bytes = {bytes} is below the minimum of {min} bytes: raise it")]
    MemoryBudgetTooSmall {
        /// The configured budget.
        bytes: usize,
        /// The smallest accepted budget.
        min: usize,
    },
    /// The bound on open files is below what RocksDB accepts.
    #[error(
        "rocksdb.max.open.files = {files} is below the minimum of {min}: raise it, or set -1 \
         for no bound"
    )]
    OpenFilesTooFew {
        /// The configured bound.
        files: u32,
        /// The smallest accepted bound.
        min: u32,
    },
    /// A column family is used by a live [`SubTaskState`](crate::SubTaskState).
    #[error(
        "column family `{cf}` is in use by an open sub-task state; drop that SubTaskState first \
         (only one sub-task may own a column family)"
    )]
    InUse {
        /// The column family name.
        cf: String,
    },
    /// A progress record handed to `commit` does not belong to the sub-task.
    #[error("invalid progress record for {cf_prefix}: {detail}")]
    InvalidProgress {
        /// `{store}.p{partition}.r{range}` of the first store, or the partition and range.
        cf_prefix: String,
        /// What is wrong.
        detail: String,
    },
    /// The column families of one sub-task hold different progress records.
    #[error(
        "the stores of partition {partition} range {range} disagree on their progress: {detail}. \
         This happens when a store is removed from the topology and added back later while its \
         old column family was kept; drop that store's column families (StateDb::drop_partition \
         or `rill state`) or move the state directory away to rebuild from the changelog"
    )]
    ProgressMismatch {
        /// The partition.
        partition: u32,
        /// The key range.
        range: KeyRange,
        /// Which stores disagree, and how.
        detail: String,
    },
    /// RocksDB failed at run time (not while opening).
    #[error("RocksDB failed to {op}: {message}")]
    Backend {
        /// What rill was doing.
        op: String,
        /// What RocksDB reported.
        message: String,
    },
}

impl StateError {
    /// A [`StateError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StateError::Io {
            path: path.into(),
            source,
        }
    }

    /// A [`StateError::Backend`] for `op`.
    pub(crate) fn backend(op: impl Into<String>, err: impl std::fmt::Display) -> Self {
        StateError::Backend {
            op: op.into(),
            message: err.to_string(),
        }
    }
}
