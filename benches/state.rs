//! State throughput: get + put of counters through `SubTaskState` (write cache, commits of ~1000
//! keys with the progress record in the same WriteBatch, WAL on).
//!
//! - `64cf_2threads`: 64 key ranges = 64 column families, 32 sub-tasks per thread on 2 threads;
//! - `2cf_2threads`: the same load on 2 ranges (one per thread), to separate the cost of the
//!   column family count from the thread count;
//! - `1cf_1thread`: the same load on one column family (one range: a column family has a single
//!   writer, so one thread).
//!
//! Each iteration touches the same 64 000 keys once (read the count, write it back + 1).
//! Run: `cargo bench --bench state -- --quick` (or `--profile dev` to reuse test builds).

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rill_state::{Progress, StateConfig, StateDb, SubTaskState};
use rill_topology::keyrange::{key_hash, range_of, KeyRange};

const KEYS: usize = 64_000;
const BATCH: usize = 1000;
const STORE: &str = "counts";

/// One sub-task with the keys of its range and its next offset.
struct Worker {
    state: SubTaskState,
    keys: Vec<Vec<u8>>,
    next_offset: u64,
}

impl Worker {
    /// Reads and increments every key of the range once, committing every `BATCH` keys.
    fn round(&mut self) {
        let range = self.state.range();
        for chunk in self.keys.chunks(BATCH) {
            let store = self.state.store(STORE).expect("store is open");
            for key in chunk {
                let count = store
                    .get(key)
                    .expect("get")
                    .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap_or([0; 8])));
                store.put(key, &(count + 1).to_be_bytes()).expect("put");
            }
            self.next_offset += chunk.len() as u64;
            self.state
                .commit(Progress::new(range, "bench", self.next_offset))
                .expect("commit");
        }
    }
}

/// A state dir with `ranges` sub-tasks spread over `threads` groups.
struct Load {
    groups: Vec<Vec<Worker>>,
    _db: Arc<StateDb>,
    _dir: tempfile::TempDir,
}

impl Load {
    fn new(ranges: usize, threads: usize) -> Load {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = StateDb::open(&StateConfig {
            dir: dir.path().to_path_buf(),
            memory_bytes: 64 << 20,
            create_column_families: Vec::new(),
            max_open_files: None,
        })
        .expect("open state");
        let mut keys = vec![Vec::new(); ranges];
        for i in 0..KEYS {
            let key = format!("key-{i:08}").into_bytes();
            keys[range_of(key_hash(&key), ranges)].push(key);
        }
        let mut groups: Vec<Vec<Worker>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, keys) in keys.into_iter().enumerate() {
            let state = SubTaskState::open(
                db.clone(),
                &[STORE.to_string()],
                0,
                KeyRange::nth(i, ranges),
            )
            .expect("open sub-task");
            groups[i % threads].push(Worker {
                state,
                keys,
                next_offset: 0,
            });
        }
        Load {
            groups,
            _db: db,
            _dir: dir,
        }
    }

    fn round(&mut self) {
        std::thread::scope(|s| {
            for group in &mut self.groups {
                s.spawn(move || group.iter_mut().for_each(Worker::round));
            }
        });
    }
}

fn bench_state(c: &mut Criterion) {
    let mut g = c.benchmark_group("state_get_put");
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    for (name, ranges, threads) in [
        ("64cf_2threads", 64, 2),
        ("2cf_2threads", 2, 2),
        ("1cf_1thread", 1, 1),
    ] {
        let mut load = Load::new(ranges, threads);
        g.bench_function(name, |b| b.iter(|| load.round()));
    }
    g.finish();
}

criterion_group!(benches, bench_state);
criterion_main!(benches);
