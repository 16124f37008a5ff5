//! Tests of the state layer against a real RocksDB in temporary directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_topology::keyrange::KeyRange;

use crate::subtask::{DATA_PREFIX, PROGRESS_KEY};
use crate::{
    ColumnFamilyId, Origin, Progress, StateConfig, StateDb, StateError, StoreWrite, SubTaskState,
    MIN_MEMORY_BYTES, MIN_OPEN_FILES,
};

const MIB: usize = 1 << 20;

fn cfg(dir: &Path) -> StateConfig {
    StateConfig {
        dir: dir.to_path_buf(),
        memory_bytes: 16 * MIB,
        create_column_families: Vec::new(),
        max_open_files: None,
    }
}

fn names(stores: &[&str]) -> Vec<String> {
    stores.iter().map(|s| s.to_string()).collect()
}

/// The value of `key` in `store`'s column family as RocksDB has it (ignoring write caches).
fn on_disk(
    db: &StateDb,
    store: &str,
    partition: u32,
    range: KeyRange,
    key: &[u8],
) -> Option<Vec<u8>> {
    let name = ColumnFamilyId::new(store, partition, range).unwrap().name();
    let cf = db.db().cf_handle(&name).unwrap();
    let mut k = vec![DATA_PREFIX];
    k.extend_from_slice(key);
    // Stored values start with the 8-byte routing hash.
    db.db().get_cf(&cf, k).unwrap().map(|v| v[8..].to_vec())
}

/// A write of `value` (`None`: delete) to `key` tagged with routing hash 0.
fn w(key: &[u8], value: Option<&[u8]>) -> StoreWrite {
    StoreWrite {
        key: key.to_vec(),
        value: value.map(<[u8]>::to_vec),
        hash: 0,
    }
}

fn put(state: &mut SubTaskState, store: &str, key: &str, value: &str) {
    state
        .store(store)
        .unwrap()
        .put(key.as_bytes(), value.as_bytes())
        .unwrap();
}

fn get(state: &mut SubTaskState, store: &str, key: &str) -> Option<String> {
    state
        .store(store)
        .unwrap()
        .get(key.as_bytes())
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

fn all(state: &mut SubTaskState, store: &str) -> Vec<(String, String)> {
    state
        .store(store)
        .unwrap()
        .all()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every file under `dir` with its contents, to show that nothing was wiped or rewritten.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn write_cache_reads_its_own_writes_and_leaves_the_db_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::nth(1, 4);
    let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 7, range).unwrap();
    assert!(st.committed_progress().is_none());
    assert!(!st.is_dirty());

    put(&mut st, "s", "b", "1");
    put(&mut st, "s", "d", "1");
    st.commit(Progress::new(range, "t", 10)).unwrap();

    put(&mut st, "s", "a", "2");
    put(&mut st, "s", "b", "2");
    st.store("s").unwrap().delete(b"d").unwrap();
    put(&mut st, "s", "c", "2");
    st.store("s").unwrap().delete(b"never-written").unwrap();
    assert!(st.is_dirty());
    assert_eq!(st.pending_writes(), 5);

    assert_eq!(get(&mut st, "s", "a").as_deref(), Some("2"));
    assert_eq!(get(&mut st, "s", "b").as_deref(), Some("2"));
    assert_eq!(get(&mut st, "s", "d"), None);
    assert_eq!(get(&mut st, "s", "zz"), None);
    assert_eq!(all(&mut st, "s"), kv(&[("a", "2"), ("b", "2"), ("c", "2")]));
    assert!(st.store("other").is_none());

    // RocksDB still has the committed state only.
    assert_eq!(on_disk(&db, "s", 7, range, b"a"), None);
    assert_eq!(on_disk(&db, "s", 7, range, b"b"), Some(b"1".to_vec()));
    assert_eq!(on_disk(&db, "s", 7, range, b"d"), Some(b"1".to_vec()));
}

#[test]
fn commit_applies_the_cache_and_progress_together_and_returns_the_last_write_per_key() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::nth(0, 2);
    let mut st = SubTaskState::open(db.clone(), &names(&["a", "b"]), 0, range).unwrap();
    // Writes of a record whose routing hash is 0 (see `w`).
    st.set_routing_hash(0);
    put(&mut st, "a", "k", "1");
    put(&mut st, "a", "k", "2");
    put(&mut st, "a", "gone", "x");
    st.store("a").unwrap().delete(b"gone").unwrap();
    put(&mut st, "b", "j", "9");

    // A progress record for another range is refused, and nothing is applied or lost.
    let err = st
        .commit(Progress::new(KeyRange::nth(1, 2), "t", 5))
        .unwrap_err();
    assert!(matches!(err, StateError::InvalidProgress { .. }), "{err}");
    assert!(st.is_dirty());
    assert_eq!(on_disk(&db, "a", 0, range, b"k"), None);

    let mut progress = Progress::new(range, "t", 42);
    progress.changelog_offset = Some(1000);
    progress.origins.push(Origin {
        partition: 1,
        range_start: 0,
        range_end: u64::MAX,
        offset: 41,
        seq: 3,
        source_topic: 7,
        via_topic: 8,
        lo: 0,
        hi: u64::MAX,
    });
    let applied = st.commit(progress.clone()).unwrap();
    assert_eq!(
        applied,
        vec![
            ("a".to_string(), vec![w(b"gone", None), w(b"k", Some(b"2"))]),
            ("b".to_string(), vec![w(b"j", Some(b"9"))]),
        ]
    );
    assert!(!st.is_dirty());
    assert!(st.committed_progress() == Some(&progress));
    assert_eq!(on_disk(&db, "a", 0, range, b"k"), Some(b"2".to_vec()));
    assert_eq!(on_disk(&db, "b", 0, range, b"j"), Some(b"9".to_vec()));
    // The progress record sits in every store's column family, next to the data.
    for store in ["a", "b"] {
        let name = ColumnFamilyId::new(store, 0, range).unwrap().name();
        let cf = db.db().cf_handle(&name).unwrap();
        let bytes = db.db().get_cf(&cf, PROGRESS_KEY).unwrap().unwrap();
        assert!(Progress::from_bytes(&bytes).unwrap() == progress);
    }
    // A commit with nothing written still records progress.
    st.commit(Progress::new(range, "t", 50)).unwrap();
    drop(st);
    let st = SubTaskState::open(db, &names(&["a", "b"]), 0, range).unwrap();
    assert_eq!(
        st.committed_progress().and_then(|p| p.next_offset("t")),
        Some(50)
    );
}

#[test]
fn reopening_brings_back_data_column_families_and_progress() {
    let tmp = tempfile::tempdir().unwrap();
    let ranges = [KeyRange::nth(0, 2), KeyRange::nth(1, 2)];
    {
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        for partition in 0..2u32 {
            for (i, range) in ranges.iter().enumerate() {
                let mut st =
                    SubTaskState::open(db.clone(), &names(&["counts", "last"]), partition, *range)
                        .unwrap();
                put(&mut st, "counts", "w", &format!("{partition}/{i}"));
                put(&mut st, "last", "x", "y");
                let mut p = Progress::new(*range, "t", 100 + partition as u64 * 10 + i as u64);
                p.changelog_offset = Some(7);
                st.commit(p).unwrap();
                // Uncommitted writes are not persisted.
                put(&mut st, "counts", "uncommitted", "1");
            }
        }
    }
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let mut expected = Vec::new();
    for store in ["counts", "last"] {
        for partition in 0..2u32 {
            for range in ranges {
                expected.push(ColumnFamilyId::new(store, partition, range).unwrap());
            }
        }
    }
    expected.sort();
    assert_eq!(db.column_families(), expected);
    for partition in 0..2u32 {
        for (i, range) in ranges.iter().enumerate() {
            let mut st =
                SubTaskState::open(db.clone(), &names(&["counts", "last"]), partition, *range)
                    .unwrap();
            let p = st.committed_progress().unwrap();
            assert_eq!(
                p.next_offset("t"),
                Some(100 + partition as u64 * 10 + i as u64)
            );
            assert_eq!(p.changelog_offset, Some(7));
            assert_eq!(p.range(), *range);
            assert_eq!(
                all(&mut st, "counts"),
                kv(&[("w", &format!("{partition}/{i}"))])
            );
            assert_eq!(all(&mut st, "last"), kv(&[("x", "y")]));
        }
    }
}

#[test]
fn discard_drops_uncommitted_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::FULL;
    let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 0, range).unwrap();
    put(&mut st, "s", "kept", "1");
    st.commit(Progress::new(range, "t", 1)).unwrap();
    put(&mut st, "s", "dropped", "1");
    st.store("s").unwrap().delete(b"kept").unwrap();
    st.discard();
    assert!(!st.is_dirty());
    assert_eq!(all(&mut st, "s"), kv(&[("kept", "1")]));
    let applied = st.commit(Progress::new(range, "t", 2)).unwrap();
    assert_eq!(applied, vec![("s".to_string(), vec![])]);
    assert_eq!(on_disk(&db, "s", 0, range, b"dropped"), None);
    assert_eq!(on_disk(&db, "s", 0, range, b"kept"), Some(b"1".to_vec()));
}

#[test]
fn a_sealed_commit_stays_readable_and_is_written_only_by_write_sealed() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::FULL;
    let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 0, range).unwrap();
    st.set_routing_hash(0);
    put(&mut st, "s", "a", "1");
    put(&mut st, "s", "b", "1");
    let sealed = st.seal().unwrap();
    let expected = vec![(
        "s".to_string(),
        vec![w(b"a", Some(b"1")), w(b"b", Some(b"1"))],
    )];
    assert_eq!(
        sealed, expected,
        "seal hands out the entries for the changelog"
    );
    assert!(st.has_sealed());
    assert!(!st.is_dirty(), "sealed writes left the write cache");
    // Nothing on disk yet, but reads see the sealed writes under newer ones.
    assert_eq!(on_disk(&db, "s", 0, range, b"a"), None);
    put(&mut st, "s", "b", "2");
    st.store("s").unwrap().delete(b"a").unwrap();
    put(&mut st, "s", "c", "2");
    assert_eq!(get(&mut st, "s", "a"), None);
    assert_eq!(get(&mut st, "s", "b").as_deref(), Some("2"));
    assert_eq!(all(&mut st, "s"), kv(&[("b", "2"), ("c", "2")]));
    let err = st.seal().unwrap_err();
    assert!(err.to_string().contains("already sealed"), "{err}");
    // Writing applies exactly the sealed writes and progress.
    st.write_sealed(Progress::new(range, "t", 1)).unwrap();
    assert!(!st.has_sealed());
    assert_eq!(on_disk(&db, "s", 0, range, b"a"), Some(b"1".to_vec()));
    assert_eq!(on_disk(&db, "s", 0, range, b"c"), None);
    assert_eq!(st.committed_progress().unwrap().next_offset("t"), Some(1));
    // A crash before the next write loses the newer writes, never the written commit.
    st.seal().unwrap();
    drop(st);
    let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 0, range).unwrap();
    assert_eq!(st.committed_progress().unwrap().next_offset("t"), Some(1));
    assert_eq!(all(&mut st, "s"), kv(&[("a", "1"), ("b", "1")]));
}

#[test]
fn restored_entries_are_written_directly_and_progress_only_when_given() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::FULL;
    let mut st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, range).unwrap();
    let entries = vec![w(b"a", Some(b"1")), w(b"b", None)];
    st.apply_restored("s", &entries, None).unwrap();
    assert_eq!(on_disk(&db, "s", 0, range, b"a"), Some(b"1".to_vec()));
    assert_eq!(
        on_disk(&db, "u", 0, range, b"a"),
        None,
        "only the named store"
    );
    assert!(st.committed_progress().is_none());
    let mut p = Progress::new(range, "t", 9);
    p.attempt = 4;
    st.apply_restored("u", &[w(b"x", Some(b"2"))], Some(p.clone()))
        .unwrap();
    drop(st);
    let st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, range).unwrap();
    assert_eq!(
        st.committed_progress(),
        Some(&p),
        "progress in every store agrees"
    );
}

#[test]
fn a_second_handle_on_the_same_dir_is_locked_out() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let err = StateDb::open(&cfg(tmp.path())).unwrap_err();
    assert!(matches!(err, StateError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("set another state.dir"), "{err}");
    eprintln!("{err}");
    drop(db);
    StateDb::open(&cfg(tmp.path())).unwrap();
}

const LOCK_DIR_ENV: &str = "RILL_STATE_TEST_LOCK_HOLDER_DIR";

/// Helper process for [`another_process_holding_the_dir_gives_locked`]: holds the state
/// directory open until killed.
#[test]
#[ignore = "helper process, run by another_process_holding_the_dir_gives_locked"]
fn lock_holder_process() {
    let Ok(dir) = std::env::var(LOCK_DIR_ENV) else {
        return;
    };
    let _db = StateDb::open(&cfg(Path::new(&dir))).unwrap();
    std::fs::write(Path::new(&dir).join("holder-ready"), b"").unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn another_process_holding_the_dir_gives_locked() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "tests::lock_holder_process"])
        .env(LOCK_DIR_ENV, tmp.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tmp.path().join("holder-ready").exists() {
        assert!(
            Instant::now() < deadline,
            "the helper process did not open the dir"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = StateDb::open(&cfg(tmp.path()));
    child.kill().unwrap();
    child.wait().unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, StateError::Locked { .. }), "{err}");
    // The lock goes with the process.
    StateDb::open(&cfg(tmp.path())).unwrap();
}

#[test]
fn a_format_mismatch_is_refused_and_nothing_is_touched() {
    let cases = [
        ("rill-state 1\nhash-id 1\n", "format 1"),
        ("rill-state 3\nhash-id 1\n", "format 3"),
        ("rill-state 2\nhash-id 2\n", "key-hash id 2"),
        ("hello\n", "lacks"),
        ("rill-state one\nhash-id 1\n", "is not"),
    ];
    for (text, expect) in cases {
        let tmp = tempfile::tempdir().unwrap();
        drop(StateDb::open(&cfg(tmp.path())).unwrap());
        std::fs::write(tmp.path().join("FORMAT"), text).unwrap();
        let before = snapshot(tmp.path());
        let err = StateDb::open(&cfg(tmp.path())).unwrap_err();
        assert!(matches!(err, StateError::WrongFormat { .. }), "{err}");
        assert!(err.to_string().contains(expect), "{err}");
        assert_unchanged(&before, &snapshot(tmp.path()));
    }
    // A RocksDB directory without FORMAT is not taken over.
    let tmp = tempfile::tempdir().unwrap();
    drop(StateDb::open(&cfg(tmp.path())).unwrap());
    std::fs::remove_file(tmp.path().join("FORMAT")).unwrap();
    let err = StateDb::open(&cfg(tmp.path())).unwrap_err();
    assert!(matches!(err, StateError::WrongFormat { .. }), "{err}");
    assert!(!tmp.path().join("FORMAT").exists());
}

#[test]
fn the_format_file_is_written_on_first_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nested/state");
    let db = StateDb::open(&cfg(&dir)).unwrap();
    assert_eq!(db.dir(), dir);
    assert_eq!(
        std::fs::read_to_string(dir.join("FORMAT")).unwrap(),
        "rill-state 2\nhash-id 1\n"
    );
}

/// Writes some state, closes, damages `victim` (a file of rocksdb/ picked by the closure) and
/// expects a clear error with every file left in place.
fn corrupt_and_open(damage: impl Fn(&Path)) -> StateError {
    let tmp = tempfile::tempdir().unwrap();
    {
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 0, KeyRange::FULL).unwrap();
        put(&mut st, "s", "k", "v");
        st.commit(Progress::new(KeyRange::FULL, "t", 1)).unwrap();
    }
    damage(&tmp.path().join("rocksdb"));
    let before = snapshot(tmp.path());
    let err = StateDb::open(&cfg(tmp.path())).unwrap_err();
    assert_unchanged(&before, &snapshot(tmp.path()));
    eprintln!("{err}");
    err
}

/// Asserts that two snapshots hold the same files with the same contents, naming the others.
/// RocksDB's informational logs (`LOG`, `LOG.old.*`) are ignored: a failed open rotates them.
fn assert_unchanged(before: &BTreeMap<PathBuf, Vec<u8>>, after: &BTreeMap<PathBuf, Vec<u8>>) {
    let is_info_log = |p: &Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("LOG"))
    };
    let changed: Vec<_> = before
        .keys()
        .chain(after.keys())
        .filter(|p| !is_info_log(p) && before.get(*p) != after.get(*p))
        .collect();
    assert!(
        changed.is_empty(),
        "the state dir was modified: {changed:?}"
    );
}

#[test]
fn garbage_over_current_is_reported_as_corrupt_and_kept() {
    let err = corrupt_and_open(|rocks| {
        std::fs::write(rocks.join("CURRENT"), b"\x00\xffgarbage\x01").unwrap();
    });
    assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("rill never wipes state"), "{err}");
}

#[test]
fn garbage_over_the_manifest_is_reported_as_corrupt_and_kept() {
    let err = corrupt_and_open(|rocks| {
        let mut found = false;
        for entry in std::fs::read_dir(rocks).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with("MANIFEST-") {
                let len = std::fs::metadata(&path).unwrap().len() as usize;
                std::fs::write(&path, vec![0xa5u8; len.max(64)]).unwrap();
                found = true;
            }
        }
        assert!(found, "no MANIFEST file");
    });
    assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
}

#[test]
fn a_missing_current_file_is_corrupt_not_a_fresh_database() {
    let err = corrupt_and_open(|rocks| std::fs::remove_file(rocks.join("CURRENT")).unwrap());
    assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
}

#[test]
fn invalid_store_names_ranges_and_budgets_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    for bad in ["", "a.b", "a b", "x/y"] {
        let err = SubTaskState::open(db.clone(), &names(&[bad]), 0, KeyRange::FULL).unwrap_err();
        assert!(matches!(err, StateError::InvalidStoreName { .. }), "{err}");
        let err = db.drop_partition(bad, 0).unwrap_err();
        assert!(matches!(err, StateError::InvalidStoreName { .. }), "{err}");
    }
    let err = SubTaskState::open(db.clone(), &names(&["s"]), 0, KeyRange { start: 9, end: 1 })
        .unwrap_err();
    assert!(matches!(err, StateError::InvalidRange { .. }), "{err}");
    assert!(db.column_families().is_empty());

    let err = StateDb::open(&StateConfig {
        dir: tmp.path().join("other"),
        memory_bytes: MIN_MEMORY_BYTES - 1,
        create_column_families: Vec::new(),
        max_open_files: None,
    })
    .unwrap_err();
    assert!(
        matches!(err, StateError::MemoryBudgetTooSmall { .. }),
        "{err}"
    );
    let err = StateDb::open(&StateConfig {
        dir: tmp.path().join("other"),
        max_open_files: Some(MIN_OPEN_FILES - 1),
        ..cfg(tmp.path())
    })
    .unwrap_err();
    assert!(matches!(err, StateError::OpenFilesTooFew { .. }), "{err}");
}

/// SST files under `dir` this process has open now.
fn open_sst_files(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir) && target.extension().is_some_and(|e| e == "sst"))
        .count()
}

#[test]
fn a_bound_on_open_files_holds_while_every_file_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    let p = 2 * MIN_OPEN_FILES as usize;
    let key = |i: usize| format!("key-{i}");
    {
        let db = StateDb::open(&cfg(&dir)).unwrap();
        for i in 0..p {
            let range = KeyRange::nth(i, p);
            let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 0, range).unwrap();
            put(&mut st, "s", &key(i), "v");
            st.commit(Progress::new(range, "t", 1)).unwrap();
            // One SST file per column family.
            let name = ColumnFamilyId::new("s", 0, range).unwrap().name();
            db.db()
                .flush_cf(&db.db().cf_handle(&name).unwrap())
                .unwrap();
        }
    }
    let open_after_reading_all = |max_open_files| {
        let db = StateDb::open(&StateConfig {
            max_open_files,
            ..cfg(&dir)
        })
        .unwrap();
        for i in 0..p {
            let value = on_disk(&db, "s", 0, KeyRange::nth(i, p), key(i).as_bytes());
            assert_eq!(value.as_deref(), Some(&b"v"[..]), "range {i}");
        }
        open_sst_files(&dir)
    };
    // Without a bound every file stays open (so this count can see the bound's effect).
    let unbounded = open_after_reading_all(None);
    assert!(
        unbounded >= p,
        "{unbounded} SST files open, {p} column families"
    );
    let bounded = open_after_reading_all(Some(MIN_OPEN_FILES));
    assert!(
        bounded <= MIN_OPEN_FILES as usize,
        "{bounded} SST files open with rocksdb.max.open.files = {MIN_OPEN_FILES}"
    );
}

#[test]
fn table_cache_shards_hold_no_more_than_the_capacity() {
    for max_open_files in MIN_OPEN_FILES..20_000 {
        let capacity = max_open_files - 10;
        let shards = 1u32 << crate::db::table_cache_shard_bits(max_open_files);
        // Each shard's capacity is its share rounded up.
        let held = shards * capacity.div_ceil(shards);
        assert_eq!(
            held, capacity,
            "max_open_files {max_open_files}: {shards} shards"
        );
        assert!(shards <= 64);
    }
    assert_eq!(
        crate::db::table_cache_shard_bits(10_010),
        4,
        "10000 = 16 x 625"
    );
    assert_eq!(
        crate::db::table_cache_shard_bits(1_034),
        6,
        "1024 = 64 x 16"
    );
}

#[test]
fn a_column_family_has_one_owner_and_is_dropped_only_when_free() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let r0 = KeyRange::nth(0, 2);
    let r1 = KeyRange::nth(1, 2);
    let mut a = SubTaskState::open(db.clone(), &names(&["s"]), 3, r0).unwrap();
    let err = SubTaskState::open(db.clone(), &names(&["s"]), 3, r0).unwrap_err();
    assert!(matches!(err, StateError::InUse { .. }), "{err}");
    let err = SubTaskState::open(db.clone(), &names(&["t", "t"]), 3, r0).unwrap_err();
    assert!(matches!(err, StateError::InUse { .. }), "{err}");
    // Another store of the same (partition, range), e.g. of another sub-topology, is fine.
    let other = SubTaskState::open(db.clone(), &names(&["t"]), 3, r0).unwrap();
    drop(other);

    put(&mut a, "s", "k", "v");
    a.commit(Progress::new(r0, "t", 1)).unwrap();
    let mut b = SubTaskState::open(db.clone(), &names(&["s"]), 3, r1).unwrap();
    put(&mut b, "s", "k", "v");
    b.commit(Progress::new(r1, "t", 1)).unwrap();
    drop(b);
    let keep = SubTaskState::open(db.clone(), &names(&["s"]), 4, r0).unwrap();
    drop(keep);

    let err = db.drop_partition("s", 3).unwrap_err();
    assert!(matches!(err, StateError::InUse { .. }), "{err}");
    drop(a);
    db.drop_partition("s", 3).unwrap();
    db.drop_partition("s", 99).unwrap(); // nothing to drop
    assert_eq!(
        db.column_families()
            .into_iter()
            .map(|id| id.name())
            .collect::<Vec<_>>(),
        vec![
            ColumnFamilyId::new("s", 4, r0).unwrap().name(),
            ColumnFamilyId::new("t", 3, r0).unwrap().name(),
        ]
    );
    // Reopened after the drop: empty, no progress.
    let mut a = SubTaskState::open(db.clone(), &names(&["s"]), 3, r0).unwrap();
    assert!(a.committed_progress().is_none());
    assert!(all(&mut a, "s").is_empty());
    drop(a);
    drop(db);
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    assert_eq!(db.column_families().len(), 3);
}

#[test]
fn stores_that_disagree_on_progress_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let r = KeyRange::FULL;
    let mut st = SubTaskState::open(db.clone(), &names(&["a", "b"]), 0, r).unwrap();
    st.commit(Progress::new(r, "t", 5)).unwrap();
    drop(st);
    // Store `b` leaves the topology; `a` moves on.
    let mut st = SubTaskState::open(db.clone(), &names(&["a"]), 0, r).unwrap();
    st.commit(Progress::new(r, "t", 9)).unwrap();
    drop(st);
    // A new store next to committed ones starts empty without complaint.
    let st = SubTaskState::open(db.clone(), &names(&["a", "c"]), 0, r).unwrap();
    assert_eq!(
        st.committed_progress().and_then(|p| p.next_offset("t")),
        Some(9)
    );
    drop(st);
    // `b` comes back with its stale record.
    let err = SubTaskState::open(db.clone(), &names(&["a", "b"]), 0, r).unwrap_err();
    assert!(matches!(err, StateError::ProgressMismatch { .. }), "{err}");
    // The failed open did not keep the column families owned.
    db.drop_partition("b", 0).unwrap();
    let st = SubTaskState::open(db, &names(&["a", "b"]), 0, r).unwrap();
    assert_eq!(
        st.committed_progress().and_then(|p| p.next_offset("t")),
        Some(9)
    );
}

#[test]
fn memory_stays_within_the_budget_with_many_column_families() {
    let tmp = tempfile::tempdir().unwrap();
    let budget = 16 * MIB;
    let db = StateDb::open(&StateConfig {
        dir: tmp.path().to_path_buf(),
        memory_bytes: budget,
        create_column_families: Vec::new(),
        max_open_files: None,
    })
    .unwrap();
    let p = 64;
    let mut states: Vec<SubTaskState> = (0..p)
        .map(|i| SubTaskState::open(db.clone(), &names(&["s"]), 0, KeyRange::nth(i, p)).unwrap())
        .collect();
    assert_eq!(db.column_families().len(), p);
    let value = vec![0x5au8; 200];
    let mut peak = crate::MemoryUsage::default();
    // 64 ranges x 3 rounds x 1000 keys x ~220 bytes = ~42 MB written, well above the budget.
    for round in 0..3u64 {
        for (i, st) in states.iter_mut().enumerate() {
            for n in 0..1000 {
                let key = format!("key-{i:03}-{round}-{n:05}");
                st.store("s").unwrap().put(key.as_bytes(), &value).unwrap();
            }
            st.commit(Progress::new(KeyRange::nth(i, p), "t", round + 1))
                .unwrap();
            let usage = db.memory_usage();
            peak.block_cache_bytes = peak.block_cache_bytes.max(usage.block_cache_bytes);
            peak.memtable_bytes = peak.memtable_bytes.max(usage.memtable_bytes);
        }
    }
    // The write-buffer manager switches memtables as soon as the total passes its limit, but
    // it does not stall writers (allow_stall = false), so on a busy machine immutable memtables
    // can pile up until the background flushes catch up. It acts on writes, so keep a trickle
    // of small commits going (as a running service would) while waiting for them to settle.
    let memtable_limit = budget / 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut settled = db.memory_usage();
    let mut tick = 0u64;
    while settled.memtable_bytes > memtable_limit + MIB && Instant::now() < deadline {
        let i = (tick % p as u64) as usize;
        states[i].store("s").unwrap().put(b"tick", b"1").unwrap();
        states[i]
            .commit(Progress::new(KeyRange::nth(i, p), "t", 4 + tick))
            .unwrap();
        tick += 1;
        std::thread::sleep(Duration::from_millis(20));
        settled = db.memory_usage();
    }
    // Read everything back to fill the block cache too.
    for st in &mut states {
        let n = st.store("s").unwrap().all().unwrap().len();
        assert!(n == 3000 || n == 3001, "{n} entries");
    }
    let end = db.memory_usage();
    eprintln!("memory budget {budget}: peak {peak:?}, settled {settled:?}, after reads {end:?}");
    // Once flushes have caught up, memtables are within the manager's limit (half the budget)
    // although 64 column families x 2 memtables x write_buffer_size (1 MiB) could hold 128 MiB.
    assert!(
        settled.memtable_bytes <= memtable_limit + MIB,
        "memtables {settled:?}"
    );
    // Even at the peak, far below what 64 unmanaged column families could hold.
    assert!(peak.memtable_bytes <= 4 * budget, "memtables {peak:?}");
    // Blocks and memtables share the cache, whose capacity is the whole budget (LRU capacity
    // is not strict: pinned index/filter blocks may exceed it slightly).
    assert!(
        end.block_cache_bytes <= budget + budget / 4,
        "cache {end:?}"
    );
    assert!(end.block_cache_bytes > 0);
}

#[test]
fn concurrent_commits_from_eight_threads_survive_a_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let p = 8;
    let rounds = 10u64;
    let keys = 300;
    {
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        std::thread::scope(|s| {
            for i in 0..p {
                let db = db.clone();
                s.spawn(move || {
                    let range = KeyRange::nth(i, p);
                    let mut st = SubTaskState::open(db, &names(&["a", "b"]), 1, range).unwrap();
                    for round in 0..rounds {
                        for n in 0..keys {
                            let k = format!("{i}-{n:04}");
                            put(&mut st, "a", &k, &format!("{round}"));
                            if n % 3 == 0 {
                                put(&mut st, "b", &k, &format!("{i}"));
                            }
                        }
                        st.commit(Progress::new(range, "t", round + 1)).unwrap();
                    }
                });
            }
        });
    }
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    assert_eq!(db.column_families().len(), 2 * p);
    let db: Arc<StateDb> = db;
    for i in 0..p {
        let range = KeyRange::nth(i, p);
        let mut st = SubTaskState::open(db.clone(), &names(&["a", "b"]), 1, range).unwrap();
        assert_eq!(
            st.committed_progress().and_then(|p| p.next_offset("t")),
            Some(rounds)
        );
        let a = all(&mut st, "a");
        assert_eq!(a.len(), keys);
        for (n, (k, v)) in a.iter().enumerate() {
            assert_eq!(k, &format!("{i}-{n:04}"));
            assert_eq!(v, &format!("{}", rounds - 1));
        }
        let b = all(&mut st, "b");
        assert_eq!(b.len(), keys.div_ceil(3));
        assert!(b.iter().all(|(_, v)| v == &format!("{i}")));
    }
}

#[test]
fn the_types_cross_threads_as_the_engine_needs() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<StateDb>();
    send_sync::<Arc<StateDb>>();
    send::<SubTaskState>();
    send::<StateError>();
}

#[test]
fn clear_deletes_data_and_progress_of_every_store_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let (mine, other) = (KeyRange::nth(0, 2), KeyRange::nth(1, 2));
    let mut st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, mine).unwrap();
    let mut neighbour = SubTaskState::open(db.clone(), &names(&["s"]), 0, other).unwrap();
    put(&mut st, "s", "a", "1");
    put(&mut st, "u", "b", "2");
    st.commit(Progress::new(mine, "t", 3)).unwrap();
    put(&mut neighbour, "s", "a", "9");
    neighbour.commit(Progress::new(other, "t", 4)).unwrap();
    put(&mut st, "s", "pending", "x");
    st.clear().unwrap();
    assert!(st.committed_progress().is_none());
    assert_eq!(
        get(&mut st, "s", "pending"),
        None,
        "uncommitted writes dropped"
    );
    assert_eq!(on_disk(&db, "s", 0, mine, b"a"), None);
    assert_eq!(on_disk(&db, "u", 0, mine, b"b"), None);
    drop(st);
    let st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, mine).unwrap();
    assert!(
        st.committed_progress().is_none(),
        "no progress after reopen"
    );
    assert_eq!(on_disk(&db, "s", 0, other, b"a"), Some(b"9".to_vec()));
    assert!(neighbour.committed_progress().is_some());
}

#[test]
fn state_is_bound_to_the_first_kafka_cluster_it_sees() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    db.bind_cluster("cluster-a").unwrap();
    db.bind_cluster("cluster-a").unwrap();
    let err = db.bind_cluster("cluster-b").unwrap_err();
    assert!(matches!(err, StateError::OtherCluster { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("cluster-a") && text.contains("cluster-b"),
        "{text}"
    );
}

#[test]
fn state_is_bound_to_its_application_and_refuses_another_topologys_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    db.bind_application("app-a", &["counts"]).unwrap();
    let range = KeyRange::nth(0, 1);
    drop(SubTaskState::open(db.clone(), &names(&["counts"]), 0, range).unwrap());
    db.bind_application("app-a", &["counts", "new-store"])
        .expect("a store the directory lacks is new: accepted");
    let err = db.bind_application("app-b", &["counts"]).unwrap_err();
    assert!(matches!(err, StateError::OtherApplication { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("app-a")
            && text.contains("app-b")
            && text.contains(&tmp.path().display().to_string()),
        "{text}"
    );
    let err = db.bind_application("app-a", &["totals"]).unwrap_err();
    assert!(
        matches!(&err, StateError::OtherTopology { unknown, .. } if unknown == &["counts".to_string()]),
        "{err}"
    );
    assert!(
        err.to_string().contains(&tmp.path().display().to_string()),
        "{err}"
    );
}

#[test]
fn a_corrupt_database_is_refused_by_open_and_moved_aside_by_open_or_rebuild() {
    let tmp = tempfile::tempdir().unwrap();
    let range = KeyRange::nth(0, 1);
    {
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        let mut st = SubTaskState::open(db.clone(), &names(&["s"]), 0, range).unwrap();
        put(&mut st, "s", "k", "v");
        st.commit(Progress::new(range, "t", 1)).unwrap();
    }
    let rocks = tmp.path().join(crate::db::ROCKSDB_DIR);
    let manifest = std::fs::read_dir(&rocks)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("MANIFEST-")
        })
        .expect("a MANIFEST file");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&manifest)
        .unwrap()
        .set_len(0)
        .unwrap();
    let err = StateDb::open(&cfg(tmp.path())).unwrap_err();
    assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
    assert!(rocks.join("CURRENT").exists(), "open never wipes state");

    let db = StateDb::open_or_rebuild(&cfg(tmp.path())).unwrap();
    assert!(db.column_families().is_empty(), "an empty database");
    let aside: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rocksdb.corrupt-"))
        .collect();
    assert_eq!(
        aside.len(),
        1,
        "the corrupt database is kept aside: {aside:?}"
    );
}

mod range_scans {
    use std::ops::Bound;

    use proptest::prelude::*;

    use super::*;

    /// A write to one of the three layers a read merges: committed (RocksDB), sealed, cache.
    #[derive(Clone, Debug)]
    enum Write {
        Put(Vec<u8>, u8),
        Delete(Vec<u8>),
        /// Moves the cache to the sealed layer, writing the sealed one first.
        Seal,
        /// Writes everything sealed and cached to RocksDB.
        Commit,
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(1), Just(0x7f), Just(0xff)],
            0..3,
        )
    }

    fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            Just(Bound::Unbounded),
            key().prop_map(Bound::Included),
            key().prop_map(Bound::Excluded),
        ]
    }

    fn write() -> impl Strategy<Value = Write> {
        prop_oneof![
            4 => (key(), any::<u8>()).prop_map(|(k, v)| Write::Put(k, v)),
            2 => key().prop_map(Write::Delete),
            1 => Just(Write::Seal),
            1 => Just(Write::Commit),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Ranges and prefix scans over committed, sealed and cached writes equal a BTreeMap's.
        #[test]
        fn range_and_prefix_scans_see_every_layer_like_a_map(
            writes in proptest::collection::vec(write(), 0..40),
            from in bound(),
            to in bound(),
            prefix in key(),
            in_memory in any::<bool>(),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let db = StateDb::open(&cfg(tmp.path())).unwrap();
            if in_memory {
                db.keep_in_memory(&names(&["s"])).unwrap();
            }
            let range = KeyRange::FULL;
            let mut st = SubTaskState::open(db, &names(&["s"]), 0, range).unwrap();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut next = 1;
            for w in writes {
                let store = st.store("s").unwrap();
                match w {
                    Write::Put(k, v) => {
                        store.put(&k, &[v]).unwrap();
                        model.insert(k, vec![v]);
                    }
                    Write::Delete(k) => {
                        store.delete(&k).unwrap();
                        model.remove(&k);
                    }
                    Write::Seal => {
                        if st.has_sealed() {
                            st.write_sealed(Progress::new(range, "t", next)).unwrap();
                            next += 1;
                        }
                        st.seal().unwrap();
                    }
                    Write::Commit => {
                        if st.has_sealed() {
                            st.write_sealed(Progress::new(range, "t", next)).unwrap();
                            next += 1;
                        }
                        st.commit(Progress::new(range, "t", next)).unwrap();
                        next += 1;
                    }
                }
            }
            let store = st.store("s").unwrap();
            let (f, t) = (from.as_ref().map(Vec::as_slice), to.as_ref().map(Vec::as_slice));
            let expected: Vec<(Vec<u8>, Vec<u8>)> = if matches!((&from, &to), (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) if a > b)
                || matches!((&from, &to), (Bound::Excluded(a), Bound::Excluded(b)) if a == b)
            {
                Vec::new()
            } else {
                model.range::<Vec<u8>, _>((from.clone(), to.clone())).map(|(k, v)| (k.clone(), v.clone())).collect()
            };
            prop_assert_eq!(store.range(f, t).unwrap(), expected);
            let prefixed: Vec<(Vec<u8>, Vec<u8>)> = model
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            prop_assert_eq!(store.prefix_scan(&prefix).unwrap(), prefixed);
            prop_assert_eq!(store.all().unwrap(), model.into_iter().collect::<Vec<_>>());
        }

        /// Point reads (which fill the read cache of committed values) equal a model of the three
        /// layers through commits, restores written straight to RocksDB, discards and clears,
        /// with a read cache that holds everything or evicts constantly.
        #[test]
        fn point_reads_see_every_layer_through_commits_restores_and_discards(
            ops in proptest::collection::vec((write(), 0u8..6, key(), any::<u8>()), 0..60),
            small in any::<bool>(),
            in_memory in any::<bool>(),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let memory_bytes = if small { crate::MIN_MEMORY_BYTES } else { 16 * MIB };
            let db = StateDb::open(&StateConfig { dir: tmp.path().to_path_buf(), memory_bytes, create_column_families: Vec::new(), max_open_files: None }).unwrap();
            if in_memory {
                db.keep_in_memory(&names(&["s"])).unwrap();
            }
            if small {
                // Fill the budget from another sub-task, so this one's cache evicts or skips.
                let other = KeyRange { start: 0, end: 1 };
                let mut o = SubTaskState::open(db.clone(), &names(&["s"]), 1, other).unwrap();
                let budget = db.read_budget();
                let mut i = 0u64;
                while budget.used() + 200 < crate::MIN_MEMORY_BYTES / 8 {
                    o.store("s").unwrap().get(&i.to_be_bytes()).unwrap();
                    i += 1;
                }
                std::mem::forget(o);
            }
            let range = KeyRange::FULL;
            let mut st = SubTaskState::open(db, &names(&["s"]), 0, range).unwrap();
            type Layer = BTreeMap<Vec<u8>, Option<Vec<u8>>>;
            let (mut committed, mut sealed, mut cache): (Layer, Layer, Layer) = Default::default();
            let mut next = 1;
            for (w, extra, k, v) in ops {
                match (w, extra) {
                    (_, 0) => {
                        let want = cache.get(&k).or_else(|| sealed.get(&k)).cloned()
                            .unwrap_or_else(|| committed.get(&k).cloned().flatten());
                        prop_assert_eq!(st.store("s").unwrap().get(&k).unwrap(), want, "get {:?}", k);
                    }
                    (_, 1) if st.pending_writes() == 0 => {
                        let w = StoreWrite { key: k.clone(), value: Some(vec![v]), hash: 0 };
                        st.apply_restored("s", &[w], None).unwrap();
                        committed.insert(k, Some(vec![v]));
                    }
                    (_, 2) => {
                        st.discard();
                        sealed.clear();
                        cache.clear();
                    }
                    (_, 3) if v < 16 => {
                        st.clear().unwrap();
                        committed.clear();
                        sealed.clear();
                        cache.clear();
                    }
                    (Write::Put(k, v), _) => {
                        st.store("s").unwrap().put(&k, &[v]).unwrap();
                        cache.insert(k, Some(vec![v]));
                    }
                    (Write::Delete(k), _) => {
                        st.store("s").unwrap().delete(&k).unwrap();
                        cache.insert(k, None);
                    }
                    (Write::Seal | Write::Commit, _) => {
                        if st.has_sealed() {
                            st.write_sealed(Progress::new(range, "t", next)).unwrap();
                            next += 1;
                            committed.append(&mut sealed);
                        }
                        st.seal().unwrap();
                        sealed = std::mem::take(&mut cache);
                    }
                }
            }
        }
    }
}

#[test]
fn writes_carry_the_routing_hash_of_the_record_that_made_them() {
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::nth(1, 4);
    let mut st = SubTaskState::open(db, &names(&["s"]), 0, range).unwrap();
    st.set_routing_hash(range.start + 7);
    put(&mut st, "s", "a", "1");
    st.set_routing_hash(range.start + 9);
    st.store("s").unwrap().delete(b"b").unwrap();
    let sealed = st.seal().unwrap();
    let hashes: Vec<(Vec<u8>, u64)> = sealed[0]
        .1
        .iter()
        .map(|w| (w.key.clone(), w.hash))
        .collect();
    assert_eq!(
        hashes,
        vec![
            (b"a".to_vec(), range.start + 7),
            (b"b".to_vec(), range.start + 9)
        ]
    );
    st.write_sealed(Progress::new(range, "t", 1)).unwrap();
    let committed = st.committed_entries("s").unwrap();
    assert_eq!(committed.len(), 1);
    assert_eq!(committed[0].hash, range.start + 7);
    assert_eq!(
        get(&mut st, "s", "a").as_deref(),
        Some("1"),
        "reads strip the hash"
    );
    // A repair rewrites the committed entry with its own hash.
    st.set_routing_hash(range.start + 100);
    st.touch("s", b"a").unwrap();
    st.touch("s", b"never").unwrap();
    let sealed = st.seal().unwrap();
    assert_eq!(sealed[0].1[0].hash, range.start + 7);
    assert_eq!(sealed[0].1[1].value, None);
}

/// Issue 41, item 3: a write not caused by a record of its key lands in the key's range.
#[test]
fn deletes_and_writes_outside_of_a_record_keep_the_hash_of_the_key_they_write() {
    use rill_topology::keyrange::key_hash;
    let tmp = tempfile::tempdir().unwrap();
    let db = StateDb::open(&cfg(tmp.path())).unwrap();
    let range = KeyRange::FULL;
    let mut st = SubTaskState::open(db, &names(&["s"]), 0, range).unwrap();
    let hash_of = |sealed: &[(String, crate::StoreEntries)], key: &str| {
        sealed[0]
            .1
            .iter()
            .find(|w| w.key == key.as_bytes())
            .map(|w| w.hash)
    };
    // Committed entries, pending entries, and a record of another key deleting both.
    st.set_routing_hash(7);
    put(&mut st, "s", "committed", "1");
    st.commit(Progress::new(range, "t", 1)).unwrap();
    st.set_routing_hash(8);
    put(&mut st, "s", "pending", "1");
    st.set_routing_hash(9);
    st.store("s").unwrap().delete(b"committed").unwrap();
    st.store("s").unwrap().delete(b"pending").unwrap();
    let sealed = st.seal().unwrap();
    assert_eq!(
        hash_of(&sealed, "committed"),
        Some(7),
        "the tombstone goes where the entry is"
    );
    assert_eq!(hash_of(&sealed, "pending"), Some(8));
    st.write_sealed(Progress::new(range, "t", 2)).unwrap();
    // Outside of a record (punctuation): a rewrite keeps the entry's hash, a new key takes its
    // own hash when the range holds it.
    st.set_routing_hash(10);
    put(&mut st, "s", "kept", "1");
    st.commit(Progress::new(range, "t", 3)).unwrap();
    st.clear_routing_hash();
    assert_eq!(st.routing_hash(), None);
    put(&mut st, "s", "kept", "2");
    put(&mut st, "s", "new", "1");
    let sealed = st.seal().unwrap();
    assert_eq!(hash_of(&sealed, "kept"), Some(10));
    assert_eq!(hash_of(&sealed, "new"), Some(key_hash(b"new")));
    st.write_sealed(Progress::new(range, "t", 4)).unwrap();
    assert_eq!(
        st.store("s").unwrap().routing_hash_of(b"kept").unwrap(),
        Some(10)
    );
    // A key whose hash lies outside the range has no key to follow: the range's start.
    let upper = KeyRange::nth(1, 2);
    let key = (0..)
        .map(|i| format!("key{i}"))
        .find(|k| !upper.contains(key_hash(k.as_bytes())))
        .unwrap();
    drop(st);
    let db = StateDb::open(&cfg(tmp.path().join("upper").as_path())).unwrap();
    let mut st = SubTaskState::open(db, &names(&["s"]), 0, upper).unwrap();
    put(&mut st, "s", &key, "1");
    let sealed = st.seal().unwrap();
    assert_eq!(hash_of(&sealed, &key), Some(upper.start));
}

mod resplits {
    use super::*;
    use crate::carry::next_for;
    use crate::resplit::resplit;
    use rill_topology::keyrange::{range_of, ranges};

    /// Writes `n` entries into the ranges of factor `p` (key i, routing hash spread over the
    /// space, value i) and commits each range at offset 100 + its index, with a carried part.
    fn written(db: &Arc<StateDb>, p: usize, n: u64) {
        for (i, r) in ranges(p).into_iter().enumerate() {
            let mut st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, r).unwrap();
            for k in 0..n {
                let hash = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                if range_of(hash, p) != i {
                    continue;
                }
                st.set_routing_hash(hash);
                put(&mut st, "s", &format!("k{k}"), &k.to_string());
                put(&mut st, "u", &format!("k{k}"), "u");
            }
            let mut progress = Progress::new(r, "t", 100 + i as u64);
            progress.stream_time = Some(i as i64);
            st.commit(progress).unwrap();
        }
    }

    #[test]
    fn a_resplit_moves_every_entry_to_the_range_of_its_hash_and_keeps_offsets_per_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        written(&db, 2, 500);
        let target = ranges(3);
        let done = resplit(&db, &names(&["s", "u"]), 0, &target)
            .unwrap()
            .unwrap();
        assert_eq!(done.from, ranges(2));
        assert_eq!(done.entries, 1000);
        let mut seen = 0;
        for (i, r) in target.iter().enumerate() {
            let mut st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, *r).unwrap();
            let p = st.committed_progress().cloned().unwrap();
            for w in st.committed_entries("s").unwrap() {
                assert_eq!(range_of(w.hash, 3), i, "entry in the range of its hash");
                assert_eq!(next_for(&p, "t", w.hash), 100 + range_of(w.hash, 2) as u64);
                seen += 1;
            }
            assert_eq!(
                all(&mut st, "u").len(),
                st.committed_entries("s").unwrap().len()
            );
        }
        assert_eq!(seen, 500);
        assert!(
            db.column_families()
                .iter()
                .all(|cf| target.contains(&cf.range)),
            "the old column families are gone"
        );
        assert_eq!(resplit(&db, &names(&["s", "u"]), 0, &target).unwrap(), None);
    }

    #[test]
    fn an_in_memory_store_moves_on_the_heap_and_its_loss_outlives_a_resplit() {
        let tmp = tempfile::tempdir().unwrap();
        let stores = names(&["s", "u"]);
        {
            let db = StateDb::open(&cfg(tmp.path())).unwrap();
            db.keep_in_memory(&names(&["u"])).unwrap();
            written(&db, 2, 500);
            resplit(&db, &stores, 0, &ranges(3)).unwrap().unwrap();
            let mut moved = 0;
            for r in ranges(3) {
                let mut st = SubTaskState::open(db.clone(), &stores, 0, r).unwrap();
                assert!(st.lost_in_memory().is_empty());
                let u = all(&mut st, "u");
                assert_eq!(u.len(), st.committed_entries("s").unwrap().len());
                moved += u.len();
            }
            assert_eq!(moved, 500);
        }
        // The next process: `u` is gone, `s` is on disk with its progress.
        let inspected = crate::inspect::inspect(tmp.path(), Default::default()).unwrap();
        assert!(inspected
            .column_families
            .iter()
            .all(|cf| cf.id.store == "s"));
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        db.keep_in_memory(&names(&["u"])).unwrap();
        for r in ranges(3) {
            let mut st = SubTaskState::open(db.clone(), &stores, 0, r).unwrap();
            assert_eq!(st.lost_in_memory(), names(&["u"]).as_slice());
            assert!(all(&mut st, "u").is_empty());
            assert!(!st.committed_entries("s").unwrap().is_empty());
        }
        // A re-split does not give the empty heap tables the progress of the moved ranges.
        resplit(&db, &stores, 0, &ranges(4)).unwrap().unwrap();
        for r in ranges(4) {
            let st = SubTaskState::open(db.clone(), &stores, 0, r).unwrap();
            assert_eq!(st.lost_in_memory(), names(&["u"]).as_slice(), "{r}");
        }
    }

    #[test]
    fn a_store_that_was_persistent_leaves_the_disk_when_it_is_kept_in_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        written(&db, 2, 50);
        db.keep_in_memory(&names(&["u"])).unwrap();
        let disk: Vec<String> = db
            .column_families()
            .into_iter()
            .map(|cf| cf.store)
            .collect();
        assert!(disk.iter().all(|s| s == "s") && disk.len() == 2, "{disk:?}");
        let st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, ranges(2)[0]).unwrap();
        assert_eq!(st.lost_in_memory(), names(&["u"]).as_slice());
    }

    #[test]
    fn a_new_range_that_no_committed_range_overlaps_gets_no_progress() {
        let tmp = tempfile::tempdir().unwrap();
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        // Factor 4: ranges 0 and 1 committed (by lineage 7); 2 and 3 opened, never committed
        // (no key of the partition fell there).
        for (i, r) in ranges(4).into_iter().enumerate() {
            let mut st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, r).unwrap();
            if i < 2 {
                let mut progress = Progress::new(r, "t", 10);
                progress.owner = 7;
                st.commit(progress).unwrap();
            }
        }
        resplit(&db, &names(&["s", "u"]), 0, &ranges(8))
            .unwrap()
            .unwrap();
        for (i, r) in ranges(8).into_iter().enumerate() {
            let st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, r).unwrap();
            match st.committed_progress() {
                Some(p) => {
                    assert!(i < 4, "range {i} of 8 lies in an uncommitted range of 4");
                    assert_eq!(p.owner, 7, "the owner of the part it came from");
                }
                None => assert!(i >= 4, "range {i} of 8 lost its part's progress"),
            }
        }
    }

    #[test]
    fn a_resplit_that_died_before_its_switch_starts_over_from_the_old_ranges() {
        let tmp = tempfile::tempdir().unwrap();
        let db = StateDb::open(&cfg(tmp.path())).unwrap();
        written(&db, 4, 300);
        // A crashed attempt: a partial copy in a new range, no progress there, old progress kept.
        let target = ranges(2);
        {
            let mut partial =
                SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, target[0]).unwrap();
            partial
                .apply_restored(
                    "s",
                    &[StoreWrite {
                        key: b"garbage".to_vec(),
                        value: Some(b"x".to_vec()),
                        hash: 1,
                    }],
                    None,
                )
                .unwrap();
        }
        resplit(&db, &names(&["s", "u"]), 0, &target)
            .unwrap()
            .unwrap();
        let mut total = 0;
        for r in &target {
            let mut st = SubTaskState::open(db.clone(), &names(&["s", "u"]), 0, *r).unwrap();
            assert_eq!(
                get(&mut st, "s", "garbage"),
                None,
                "the partial copy was cleared"
            );
            total += all(&mut st, "s").len();
        }
        assert_eq!(total, 300);
    }
}

#[test]
fn a_new_database_creates_the_expected_column_families_at_open_and_an_old_one_keeps_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = |partitions: u32, p: usize| -> Vec<String> {
        (0..partitions)
            .flat_map(|part| {
                rill_topology::ranges(p)
                    .into_iter()
                    .map(move |r| ColumnFamilyId::new("counts", part, r).unwrap().name())
            })
            .collect()
    };
    let expected = ids(16, 8);
    let mut config = cfg(tmp.path());
    config.create_column_families = expected.clone();
    let db = StateDb::open(&config).unwrap();
    let mut have: Vec<String> = db
        .column_families()
        .iter()
        .map(ColumnFamilyId::name)
        .collect();
    have.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(have, want);
    // Claiming them creates nothing more, and the state works on them.
    let mut state = SubTaskState::open(
        db.clone(),
        &names(&["counts"]),
        3,
        rill_topology::ranges(8)[2],
    )
    .unwrap();
    put(&mut state, "counts", "k", "v");
    assert_eq!(get(&mut state, "counts", "k").as_deref(), Some("v"));
    drop(state);
    drop(db);
    // A database with column families of its own does not get another factor's.
    config.create_column_families = ids(16, 4);
    let db = StateDb::open(&config).unwrap();
    assert_eq!(db.column_families().len(), expected.len());
}
