//! A read-only look at a state directory, for operators (`rill state inspect DIR`).
//!
//! [`inspect`] reads the directory's `FORMAT`, `APPLICATION` and `CLUSTER` files, opens its
//! RocksDB **read-only** (nothing in the directory is written, renamed or created: no WAL
//! recovery is persisted, no LOG or OPTIONS file is written) and reports per column family the
//! store, partition and key range, the range's progress record (offsets per source topic,
//! changelog checkpoints, stream time, lineage) and its approximate entries and size.
//!
//! A directory in use by a running instance is refused ([`StateError::Locked`]): RocksDB lets a
//! read-only handle open beside a writer, but the writer may delete the files it reads, and the
//! picture would be stale at once. (The check asks the operating system whether another process
//! holds the RocksDB `LOCK` file; a handle of the calling process is not seen.)

use std::fs;
use std::path::{Path, PathBuf};

use rocksdb::{Options, DB};

use crate::cf::ColumnFamilyId;
use crate::db::{check_format, APPLICATION_FILE, CLUSTER_FILE, FORMAT_FILE, ROCKSDB_DIR};
use crate::error::StateError;
use crate::progress::Progress;
use crate::subtask::{DATA_PREFIX, PROGRESS_KEY};

/// What [`inspect`] found in a state directory.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// The state directory.
    pub dir: PathBuf,
    /// The `FORMAT` file's text (checked against this rill's format).
    pub format: String,
    /// The `APPLICATION` file's `application.id`, when the directory has one.
    pub application: Option<String>,
    /// The `CLUSTER` file's Kafka cluster id, when the directory has one.
    pub cluster: Option<String>,
    /// rill's column families, in id order (store, partition, range).
    pub column_families: Vec<ColumnFamilyReport>,
    /// Column families whose names are not rill's (RocksDB's `default` left out).
    pub other_column_families: Vec<String>,
    /// Bytes of the files under `rocksdb/` (SST files, WAL, MANIFEST, ...).
    pub disk_bytes: u64,
}

/// One column family: a store's data for one partition and key range.
#[derive(Clone, Debug)]
pub struct ColumnFamilyReport {
    /// Store, partition and key range.
    pub id: ColumnFamilyId,
    /// The range's progress record.
    pub progress: ProgressRecord,
    /// Entries of the store: RocksDB's estimate (`rocksdb.estimate-num-keys`, less the
    /// progress record), or the exact count when [`InspectOptions::count_entries`] is set.
    pub entries: u64,
    /// Whether [`ColumnFamilyReport::entries`] is an exact count.
    pub entries_exact: bool,
    /// Bytes of the column family's SST files (`rocksdb.total-sst-files-size`).
    pub sst_bytes: u64,
    /// Bytes of its memtables, filled from the WAL at open (`rocksdb.cur-size-all-mem-tables`).
    pub memtable_bytes: u64,
}

/// A column family's progress record.
#[derive(Clone, Debug)]
pub enum ProgressRecord {
    /// There is none: the range never committed.
    Missing,
    /// The decoded record.
    Valid(Box<Progress>),
    /// A record this rill cannot read, and why.
    Invalid(String),
}

impl ProgressRecord {
    /// The record, when there is a valid one.
    pub fn valid(&self) -> Option<&Progress> {
        match self {
            ProgressRecord::Valid(p) => Some(p),
            _ => None,
        }
    }
}

/// How much work [`inspect`] does.
#[derive(Clone, Copy, Debug, Default)]
pub struct InspectOptions {
    /// Count each column family's entries by reading them all (exact, but reads the whole
    /// state) instead of RocksDB's estimate.
    pub count_entries: bool,
}

/// Inspects the state directory `dir` without changing anything in it (see the module docs).
///
/// Errors: a missing directory ([`StateError::Io`]), one that is not a rill state directory or
/// of another format ([`StateError::WrongFormat`]), a database that cannot be read
/// ([`StateError::Corrupt`]), or one in use by a running instance ([`StateError::Locked`]).
pub fn inspect(dir: &Path, options: InspectOptions) -> Result<Inspection, StateError> {
    let meta = fs::metadata(dir).map_err(|e| StateError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(StateError::WrongFormat {
            dir: dir.to_path_buf(),
            detail: "it is not a directory".into(),
        });
    }
    let rocks = dir.join(ROCKSDB_DIR);
    let format = match read_optional(&dir.join(FORMAT_FILE))? {
        Some(text) => text,
        None => {
            return Err(StateError::WrongFormat {
                dir: dir.to_path_buf(),
                detail: format!(
                    "it has no {FORMAT_FILE} file{}: it is not a rill state directory (state.dir)",
                    if rocks.exists() {
                        format!(" (but a {ROCKSDB_DIR}/ directory)")
                    } else {
                        String::new()
                    }
                ),
            })
        }
    };
    check_format(dir, &format)?;
    let application = read_optional(&dir.join(APPLICATION_FILE))?.map(|s| s.trim().to_string());
    let cluster = read_optional(&dir.join(CLUSTER_FILE))?.map(|s| s.trim().to_string());
    let mut inspection = Inspection {
        dir: dir.to_path_buf(),
        format,
        application,
        cluster,
        column_families: Vec::new(),
        other_column_families: Vec::new(),
        disk_bytes: disk_bytes(&rocks)?,
    };
    if !rocks.join("CURRENT").exists() {
        if fs::read_dir(&rocks).is_ok_and(|mut d| d.next().is_some()) {
            return Err(StateError::Corrupt {
                dir: dir.to_path_buf(),
                detail: format!("{ROCKSDB_DIR}/ holds files but no CURRENT file"),
            });
        }
        // No database yet (an instance that never opened its stores): nothing to list.
        return Ok(inspection);
    }
    if locked_by_another_process(&rocks.join("LOCK"))? {
        return Err(StateError::Locked {
            dir: dir.to_path_buf(),
        });
    }

    let mut opts = Options::default();
    opts.create_if_missing(false);
    opts.create_missing_column_families(false);
    let names = DB::list_cf(&opts, &rocks).map_err(|e| open_error(dir, e))?;
    let db =
        DB::open_cf_for_read_only(&opts, &rocks, &names, false).map_err(|e| open_error(dir, e))?;
    for name in &names {
        let Some(id) = ColumnFamilyId::parse(name) else {
            if name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME {
                inspection.other_column_families.push(name.clone());
            }
            continue;
        };
        let Some(cf) = db.cf_handle(name) else {
            continue;
        };
        let backend = |op: &str, e: rocksdb::Error| {
            StateError::backend(format!("{op} of column family `{name}`"), e)
        };
        let progress = match db
            .get_cf(&cf, PROGRESS_KEY)
            .map_err(|e| backend("read the progress record", e))?
        {
            None => ProgressRecord::Missing,
            Some(bytes) => match Progress::from_bytes(&bytes) {
                Ok(p) if p.range() != id.range => ProgressRecord::Invalid(format!(
                    "the record is about range {}, not the column family's",
                    p.range()
                )),
                Ok(p) => ProgressRecord::Valid(Box::new(p)),
                Err(e) => ProgressRecord::Invalid(e),
            },
        };
        let int = |property: &str| -> Result<u64, StateError> {
            Ok(db
                .property_int_value_cf(&cf, property)
                .map_err(|e| backend(&format!("read property {property}"), e))?
                .unwrap_or(0))
        };
        let (entries, entries_exact) = if options.count_entries {
            let mut count = 0u64;
            let iter = db.iterator_cf(
                &cf,
                rocksdb::IteratorMode::From(&[DATA_PREFIX], rocksdb::Direction::Forward),
            );
            for item in iter {
                let (key, _) = item.map_err(|e| backend("read the entries", e))?;
                if key.first() != Some(&DATA_PREFIX) {
                    break;
                }
                count += 1;
            }
            (count, true)
        } else {
            let estimate = int("rocksdb.estimate-num-keys")?;
            let has_progress = !matches!(progress, ProgressRecord::Missing);
            (estimate.saturating_sub(u64::from(has_progress)), false)
        };
        inspection.column_families.push(ColumnFamilyReport {
            id,
            progress,
            entries,
            entries_exact,
            sst_bytes: int("rocksdb.total-sst-files-size")?,
            memtable_bytes: int("rocksdb.cur-size-all-mem-tables")?,
        });
    }
    inspection.column_families.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(inspection)
}

/// A file's text, `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, StateError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateError::io(path, e)),
    }
}

/// Bytes of the files in `dir` and below (0 when it does not exist).
fn disk_bytes(dir: &Path) -> Result<u64, StateError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(StateError::io(dir, e)),
    };
    let mut total = 0;
    for entry in entries {
        let entry = entry.map_err(|e| StateError::io(dir, e))?;
        let meta = entry
            .metadata()
            .map_err(|e| StateError::io(entry.path(), e))?;
        total += if meta.is_dir() {
            disk_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// A RocksDB error from the read-only open, as what the operator should know.
fn open_error(dir: &Path, e: rocksdb::Error) -> StateError {
    let message = e.to_string().trim_end().trim_end_matches('.').to_string();
    match e.kind() {
        rocksdb::ErrorKind::Corruption | rocksdb::ErrorKind::NotFound => StateError::Corrupt {
            dir: dir.to_path_buf(),
            detail: message,
        },
        _ => StateError::backend(
            format!("open {} read-only", dir.join(ROCKSDB_DIR).display()),
            message,
        ),
    }
}

/// Whether another process holds RocksDB's lock on `lock` (a POSIX record lock, which RocksDB
/// takes with `fcntl(F_SETLK)` while the database is open). Asks with `F_GETLK`, which changes
/// nothing; a missing LOCK file is not locked.
#[cfg(unix)]
fn locked_by_another_process(lock: &Path) -> Result<bool, StateError> {
    use std::os::fd::AsRawFd;
    let file = match fs::File::open(lock) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(StateError::io(lock, e)),
    };
    // SAFETY: an all-zero `flock` is a valid value of the plain C struct.
    let mut query: libc::flock = unsafe { std::mem::zeroed() };
    query.l_type = libc::F_WRLCK as libc::c_short;
    query.l_whence = libc::SEEK_SET as libc::c_short;
    query.l_start = 0;
    query.l_len = 0;
    // SAFETY: `file` is open for the duration of the call and `query` is a valid `flock`.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_GETLK,
            &mut query as *mut libc::flock,
        )
    };
    if rc == -1 {
        return Err(StateError::io(lock, std::io::Error::last_os_error()));
    }
    Ok(query.l_type != libc::F_UNLCK as libc::c_short)
}

/// Elsewhere the lock is not checked (RocksDB's read-only open does not take it either).
#[cfg(not(unix))]
fn locked_by_another_process(_lock: &Path) -> Result<bool, StateError> {
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StateConfig, StateDb, SubTaskState};
    use rill_topology::keyrange::KeyRange;

    /// Every file under `dir` with its length and modification time.
    fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                out.extend(snapshot(&entry.path()));
            } else {
                out.push((entry.path(), meta.len(), meta.modified().unwrap()));
            }
        }
        out.sort();
        out
    }

    fn config(dir: &Path) -> StateConfig {
        StateConfig {
            dir: dir.to_path_buf(),
            memory_bytes: 16 << 20,
            create_column_families: Vec::new(),
            max_open_files: None,
        }
    }

    #[test]
    fn reports_ranges_progress_and_entries_without_changing_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = StateDb::open(&config(dir.path())).unwrap();
            db.bind_application("app", &["counts"]).unwrap();
            for (i, range) in rill_topology::keyrange::ranges(2).into_iter().enumerate() {
                let mut state =
                    SubTaskState::open(db.clone(), &["counts".to_string()], 3, range).unwrap();
                let store = state.store("counts").unwrap();
                for k in 0..=i {
                    store.put(format!("k{k}").as_bytes(), b"1").unwrap();
                }
                let mut p = Progress::new(range, "words", 10 + i as u64);
                p.stream_time = Some(1_000);
                state.commit(p).unwrap();
            }
        }
        let before = snapshot(dir.path());
        let found = inspect(dir.path(), InspectOptions::default()).unwrap();
        let exact = inspect(
            dir.path(),
            InspectOptions {
                count_entries: true,
            },
        )
        .unwrap();
        assert_eq!(
            snapshot(dir.path()),
            before,
            "inspect changed the directory"
        );
        assert_eq!(found.application.as_deref(), Some("app"));
        assert_eq!(found.cluster, None);
        assert!(found.format.starts_with("rill-state 2\n"));
        assert!(found.other_column_families.is_empty());
        assert!(found.disk_bytes > 0);
        assert_eq!(found.column_families.len(), 2);
        for (i, cf) in exact.column_families.iter().enumerate() {
            assert_eq!(cf.id.store, "counts");
            assert_eq!(cf.id.partition, 3);
            assert_eq!(cf.id.range, KeyRange::nth(i, 2));
            let p = cf.progress.valid().expect("progress");
            assert_eq!(p.next_offset("words"), Some(10 + i as u64));
            assert_eq!(p.stream_time, Some(1_000));
            assert_eq!((cf.entries, cf.entries_exact), (i as u64 + 1, true));
            assert!(cf.memtable_bytes + cf.sst_bytes > 0);
        }
        assert!(!found.column_families[0].entries_exact);
    }

    #[test]
    fn refuses_what_is_not_a_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(
            inspect(&missing, InspectOptions::default()),
            Err(StateError::Io { .. })
        ));
        let err = inspect(dir.path(), InspectOptions::default()).unwrap_err();
        assert!(
            err.to_string().contains("not a rill state directory"),
            "{err}"
        );
        fs::write(dir.path().join(FORMAT_FILE), "rill-state 1\nhash-id 1\n").unwrap();
        assert!(matches!(
            inspect(dir.path(), InspectOptions::default()),
            Err(StateError::WrongFormat { .. })
        ));
    }

    #[test]
    fn a_damaged_database_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        drop(StateDb::open(&config(dir.path())).unwrap());
        // No database yet is fine: nothing to list.
        fs::remove_dir_all(dir.path().join(ROCKSDB_DIR)).unwrap();
        let empty = inspect(dir.path(), InspectOptions::default()).unwrap();
        assert!(empty.column_families.is_empty());
        drop(StateDb::open(&config(dir.path())).unwrap());
        fs::remove_file(dir.path().join(ROCKSDB_DIR).join("CURRENT")).unwrap();
        assert!(matches!(
            inspect(dir.path(), InspectOptions::default()),
            Err(StateError::Corrupt { .. })
        ));
    }
}
