//! Async stages in a sub-task: records whose calls run on the engine's async runtime while the
//! sub-task goes on with other keys.
//!
//! A record of a sub-topology with an async stage goes through three steps:
//! 1. **admitted** (taken from the mailbox, in offset order): its offset becomes *open*; it
//!    queues behind the record of its routing hash that is running, if any;
//! 2. **started** when it is first of its hash and fewer than `async.max.in.flight` records
//!    run: the sub-topology runs it up to the async stage, whose calls go to the runtime;
//! 3. **completed** when its last call answered: the stage's children (the stateful part of
//!    the sub-topology, see `rill_topology::dsl::async_stage`) run with what the calls resolved
//!    to, in the order the calls were made, and the offset is closed.
//!
//! A range commit covers completed records only: its offset is the lowest open one, and the
//! offsets above it that completed are listed in the progress record
//! ([`rill_state::TopicOffset::applied_above`]), which the RocksDB progress and the changelog
//! markers carry in full; a restart skips them. A range without state resumes from the Kafka
//! commit metadata alone, which lists them too, in the shortest of three forms (gaps, runs or a
//! bitmap; see `kafka::metadata`).
//!
//! Event time: the nodes behind the stage see the **settled time** (`rill_topology::exec`), the
//! largest event time of the records that completed together with every record admitted
//! before them, in admission order ([`Settling`]). A record that completes while an earlier one
//! is open reaches the stateful part at once but does not move its stream time; so a window
//! never closes over a record that was on time in input order and is still waiting for its call.
//! A record that completes first of all open ones sees its own time too, as it would in order.
//!
//! Offsets listed stay bounded: no record starts while a range lists [`MAX_APPLIED_ABOVE`]
//! completed offsets above a stuck one, or, without state, while their shortest form would
//! take more than the range's share of the metadata (so a commit never falls back to its low
//! watermark alone, which would run them all again); only the record of the lowest open
//! offset may still start then, as completing it is what shrinks the listing.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use metrics::Counter;
use rill_topology::exec::{panic_message, AsyncCall, TaskError};
use rill_topology::processor::{ErasedRecord, ProcessError, RecordMeta};
use rill_topology::{KeyRange, RawRecord};
use tokio::sync::mpsc;

use super::applied::AppliedAbove;
use super::config::{AsyncConfig, ProcessingOrder};
use super::env::Env;
use super::record_errors::{record_error_node, Failed};
use super::subtask::{Core, Input, SubTask, SubTaskId};
use super::{EngineError, Shared, Source};

/// Completed offsets a range may list above its lowest open one before it admits no more
/// records (the progress record stays small: about 2 bytes per listed offset).
pub(crate) const MAX_APPLIED_ABOVE: usize = 100_000;

/// The bytes a range without state may spend listing completed offsets: its share of the
/// 4096-byte commit metadata (base64 of ~3000 bytes; each range costs up to 26 bytes of bounds,
/// offset and framing), so that the partition's commit always fits and a restart skips every
/// record it lists. Ranges are counted from the width of `range` (one of the partition's
/// equal ranges).
fn metadata_share(range: KeyRange) -> usize {
    let width = range.end.saturating_sub(range.start).max(1);
    let ranges = usize::try_from((u64::MAX / width).max(1)).unwrap_or(usize::MAX);
    (3000usize.saturating_sub(26usize.saturating_mul(ranges)) / ranges).max(1)
}

/// How many completed offsets a range may list before it starts no more records.
#[derive(Clone, Copy, Debug)]
enum Limit {
    /// With state: this many (the progress record carries them).
    Offsets(usize),
    /// Without state: as many as the shortest metadata form fits in this many bytes.
    MetadataBytes(usize),
}

/// The settled times of the ranges of one task (one factor), by range index: what a range
/// behind an async stage stamps on its internal-topic outputs is their minimum, the time up to
/// which every range of the partition has settled. A range that runs ahead must not move the
/// reader's stream time past the records another range still waits for (the ranges' writes
/// interleave there).
///
/// Invariant: slot `i` is written only by range `i` (under its core lock) and only grows, as a
/// settled time does; so a minimum read while others write is at most stale-low, and a lower
/// bound is always a safe one (it only delays the reader's stream time).
#[derive(Debug)]
pub(crate) struct SettledTimes(Vec<std::sync::atomic::AtomicI64>);

impl SettledTimes {
    /// `ranges` slots, nothing settled.
    pub fn new(ranges: usize) -> Self {
        SettledTimes(
            (0..ranges)
                .map(|_| std::sync::atomic::AtomicI64::new(i64::MIN))
                .collect(),
        )
    }

    /// Range `index` settled up to `time`.
    pub fn set(&self, index: usize, time: Option<i64>) {
        if let (Some(slot), Some(t)) = (self.0.get(index), time) {
            slot.fetch_max(t, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The time every range settled up to (`i64::MIN`: one settled nothing yet).
    pub fn min(&self) -> i64 {
        self.0
            .iter()
            .map(|s| s.load(std::sync::atomic::Ordering::SeqCst))
            .min()
            .unwrap_or(i64::MIN)
    }
}

/// What [`Core::process`] leaves running: the calls of a record that reached an async stage.
pub(crate) struct Launch {
    pub calls: Vec<AsyncCall>,
    pub raw: RawRecord,
    pub meta: RecordMeta,
}

/// What a call resolved to.
type Answer = Result<Vec<ErasedRecord>, ProcessError>;

/// The answer of one call, back in the sub-task's mailbox.
pub(crate) struct Completion {
    source: usize,
    offset: u64,
    /// The call's position among its record's calls.
    index: usize,
    result: Answer,
    attempts: u32,
}

/// A started record whose calls have not all answered.
struct Running {
    source: Arc<Source>,
    hash: u64,
    raw: RawRecord,
    meta: RecordMeta,
    nodes: Vec<usize>,
    /// Per call: its answer and the attempts it took, once it answered.
    results: Vec<Option<(Answer, u32)>>,
    outstanding: usize,
}

/// Offsets of one source admitted and not completed, lowest first. Records are admitted in
/// offset order, so this is a deque: an insert is a push at the back, a completed offset is
/// marked and leaves once it reaches the front. Invariant: the front entry, if any, is open
/// (entries are bounded like the completed offsets a range may list above its lowest open one).
#[derive(Debug, Default)]
struct OpenOffsets {
    /// (offset, still open), offsets increasing.
    entries: VecDeque<(u64, bool)>,
}

impl OpenOffsets {
    fn insert(&mut self, offset: u64) {
        match self.entries.back() {
            Some(&(last, _)) if last >= offset => {
                match self.entries.binary_search_by_key(&offset, |e| e.0) {
                    Ok(i) => self.entries[i].1 = true,
                    Err(i) => self.entries.insert(i, (offset, true)),
                }
            }
            _ => self.entries.push_back((offset, true)),
        }
    }

    fn remove(&mut self, offset: u64) {
        if let Ok(i) = self.entries.binary_search_by_key(&offset, |e| e.0) {
            self.entries[i].1 = false;
        }
        while self.entries.front().is_some_and(|e| !e.1) {
            self.entries.pop_front();
        }
    }

    /// The lowest open offset.
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|e| e.0)
    }
}

/// Records admitted and not yet settled, in admission order (see the module doc). Invariant: the
/// front entry, if any, is open; a record leaving the front moves the settled time to its event
/// time. Entries are bounded like [`OpenOffsets`].
#[derive(Debug, Default)]
struct Settling {
    /// Per entry: (event time once started, still open).
    entries: VecDeque<(Option<i64>, bool)>,
    /// The admission number of the front entry.
    front: u64,
    /// The admission number of each open record, by (source index, offset).
    numbers: FastMap<(usize, u64), u64>,
}

impl Settling {
    /// Takes an open record (again: no new entry, as [`OpenOffsets`] keeps one per offset).
    fn admit(&mut self, source: usize, offset: u64) {
        if self.numbers.contains_key(&(source, offset)) {
            return;
        }
        let n = self.front + self.entries.len() as u64;
        self.numbers.insert((source, offset), n);
        self.entries.push_back((None, true));
    }

    /// Takes a record completed before a restart; the largest event time this settles.
    fn admit_completed(&mut self, event_time: Option<i64>) -> Option<i64> {
        self.entries.push_back((event_time, false));
        self.pop_settled()
    }

    fn entry(&mut self, source: usize, offset: u64) -> Option<&mut (Option<i64>, bool)> {
        let n = *self.numbers.get(&(source, offset))?;
        let at = usize::try_from(n - self.front).ok()?;
        self.entries.get_mut(at)
    }

    /// Notes the event time of a record that started.
    fn started(&mut self, source: usize, offset: u64, event_time: Option<i64>) {
        if let Some(e) = self.entry(source, offset) {
            e.0 = event_time;
        }
    }

    /// The event time of the record, if it is the first open one.
    fn first_time(&self, source: usize, offset: u64) -> Option<i64> {
        let n = *self.numbers.get(&(source, offset))?;
        (n == self.front).then(|| self.entries.front()?.0).flatten()
    }

    /// Closes a record; the largest event time of the records this settles.
    fn close(&mut self, source: usize, offset: u64) -> Option<i64> {
        if let Some(e) = self.entry(source, offset) {
            e.1 = false;
        }
        self.numbers.remove(&(source, offset));
        self.pop_settled()
    }

    fn pop_settled(&mut self) -> Option<i64> {
        let mut settled = None;
        while let Some(&(time, false)) = self.entries.front() {
            self.entries.pop_front();
            self.front += 1;
            settled = settled.max(time);
        }
        settled
    }
}

/// A hash map keyed by routing hashes or offsets: FxHash's multiply-rotate instead of SipHash
/// (these keys come from the log, not from a caller who could pick colliding ones cheaply, and
/// the maps are on every async record's path).
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

/// See [`FastMap`].
#[derive(Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// What a durable commit of a sub-task with an async stage waits for before it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    /// The running calls (revocation, shutdown): no record starts meanwhile, so the commit
    /// covers every record started before it; queued ones stay open and are read again by
    /// whoever resumes from the commit.
    Running,
    /// Every record admitted (a factor change, which does not read them again): queued
    /// records go on starting until none is open.
    Admitted,
}

/// The async side of one sub-task (present when its sub-topology has an async stage).
pub(crate) struct AsyncStage {
    config: AsyncConfig,
    /// `processing.order=unordered` in a sub-topology without state: no per-key queue.
    unordered: bool,
    /// Completed offsets the range may list above its lowest open one before it starts no
    /// more records: [`MAX_APPLIED_ABOVE`], or, without state, its share of the commit metadata
    /// (see [`metadata_share`]).
    limit: Limit,
    /// Per routing hash that has a record started or in `ready`: the records of that hash
    /// admitted after it, in offset order. Invariant: at most one record per hash is started
    /// or in `ready`, so the records of a key run one at a time, in offset order.
    keys: FastMap<u64, VecDeque<Input>>,
    /// Records first of their hash, waiting for fewer than `max_in_flight` to run.
    ready: VecDeque<Input>,
    /// Started records, by (source index, offset).
    running: FastMap<(usize, u64), Running>,
    /// Per source: how many of `running` it has, and the highest offset it ever started.
    /// Invariant: the count equals its entries in `running` (kept by `launch` and
    /// `complete`); the metadata limit counts them as listed already, since a record
    /// running now completes after the limit let it start (see [`AsyncStage::full`]).
    in_flight: Vec<(usize, u64)>,
    /// Per source: offsets admitted and not completed. A commit's offset is the lowest one.
    open: Vec<OpenOffsets>,
    /// Every source's records admitted and not settled, in admission order (see the module doc).
    settling: Settling,
    /// Set when a record completed since the last commit.
    pub(super) changed: bool,
    /// Records that left the queue (started, or skipped) since the last take: the sub-task's
    /// depth counts the records queued in it.
    released: usize,
    /// Set while a durable commit waits (see [`Drain`]).
    durable_pending: Option<Drain>,
    /// Who waits for that commit.
    pub(super) durable_waiters: Vec<crossbeam_channel::Sender<()>>,
    /// Calls of records started since the last hand-over to the driver.
    starting: Vec<CallJob>,
    /// The sub-task's call driver, spawned with its first call (see [`drive`]).
    driver: Option<mpsc::UnboundedSender<Vec<CallJob>>>,
}

impl AsyncStage {
    /// Whether every record taken so far has completed and settled: nothing holds the settled
    /// time below the partition's stream time.
    pub(super) fn all_settled(&self) -> bool {
        self.settling.entries.is_empty()
    }

    /// The stage of a sub-task reading `topics` topics; `stateless` when its sub-topology has
    /// no store (only then may `processing.order=unordered` lift per-key order).
    pub fn new(topics: usize, config: AsyncConfig, stateless: bool, range: KeyRange) -> Self {
        AsyncStage {
            limit: if stateless {
                Limit::MetadataBytes(metadata_share(range))
            } else {
                Limit::Offsets(MAX_APPLIED_ABOVE)
            },
            unordered: stateless && config.order == ProcessingOrder::Unordered,
            config,
            keys: FastMap::default(),
            ready: VecDeque::new(),
            running: FastMap::default(),
            in_flight: vec![(0, 0); topics],
            open: (0..topics).map(|_| OpenOffsets::default()).collect(),
            settling: Settling::default(),
            changed: false,
            released: 0,
            durable_pending: None,
            durable_waiters: Vec::new(),
            starting: Vec::new(),
            driver: None,
        }
    }

    /// Records that left the queue since the last call.
    pub fn take_released(&mut self) -> usize {
        std::mem::take(&mut self.released)
    }

    /// The lowest open offset of source `source`.
    pub fn lowest_open(&self, source: usize) -> Option<u64> {
        self.open[source].first()
    }

    /// Whether a durable commit waits.
    pub fn durable_pending(&self) -> bool {
        self.durable_pending.is_some()
    }

    /// Whether what the waiting durable commit waits for is done.
    fn drained(&self) -> bool {
        match self.durable_pending {
            None => false,
            Some(Drain::Running) => self.running.is_empty(),
            Some(Drain::Admitted) => {
                self.running.is_empty() && self.open.iter().all(|o| o.first().is_none())
            }
        }
    }

    /// Takes the ready record whose offset is its source's lowest open one, if any.
    fn take_lowest_ready(&mut self) -> Option<Input> {
        let open = &self.open;
        let at = self
            .ready
            .iter()
            .position(|i| open[i.source.index].first() == Some(i.offset))?;
        self.ready.remove(at)
    }

    /// Whether starting the first ready record (or more records) would let a listing outgrow
    /// its limit (see [`Limit`]), counting every running record as completed.
    fn full(&self, applied_above: &[AppliedAbove]) -> bool {
        let candidate = self.ready.front().map(|i| (i.source.index, i.offset));
        applied_above
            .iter()
            .enumerate()
            .any(|(i, s)| match self.limit {
                Limit::Offsets(n) => s.len() >= n,
                Limit::MetadataBytes(bytes) => {
                    let next = self.open[i].first().unwrap_or(0);
                    let (mut more, mut highest) = self.in_flight[i];
                    if let Some((_, offset)) = candidate.filter(|c| c.0 == i) {
                        more += 1;
                        highest = highest.max(offset);
                    }
                    s.metadata_bytes_with(next, more, highest) >= bytes
                }
            })
    }
}

impl Core {
    /// Takes a record of a sub-topology with an async stage (step 1 of the module doc).
    pub(super) fn admit(
        &mut self,
        id: &SubTaskId,
        input: Input,
        shared: &Arc<Shared>,
        me: &Weak<SubTask>,
    ) -> Result<(), EngineError> {
        let (source, offset) = (input.source.index, input.offset);
        self.advance_processed(source, offset);
        let Some(stage) = self.asyncs.as_mut() else {
            return Ok(());
        };
        if self.applied_above[source].contains(offset) {
            // Completed before a restart (listed in the progress record).
            stage.released += 1;
            shared.stats.count_skipped_duplicate();
            let time = self.instance.event_time(&input.source.topic, &input.raw);
            if let Some(t) = stage.settling.admit_completed(time) {
                self.instance.advance_settled_time(t);
            }
            return Ok(());
        }
        stage.open[source].insert(offset);
        stage.settling.admit(source, offset);
        if stage.unordered {
            stage.ready.push_back(input);
            return self.start_ready(id, shared, me);
        }
        match stage.keys.get_mut(&input.hash) {
            Some(behind) => behind.push_back(input),
            None => {
                stage.keys.insert(input.hash, VecDeque::new());
                stage.ready.push_back(input);
            }
        }
        self.start_ready(id, shared, me)
    }

    /// Starts ready records while fewer than `async.max.in.flight` run (step 2).
    fn start_ready(
        &mut self,
        id: &SubTaskId,
        shared: &Arc<Shared>,
        me: &Weak<SubTask>,
    ) -> Result<(), EngineError> {
        let started = loop {
            let Some(stage) = self.asyncs.as_mut() else {
                return Ok(());
            };
            if stage.running.len() >= stage.config.max_in_flight
                || stage.durable_pending == Some(Drain::Running)
            {
                break Ok(());
            }
            // A full listing still lets the lowest open record start: completing it is what
            // shrinks the listing (it may wait in `ready` behind records of higher offsets).
            let next = if stage.full(&self.applied_above) {
                stage.take_lowest_ready()
            } else {
                stage.ready.pop_front()
            };
            let Some(input) = next else {
                break Ok(());
            };
            stage.released += 1;
            let source = Arc::clone(&input.source);
            let (offset, hash) = (input.offset, input.hash);
            let processed = self.process(id, input, shared);
            let time = self.instance.take_event_time();
            if let Some(stage) = self.asyncs.as_mut() {
                stage.settling.started(source.index, offset, time);
            }
            match processed {
                Ok(None) => {
                    self.close(source.index, offset, hash);
                }
                Ok(Some(launch)) => self.launch(source, offset, hash, launch),
                Err(e) => break Err(e),
            }
        };
        // Also after an error: the records started before it are running.
        if let Some(stage) = self.asyncs.as_mut() {
            stage.hand_over(shared, me);
        }
        started
    }

    /// Makes a started record running; its calls go to the driver when the start loop ends.
    fn launch(&mut self, source: Arc<Source>, offset: u64, hash: u64, launch: Launch) {
        let Some(stage) = self.asyncs.as_mut() else {
            return;
        };
        let Launch { calls, raw, meta } = launch;
        let index = source.index;
        let flight = &mut stage.in_flight[index];
        *flight = (flight.0 + 1, flight.1.max(offset));
        stage.running.insert(
            (index, offset),
            Running {
                source,
                hash,
                raw,
                meta,
                nodes: calls.iter().map(|c| c.node).collect(),
                results: calls.iter().map(|_| None).collect(),
                outstanding: calls.len(),
            },
        );
        stage
            .starting
            .extend(calls.into_iter().enumerate().map(|(i, call)| CallJob {
                call,
                source: index,
                offset,
                index: i,
            }));
    }

    /// Takes answers of calls; completes each record that has all of them (step 3), then
    /// starts what the freed slots allow.
    pub(super) fn complete(
        &mut self,
        id: &SubTaskId,
        answers: Vec<Completion>,
        shared: &Arc<Shared>,
        me: &Weak<SubTask>,
    ) -> Result<(), EngineError> {
        for c in answers {
            let Some(stage) = self.asyncs.as_mut() else {
                return Ok(());
            };
            let key = (c.source, c.offset);
            let Some(running) = stage.running.get_mut(&key) else {
                continue;
            };
            if let Some(slot) = running.results.get_mut(c.index) {
                if slot.replace((c.result, c.attempts)).is_none() {
                    running.outstanding -= 1;
                }
            }
            if running.outstanding > 0 {
                continue;
            }
            if let Some(running) = stage.running.remove(&key) {
                stage.in_flight[key.0].0 -= 1;
                self.finish_running(id, running, shared)?;
            }
        }
        self.commit_if_drained(id, shared)?;
        self.start_ready(id, shared, me)?;
        // Records that complete without a call (filtered before the stage) close in the start.
        self.commit_if_drained(id, shared)
    }

    /// Makes the waiting durable commit once what it waits for is done.
    fn commit_if_drained(
        &mut self,
        id: &SubTaskId,
        shared: &Arc<Shared>,
    ) -> Result<(), EngineError> {
        let Some(stage) = self.asyncs.as_mut().filter(|a| a.drained()) else {
            return Ok(());
        };
        stage.durable_pending = None;
        let waiters = std::mem::take(&mut stage.durable_waiters);
        let r = self.commit(id, true, shared);
        for w in waiters {
            let _ = w.send(());
        }
        r
    }

    /// Defers a durable commit until what `drain` names is done; true when deferred.
    pub(super) fn defer_durable_commit(&mut self, drain: Drain) -> bool {
        let Some(stage) = self.asyncs.as_mut() else {
            return false;
        };
        stage.durable_pending = Some(drain);
        if stage.drained() {
            stage.durable_pending = None;
            return false;
        }
        true
    }

    /// Runs the async stages' children with what a record's calls resolved to, or hands a
    /// failed call to the processing handler; then closes the record.
    fn finish_running(
        &mut self,
        id: &SubTaskId,
        running: Running,
        shared: &Arc<Shared>,
    ) -> Result<(), EngineError> {
        let Running {
            source,
            hash,
            raw,
            meta,
            nodes,
            results,
            ..
        } = running;
        let offset = meta.offset;
        let mut outcome: Result<(), TaskError> = Ok(());
        let mut attempts = 0;
        let mut answers = Vec::with_capacity(results.len());
        for (node, result) in nodes.into_iter().zip(results) {
            let Some((result, tries)) = result else {
                continue;
            };
            attempts = attempts.max(tries);
            match result {
                Ok(outputs) => answers.push((node, outputs)),
                Err(e) if outcome.is_ok() => {
                    outcome = Err(TaskError::Process {
                        node: self.instance.node_name(node).to_string(),
                        source: e,
                    })
                }
                Err(_) => {}
            }
        }
        if outcome.is_ok() {
            if let Some(state) = self.state.as_mut() {
                state.set_routing_hash(hash);
            }
            // First of the open records: it sees its own time, as in input order.
            let first = self.asyncs.as_ref();
            if let Some(t) = first.and_then(|a| a.settling.first_time(source.index, offset)) {
                self.instance.advance_settled_time(t);
            }
            let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
            env.origin = Some((source.id, offset, hash));
            self.settled_times
                .set(id.index, self.instance.settled_time());
            env.settled = Some(self.settled_times.min());
            for (node, outputs) in answers {
                outcome = self.instance.resume(node, outputs, &meta, &mut env);
                if outcome.is_err() {
                    break;
                }
            }
            env.finish()?;
            if outcome.is_ok() && !self.instance.take_calls().is_empty() {
                // `build` refuses a second async stage on a path; reaching one is a bug.
                return Err(EngineError::Task {
                    what: format!("{}-{} offset {offset}", source.name, id.partition),
                    source: TaskError::Process {
                        node: String::new(),
                        source: ProcessError::Internal("an async stage after another".into()),
                    },
                });
            }
        }
        match outcome {
            Ok(()) => {
                shared.stats.count_processed();
                self.count_processed(source.index);
            }
            Err(e) => {
                let _ = self.instance.take_calls();
                let what = format!("{}-{} offset {offset}", source.name, id.partition);
                let Some(node) = record_error_node(&e, &shared.config) else {
                    return Err(EngineError::Task { what, source: e });
                };
                let failed = Failed {
                    raw: &raw,
                    topic: &source.name,
                    partition: id.partition,
                    offset,
                    error: &e.to_string(),
                    node: Some(node),
                    attempts: Some(attempts),
                };
                self.skip_failed(&failed, shared)?;
            }
        }
        if self.close(source.index, offset, hash) {
            // Stream-time punctuations behind the stage fire as the settled time moves, with
            // the outputs and writes of the record that moved it.
            if let Some(state) = self.state.as_mut() {
                state.set_routing_hash(hash);
            }
            self.settled_times
                .set(id.index, self.instance.settled_time());
            let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
            env.origin = Some((source.id, offset, hash));
            env.settled = Some(self.settled_times.min());
            let r = self.instance.punctuate_settled(&mut env);
            env.finish()?;
            r.map_err(|e| EngineError::Task {
                what: format!("{}-{} offset {offset}", source.name, id.partition),
                source: e,
            })?;
        }
        Ok(())
    }

    /// Closes a completed record's offset and readies the next record of its hash; true when
    /// that moved the settled time.
    fn close(&mut self, source: usize, offset: u64, hash: u64) -> bool {
        let Some(stage) = self.asyncs.as_mut() else {
            return false;
        };
        let settled = stage.settling.close(source, offset);
        let moved = settled.is_some_and(|t| self.instance.advance_settled_time(t));
        let Some(stage) = self.asyncs.as_mut() else {
            return moved;
        };
        stage.open[source].remove(offset);
        let low = stage.open[source].first();
        if low.is_some_and(|low| low < offset) {
            self.applied_above[source].insert(offset);
        }
        // What the lowest open offset passed needs no listing any more.
        if let Some(floor) = low.or(self.processed[source]) {
            self.applied_above[source].prune_below(floor);
        }
        stage.changed = true;
        if let Some(behind) = stage.keys.get_mut(&hash) {
            match behind.pop_front() {
                Some(next) => stage.ready.push_back(next),
                None => {
                    stage.keys.remove(&hash);
                }
            }
        }
        moved
    }
}

/// One call of a started record, on its way to the sub-task's driver.
struct CallJob {
    call: AsyncCall,
    source: usize,
    offset: u64,
    /// The call's position among its record's calls.
    index: usize,
}

impl AsyncStage {
    /// Hands the calls of the records just started to the sub-task's driver, spawning it with
    /// the first ones. The calls count as work of the engine until their answers are queued,
    /// so `wait_idle` and a drain wait for them.
    fn hand_over(&mut self, shared: &Arc<Shared>, me: &Weak<SubTask>) {
        if self.starting.is_empty() {
            return;
        }
        let Some(runtime) = shared.async_runtime.as_ref() else {
            return;
        };
        let jobs = std::mem::take(&mut self.starting);
        let n = jobs.len();
        shared.work_added(n);
        shared.metrics.async_in_flight.increment(n as f64);
        let config = &self.config;
        let driver = self
            .driver
            .get_or_insert_with(|| spawn_driver(runtime, shared, me, config));
        if driver.send(jobs).is_err() {
            // The driver is gone with the runtime (the engine is being dropped): nobody will
            // answer, and the records were not committed.
            shared.metrics.async_in_flight.decrement(n as f64);
            shared.work_done(n);
        }
    }
}

/// Spawns the driver of a sub-task's calls; it ends when the returned sender is dropped (with
/// the sub-task), abandoning the calls still running (their records were not committed).
fn spawn_driver(
    runtime: &tokio::runtime::Handle,
    shared: &Arc<Shared>,
    me: &Weak<SubTask>,
    config: &AsyncConfig,
) -> mpsc::UnboundedSender<Vec<CallJob>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let live = LiveDriver::new(&shared.async_calls);
    let retry = (config.retry_max_attempts, config.retry_backoff);
    // Weak: a driver never keeps its sub-task (or the engine) alive.
    let (me, weak_shared) = (me.clone(), Arc::downgrade(shared));
    runtime.spawn(async move {
        let _live = live;
        drive(rx, &me, &weak_shared, retry).await;
    });
    tx
}

/// Runs a sub-task's calls, with retries, and queues their answers in its mailbox: all the
/// answers one poll found in one [`super::subtask::Work::Completed`]. One task per sub-task
/// rather than one per call: a call costs a poll, not a spawn from outside the runtime and a
/// mailbox push each, and a sub-task that wakes takes many answers at once. Like `buffer_unordered`, one task
/// polls the calls of its sub-task, so CPU-heavy work inside a call holds up the others of
/// that sub-task (it belongs in a blocking stage or `spawn_blocking`).
async fn drive(
    mut calls: mpsc::UnboundedReceiver<Vec<CallJob>>,
    me: &Weak<SubTask>,
    shared: &Weak<Shared>,
    retry: (u32, Duration),
) {
    let Some(retries) = shared.upgrade().map(|s| s.metrics.async_retries.clone()) else {
        return;
    };
    let mut running = FuturesUnordered::new();
    let mut open = true;
    std::future::poll_fn(|cx| {
        while open {
            match calls.poll_recv(cx) {
                Poll::Ready(Some(jobs)) => running.extend(
                    jobs.into_iter()
                        .map(|j| run_call(j, retry, retries.clone())),
                ),
                Poll::Ready(None) => open = false,
                Poll::Pending => break,
            }
        }
        let mut answered = Vec::new();
        while let Poll::Ready(Some(answer)) = running.poll_next_unpin(cx) {
            answered.push(answer);
        }
        if !answered.is_empty() {
            deliver(me, shared, answered);
        }
        if open {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    if let Some(shared) = shared.upgrade() {
        let n = running.len();
        shared.metrics.async_in_flight.decrement(n as f64);
        shared.work_done(n);
    }
}

/// Queues answers in the sub-task's mailbox (dropped when the sub-task is gone).
fn deliver(me: &Weak<SubTask>, shared: &Weak<Shared>, answered: Vec<Completion>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let n = answered.len();
    shared.metrics.async_in_flight.decrement(n as f64);
    if let Some(subtask) = me.upgrade() {
        subtask.push_answers(answered, &shared);
    }
    shared.work_done(n);
}

/// Runs one call: again while it fails with a retryable error and attempts are left (`retry`:
/// the attempts and the first backoff); a panic is the call's error.
async fn run_call(job: CallJob, retry: (u32, Duration), retries: Counter) -> Completion {
    let CallJob {
        call,
        source,
        offset,
        index,
    } = job;
    let (max_attempts, base) = retry;
    let mut attempts = 0u32;
    let result = loop {
        attempts += 1;
        let answer = match std::panic::catch_unwind(AssertUnwindSafe(|| call.start())) {
            Ok(fut) => AssertUnwindSafe(fut)
                .catch_unwind()
                .await
                .unwrap_or_else(|p| Err(ProcessError::Panicked(panic_message(&*p)))),
            Err(p) => Err(ProcessError::Panicked(panic_message(&*p))),
        };
        match answer {
            Err(ProcessError::Retryable(e)) if attempts < max_attempts => {
                tracing::debug!(offset, attempts, error = %e, "retrying an async call");
                retries.increment(1);
                tokio::time::sleep(backoff(base, attempts)).await;
            }
            answer => break answer,
        }
    };
    Completion {
        source,
        offset,
        index,
        result,
        attempts,
    }
}

/// Counts a driver's task as live until it is dropped (see `Shared::async_calls`).
struct LiveDriver(Arc<std::sync::atomic::AtomicUsize>);

impl LiveDriver {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        LiveDriver(Arc::clone(count))
    }
}

impl Drop for LiveDriver {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The engine's async runtime: calls of async stages run on it. Shut down without waiting
/// when dropped (calls still running are abandoned: their records were not committed).
pub(crate) struct AsyncRuntime(Option<tokio::runtime::Runtime>);

impl AsyncRuntime {
    /// `threads` worker threads (`async.threads`, niceness `nice` added): calls wait on I/O, and the CPU work is
    /// handling their answers (on the thread that polled them when no job runs the sub-task).
    pub fn new(threads: usize, nice: i32) -> Result<Self, EngineError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("rill-async")
            .on_thread_start(move || crate::priority::lower_this_thread(nice))
            .enable_all()
            .build()
            .map(|r| AsyncRuntime(Some(r)))
            .map_err(|e| EngineError::Pool(format!("async runtime: {e}")))
    }

    pub fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.0.as_ref().map(|r| r.handle().clone())
    }
}

impl Drop for AsyncRuntime {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.shutdown_background();
        }
    }
}

/// The wait before retry `attempt` (1 for the first retry): `base`, doubled for each further one.
fn backoff(base: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1u32 << (attempt - 1).min(16))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The deque answers as an ordered set would, for inserts mostly in order.
        #[test]
        fn open_offsets_match_an_ordered_set(
            ops in proptest::collection::vec((proptest::bool::weighted(0.6), 0u64..8), 1..300),
        ) {
            let (mut open, mut oracle) = (OpenOffsets::default(), std::collections::BTreeSet::new());
            let mut next = 0u64;
            for (insert, step) in ops {
                if insert {
                    // Mostly increasing, sometimes below the last one.
                    let offset = if step == 0 { next.saturating_sub(5) } else { next + step };
                    next = next.max(offset);
                    open.insert(offset);
                    oracle.insert(offset);
                } else if let Some(&o) = oracle.iter().nth(step as usize % oracle.len().max(1)) {
                    open.remove(o);
                    oracle.remove(&o);
                }
                proptest::prop_assert_eq!(open.first(), oracle.first().copied());
            }
        }

        /// Ranges setting their settled times from threads of their own (each only its slot,
        /// times that grow): a minimum read meanwhile is never above the true minimum of what was
        /// set so far, and the final one is exact.
        #[test]
        fn settled_times_give_a_minimum_never_above_the_ranges(
            times in proptest::collection::vec(proptest::collection::vec(0i64..1000, 1..50), 1..5),
        ) {
            let slots = std::sync::Arc::new(SettledTimes::new(times.len()));
            let threads: Vec<_> = times
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, ts)| {
                    let slots = slots.clone();
                    std::thread::spawn(move || {
                        let mut high = i64::MIN;
                        for t in ts {
                            high = high.max(t);
                            slots.set(i, Some(high));
                            // Range i's own slot is at least what it set: the minimum is not above it.
                            assert!(slots.min() <= high);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("a range's thread");
            }
            let want = times.iter().map(|ts| ts.iter().copied().max().unwrap_or(i64::MIN)).min();
            proptest::prop_assert_eq!(Some(slots.min()), want);
        }

        /// Records of two sources admitted in one order and closed in any: the settled time is
        /// always the largest event time of the longest closed prefix of the admission order,
        /// and a record is first of the open ones exactly when everything before it closed.
        #[test]
        fn settling_follows_the_closed_prefix_of_the_admission_order(
            records in proptest::collection::vec((0usize..2, 0i64..100, proptest::bool::ANY), 1..60),
            order in proptest::collection::vec(0usize..1000, 1..60),
        ) {
            let mut settling = Settling::default();
            let mut next_offset = [0u64; 2];
            // (source, offset, time, completed before a restart)
            let mut admitted = Vec::new();
            let mut settled: Option<i64> = None;
            for &(source, time, completed) in &records {
                let offset = next_offset[source];
                next_offset[source] += 1;
                if completed {
                    settled = settled.max(settling.admit_completed(Some(time)));
                } else {
                    settling.admit(source, offset);
                    settling.admit(source, offset); // again: still one entry
                    settling.started(source, offset, Some(time));
                }
                admitted.push((source, offset, time, completed));
            }
            let mut closed: Vec<bool> = admitted.iter().map(|a| a.3).collect();
            let mut open: Vec<usize> = (0..admitted.len()).filter(|&i| !closed[i]).collect();
            for pick in order.iter().chain(std::iter::repeat_n(&0, open.len())) {
                if open.is_empty() {
                    break;
                }
                let i = open.remove(pick % open.len());
                let (source, offset, time, _) = admitted[i];
                let first = closed[..i].iter().all(|&c| c);
                proptest::prop_assert_eq!(settling.first_time(source, offset), first.then_some(time));
                settled = settled.max(settling.close(source, offset));
                closed[i] = true;
                let prefix = closed.iter().take_while(|&&c| c).count();
                let want = admitted[..prefix].iter().map(|a| a.2).max();
                proptest::prop_assert_eq!(settled, want);
            }
        }
    }

    #[test]
    fn backoff_doubles_and_saturates() {
        let b = Duration::from_millis(100);
        assert_eq!(backoff(b, 1), b);
        assert_eq!(backoff(b, 3), Duration::from_millis(400));
        assert!(backoff(b, 40) >= Duration::from_millis(100 * 65536));
    }
}
