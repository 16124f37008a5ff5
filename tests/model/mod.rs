//! The model of the commit and restore protocol that `commit_protocol_model.rs` and
//! `features_model.rs` run: a simulated cluster (every topic an in-memory log, fenced offset
//! commits by generation) and random steps on it: input, processing, commits, crashes at every
//! step of a commit (the process dies after any number of records it writes, the last one
//! possibly written but unacknowledged), restarts on the same or a fresh state dir, clean
//! rebalances to another member, zombies (an old owner that keeps writing after the next one
//! claimed the task), log compaction (within what `min.compaction.lag.ms` and the repair of
//! leftovers allow) and live and restart factor changes.
//!
//! Under `exactly_once_v2` ([`Spec::exactly_once`]) a member commits as the runtime's
//! `kafka::transaction` does (seal, ready, offsets, commit, state write); the records of an open
//! transaction are hidden from every reader (`read_committed`: a reader stops at the first, the
//! last stable offset) and removed when it aborts: at a crash, at a fenced (zombie) commit, and
//! when a zombie's transaction times out because the next member starts.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rill::runtime::internals::{changelog_topic, ChangelogReader, MemoryChangelog};
use rill::runtime::internals::{
    Dispatch, Engine, EngineConfig, PartitionProgress, PriorClaim, Resume, TopicPartition,
};
use rill::runtime::internals::{RecordSink, Ticket};
use rill::runtime::{EngineError, SinkError};
use rill::state::{StateConfig, StateDb};
use rill::topology::{KeyRange, RawRecord, Topic, Topology};

/// The application id of every model run.
pub const APP: &str = "app";

/// The cluster's view of one process: it writes through here until it dies.
pub struct Process {
    log: Arc<MemoryChangelog>,
    /// Records it may still write (`u64::MAX`: no limit); at 0 it is dead.
    pub budget: AtomicU64,
    /// Whether the record that kills it is written (but never acknowledged).
    ghost: AtomicBool,
    /// Under `exactly_once_v2`: its open transaction.
    txn: Option<Transaction>,
}

/// Per topic (partition 0), the offsets of records in open transactions.
type Hidden = Arc<Mutex<HashMap<String, BTreeSet<u64>>>>;

/// A process's open transaction: its records, hidden until it commits.
struct Transaction {
    hidden: Hidden,
    open: Mutex<Vec<(String, u64)>>,
}

impl Process {
    /// Appends `record`, into the open transaction when there is one (under the lock of the
    /// hidden offsets, so that no reader sees it in between).
    fn write(&self, topic: &str, partition: u32, record: RawRecord) -> u64 {
        let Some(txn) = &self.txn else {
            return self.log.append(topic, partition, record);
        };
        let mut hidden = txn.hidden.lock().unwrap();
        let offset = self.log.append(topic, partition, record);
        hidden.entry(topic.to_string()).or_default().insert(offset);
        txn.open.lock().unwrap().push((topic.to_string(), offset));
        offset
    }

    /// Its open transaction commits: its records become visible.
    pub fn commit_transaction(&self) {
        let Some(txn) = &self.txn else { return };
        let mut hidden = txn.hidden.lock().unwrap();
        for (t, o) in txn.open.lock().unwrap().drain(..) {
            hidden.entry(t).or_default().remove(&o);
        }
    }

    /// Its open transaction aborts: its records are gone for every `read_committed` reader.
    pub fn abort_transaction(&self) {
        let Some(txn) = &self.txn else { return };
        let mut hidden = txn.hidden.lock().unwrap();
        let mut aborted: HashMap<String, BTreeSet<u64>> = HashMap::new();
        for (t, o) in txn.open.lock().unwrap().drain(..) {
            hidden.entry(t.clone()).or_default().remove(&o);
            aborted.entry(t).or_default().insert(o);
        }
        for (t, offsets) in aborted {
            self.log.remove(&t, 0, |o, _| offsets.contains(&o));
        }
    }
}

/// The records of `topic` a `read_committed` reader sees: those below its first hidden one.
fn committed_records(log: &MemoryChangelog, hidden: &Hidden, topic: &str) -> Vec<(u64, RawRecord)> {
    let hidden = hidden.lock().unwrap();
    let stable = hidden
        .get(topic)
        .and_then(|h| h.first().copied())
        .unwrap_or(u64::MAX);
    let mut records = log.records(topic, 0);
    records.retain(|(o, _)| *o < stable);
    records
}

/// A `read_committed` changelog reader.
struct ReadCommitted {
    log: Arc<MemoryChangelog>,
    hidden: Hidden,
}

impl ChangelogReader for ReadCommitted {
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        _cancel: &AtomicBool,
        visit: &mut dyn FnMut(u64, RawRecord) -> Result<(), EngineError>,
    ) -> Result<u64, EngineError> {
        assert_eq!(partition, 0, "the model has partition 0 only");
        let mut n = 0;
        for (o, r) in committed_records(&self.log, &self.hidden, topic) {
            if o >= from {
                visit(o, r)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

impl RecordSink for Process {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: Ticket,
    ) -> Result<(), SinkError> {
        match self.budget.load(Ordering::SeqCst) {
            u64::MAX => {
                ticket.delivered(Ok(self.write(topic, partition.unwrap_or(0), record)));
                Ok(())
            }
            0 => {
                if self.ghost.swap(false, Ordering::SeqCst) {
                    self.write(topic, partition.unwrap_or(0), record);
                }
                drop(ticket); // unsettled: the writer sees a lost record, as a crash would
                Ok(())
            }
            n => {
                self.budget.store(n - 1, Ordering::SeqCst);
                ticket.delivered(Ok(self.write(topic, partition.unwrap_or(0), record)));
                Ok(())
            }
        }
    }
}

/// What the group coordinator keeps per input topic: offset, range offsets, lineage.
#[derive(Clone, Debug, Default)]
struct Committed {
    offset: Option<u64>,
    ranges: Vec<(KeyRange, u64)>,
    lineage: Option<u64>,
}

/// One member: an engine on a state dir, its position in each input log, its generation.
pub struct Member {
    /// Its engine.
    pub engine: Engine,
    /// Its writes, until it dies.
    pub process: Arc<Process>,
    generation: i32,
    positions: HashMap<&'static str, u64>,
    /// Per changelog: the offsets its restore read, from its local position to the log end when
    /// it claimed.
    restored: HashMap<String, (u64, u64)>,
    /// Whether a durable commit of this member completed (its repairs are written).
    committed_once: bool,
}

/// What a model runs: a topology of one input, read in partition 0, and what it needs.
pub struct Spec {
    /// The topology.
    pub topology: Arc<Topology>,
    /// Per sub-topology, in order: the topic it reads and its stores, the deciding (last
    /// written) store last. The first topic is the input the model produces to.
    pub subs: Vec<(&'static str, Vec<&'static str>)>,
    /// Its internal topics, with one partition each.
    pub internal: Vec<Topic>,
    /// Turns a produced (key index, value index) into a record, given the timestamps produced
    /// so far (which it updates).
    pub record: fn(u8, u8, &mut Clock) -> (String, String, i64),
    /// Bytes of the record cache (0: off).
    pub cache_bytes: usize,
    /// A second input (a join's other side): produced records alternate between the two
    /// inputs. A sub-topology that reads several topics takes their records in the order the
    /// first run took them, also in a replay (see [`Cluster::process`]).
    pub second_input: Option<&'static str>,
    /// Whether members run under `exactly_once_v2` (transactions) rather than `at_least_once`.
    pub exactly_once: bool,
}

impl Spec {
    /// The inputs the model produces to.
    fn inputs(&self) -> Vec<&'static str> {
        std::iter::once(self.subs[0].0)
            .chain(self.second_input)
            .collect()
    }

    /// Per sub-topology, the topics it reads: the inputs in [`Spec::inputs`] order first.
    fn groups(&self) -> Vec<Vec<&'static str>> {
        let inputs = self.inputs();
        self.topology
            .sub_topologies()
            .iter()
            .map(|sub| {
                let mut topics: Vec<&'static str> = sub
                    .sources
                    .iter()
                    .map(|(t, _)| {
                        let name = t.resolve(APP);
                        inputs
                            .iter()
                            .copied()
                            .find(|i| **i == name)
                            .unwrap_or_else(|| Box::leak(name.into_boxed_str()))
                    })
                    .collect();
                topics.sort_by_key(|t| inputs.iter().position(|i| i == t).unwrap_or(usize::MAX));
                topics
            })
            .collect()
    }

    /// Every store, in sub-topology order.
    pub fn stores(&self) -> Vec<&'static str> {
        self.subs
            .iter()
            .flat_map(|(_, s)| s.iter().copied())
            .collect()
    }
}

/// The timestamps produced so far.
#[derive(Debug, Default)]
pub struct Clock {
    /// The largest.
    pub max: i64,
    /// The largest per key index.
    pub keys: HashMap<u8, i64>,
}

/// A simulated cluster: every topic an in-memory log, offset commits fenced by generation.
pub struct Cluster<'s> {
    spec: &'s Spec,
    /// Every topic.
    pub log: Arc<MemoryChangelog>,
    factor: usize,
    dirs: Vec<(tempfile::TempDir, Arc<StateDb>)>,
    committed: HashMap<&'static str, Committed>,
    generation: i32,
    /// Per changelog: offsets below this may be compacted (every leftover below was read by a
    /// restore and repaired).
    compactable: HashMap<String, u64>,
    /// Every input record produced: key, value, timestamp.
    pub input: Vec<(String, String, i64)>,
    /// The timestamps produced.
    clock: Clock,
    /// Per sub-topology, the topics it reads.
    groups: Vec<Vec<&'static str>>,
    /// Under `exactly_once_v2`: the records of open transactions.
    hidden: Hidden,
    /// Per sub-topology that reads several topics: the order its records were first taken in.
    history: Mutex<HashMap<usize, Vec<(&'static str, u64)>>>,
    /// Whether members run transactions.
    eos: bool,
}

/// Where a transaction commit stops (a crash): nowhere, before the transaction commits (it
/// aborts), or after it committed and before the state write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The whole commit.
    Never,
    /// The process dies before `commit_transaction`.
    BeforeCommit,
    /// The process dies after `commit_transaction`, before writing the ranges' WriteBatches.
    BeforeWrite,
}

pub fn log_end(log: &MemoryChangelog, topic: &str) -> u64 {
    log.records(topic, 0).last().map_or(0, |(o, _)| o + 1)
}

/// An empty state dir with its database.
fn fresh_dir() -> (tempfile::TempDir, Arc<StateDb>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = StateDb::open(&StateConfig {
        dir: dir.path().to_path_buf(),
        memory_bytes: 8 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    })
    .expect("state");
    (dir, db)
}

impl<'s> Cluster<'s> {
    /// A cluster for `spec` whose members start at `factor`.
    pub fn new(spec: &'s Spec, factor: usize) -> Self {
        let dirs = (0..3).map(|_| fresh_dir()).collect();
        Cluster {
            spec,
            log: Arc::new(MemoryChangelog::default()),
            factor,
            dirs,
            committed: HashMap::new(),
            generation: 0,
            compactable: HashMap::new(),
            input: Vec::new(),
            clock: Clock::default(),
            groups: spec.groups(),
            hidden: Hidden::default(),
            history: Mutex::new(HashMap::new()),
            eos: spec.exactly_once,
        }
    }

    /// Every topic the members read.
    fn topics(&self) -> Vec<&'static str> {
        self.groups.iter().flatten().copied().collect()
    }

    /// The records of `topic` a `read_committed` reader sees.
    pub fn committed(&self, topic: &str) -> Vec<(u64, RawRecord)> {
        committed_records(&self.log, &self.hidden, topic)
    }

    /// Appends a record of (key index, value index) to the input.
    pub fn produce(&mut self, k: u8, v: u8) {
        let (key, value, timestamp) = (self.spec.record)(k, v, &mut self.clock);
        self.append(key, value, timestamp);
    }

    /// Appends a record to the input (the inputs in turn, when there are two).
    pub fn append(&mut self, key: String, value: String, timestamp: i64) {
        let inputs = self.spec.inputs();
        self.log.append(
            inputs[self.input.len() % inputs.len()],
            0,
            RawRecord {
                key: Some(key.clone().into_bytes()),
                value: Some(value.clone().into_bytes()),
                timestamp,
                headers: Default::default(),
            },
        );
        self.input.push((key, value, timestamp));
    }

    /// A fresh state dir, replacing dir `i` (a lost disk).
    pub fn wipe(&mut self, i: usize) {
        self.dirs[i] = fresh_dir();
    }

    /// From where a member starting on dir `i` repairs every unconfirmed record of each
    /// changelog (the rule of `engine::restore`, after the re-split to the configured factor):
    /// the start when no range has a local position or the group's lineage does not own the
    /// state; else, in a sub-topology's last (deciding) store, the oldest range position; in the
    /// other stores the newest one, as below it the restore skips the data records of ranges
    /// whose own position is past them.
    fn restore_from(&self, i: usize) -> HashMap<String, u64> {
        let db = &self.dirs[i].1;
        let mut from = HashMap::new();
        for (input, stores) in &self.spec.subs {
            let stores: Vec<String> = stores.iter().map(|s| s.to_string()).collect();
            let prior = self.committed.get(*input).and_then(|c| c.lineage);
            let progress = local_progress(db, &stores, self.factor);
            let trusted = match prior {
                None => progress.iter().all(Option::is_none),
                Some(l) => progress
                    .iter()
                    .flatten()
                    .all(|p| p.owner == l || p.owner_parent == l),
            };
            for s in &stores {
                let t = changelog_topic(APP, s);
                let deciding = stores.last() == Some(s);
                let f = if trusted {
                    let positions = progress.iter().map(|p| {
                        p.as_ref()
                            .and_then(|p| p.changelog_position(&t))
                            .unwrap_or(0)
                    });
                    let f = if deciding {
                        positions.min()
                    } else {
                        positions.max()
                    };
                    f.unwrap_or(0)
                } else {
                    0
                };
                from.insert(t, f);
            }
        }
        from
    }

    /// Starts a member on dir `i` in a new generation, assigned partition 0 of every input.
    pub fn start(&mut self, i: usize) -> Member {
        let from = self.restore_from(i);
        self.generation += 1;
        let restored = self
            .spec
            .stores()
            .iter()
            .map(|s| {
                let t = changelog_topic(APP, s);
                let end = log_end(&self.log, &t);
                let start = from.get(&t).copied().unwrap_or(0);
                (t, (start, end))
            })
            .collect();
        let process = Arc::new(Process {
            log: self.log.clone(),
            budget: AtomicU64::new(u64::MAX),
            ghost: AtomicBool::new(false),
            txn: self.eos.then(|| Transaction {
                hidden: self.hidden.clone(),
                open: Mutex::new(Vec::new()),
            }),
        });
        let config = EngineConfig {
            application_id: APP.into(),
            parallelising_factor: self.factor,
            worker_threads: 2,
            mailbox_capacity: 64,
            changelogs: true,
            cache_max_bytes: self.spec.cache_bytes,
            transactional: self.eos,
            ..EngineConfig::default()
        };
        let internal = self.spec.internal.iter().map(|t| (t.clone(), 1)).collect();
        let mut engine = Engine::new(
            self.spec.topology.clone(),
            config,
            Some(self.dirs[i].1.clone()),
            process.clone(),
            internal,
        )
        .expect("engine");
        engine.restore_from(Arc::new(ReadCommitted {
            log: self.log.clone(),
            hidden: self.hidden.clone(),
        }));
        if self.eos {
            // As the runtime does: claims are visible at once, outside the transaction.
            engine
                .write_claims_to(self.log.clone())
                .expect("claims sink");
        }
        let mut positions = HashMap::new();
        for topic in self.topics() {
            let c = self.committed.get(topic).cloned().unwrap_or_default();
            let resume = Resume {
                committed: c.offset,
                ranges: c.ranges,
                claim: c.lineage.map_or(PriorClaim::None, PriorClaim::Lineage),
                generation: self.generation,
                applied: Vec::new(),
                hash_id: rill_topology::HASH_ID,
                end: None,
            };
            let start = engine.assign(topic, 0, resume).expect("assign");
            positions.insert(topic, start.unwrap_or(0));
        }
        assert!(engine
            .wait_restored(Duration::from_secs(30))
            .expect("restore"));
        Member {
            engine,
            process,
            generation: self.generation,
            positions,
            restored,
            committed_once: false,
        }
    }

    /// Dispatches up to `n` records of each topic from the member's positions, sub-topology by
    /// sub-topology, as far as a `read_committed` reader sees. A sub-topology of several topics
    /// takes first what an earlier member took, in that order, then new records in offset order:
    /// so a replay takes them in the first run's order (order-sensitive replays, issue 41 item
    /// 2, are refused under `at_least_once`, and not modelled).
    pub fn process(&self, m: &mut Member, n: usize) {
        for (g, group) in self.groups.iter().enumerate() {
            if !self.process_group(m, g, group, n) {
                return;
            }
        }
        assert!(m.engine.wait_idle(Duration::from_secs(30)), "engine hung");
    }

    /// [`Cluster::process`] of one sub-topology; `false` when the member died.
    fn process_group(&self, m: &mut Member, g: usize, group: &[&'static str], n: usize) -> bool {
        if let [topic] = group {
            let from = m.positions[topic];
            for (offset, record) in self
                .committed(topic)
                .into_iter()
                .filter(|(o, _)| *o >= from)
                .take(n)
            {
                if !self.dispatch(m, topic, offset, record) {
                    return false;
                }
            }
            return true;
        }
        let mut logs: Vec<BTreeMap<u64, RawRecord>> = group
            .iter()
            .map(|t| {
                let from = m.positions[t];
                self.committed(t)
                    .into_iter()
                    .filter(|(o, _)| *o >= from)
                    .collect()
            })
            .collect();
        // The last stable offset of each: no record at or past it may be taken yet.
        let stable: Vec<u64> = {
            let hidden = self.hidden.lock().unwrap();
            group
                .iter()
                .map(|t| {
                    hidden
                        .get(*t)
                        .and_then(|h| h.first().copied())
                        .unwrap_or(u64::MAX)
                })
                .collect()
        };
        let mut history = self.history.lock().unwrap();
        let history = history.entry(g).or_default();
        let mut budget = n.saturating_mul(group.len());
        let mut seen = vec![0u64; group.len()];
        for &(topic, offset) in history.iter() {
            let t = group
                .iter()
                .position(|g| *g == topic)
                .expect("a topic of the group");
            seen[t] = seen[t].max(offset + 1);
            if offset < m.positions[topic] {
                continue;
            }
            if budget == 0 || offset >= stable[t] {
                return true;
            }
            // Missing below the stable offset: an aborted transaction's record.
            if let Some(record) = logs[t].remove(&offset) {
                budget -= 1;
                if !self.dispatch(m, topic, offset, record) {
                    return false;
                }
            }
        }
        while budget > 0 {
            let next = (0..logs.len())
                .filter_map(|t| logs[t].range(seen[t]..).next().map(|(o, _)| (*o, t)))
                .min();
            let Some((offset, t)) = next else { break };
            let record = logs[t].remove(&offset).expect("found");
            seen[t] = offset + 1;
            history.push((group[t], offset));
            budget -= 1;
            if !self.dispatch(m, group[t], offset, record) {
                return false;
            }
        }
        true
    }

    /// Dispatches one record, waiting while the member is full; `false` when the member died.
    fn dispatch(
        &self,
        m: &mut Member,
        topic: &'static str,
        offset: u64,
        record: RawRecord,
    ) -> bool {
        let mut record = record;
        loop {
            match m.engine.dispatch(topic, 0, offset, record) {
                Ok(Dispatch::Full(back)) => {
                    record = back;
                    if !m.engine.wait_idle(Duration::from_secs(30)) || m.engine.failure().is_some()
                    {
                        return false;
                    }
                }
                Ok(_) => break,
                Err(_) => return false,
            }
        }
        m.positions.insert(topic, offset + 1);
        true
    }

    /// Range-commits (durably or not) and commits offsets unless the member is fenced; under
    /// `exactly_once_v2` a transaction commit. False when a transaction aborted (the member is
    /// halted).
    pub fn commit(&mut self, m: &mut Member, durable: bool) -> bool {
        let durable = if self.eos {
            if !self.transaction(m, Stop::Never) {
                return false;
            }
            true
        } else {
            if durable {
                m.engine.request_durable_commit();
            } else {
                m.engine.request_commit();
            }
            assert!(m.engine.wait_idle(Duration::from_secs(30)), "engine hung");
            let progress = m.engine.collect_progress();
            self.offset_commit(m, &progress);
            durable
        };
        if durable && m.engine.failure().is_none() && m.generation == self.generation {
            if !m.committed_once {
                // Its first commit repaired every leftover its restore read; the cleaner may now
                // reach that far, if nothing below was left unread (a zombie's write that every
                // restore skipped stays protected: the documented residual of engine::changelog).
                for (t, (start, end)) in &m.restored {
                    let c = self.compactable.entry(t.clone()).or_default();
                    if *start <= *c {
                        *c = (*c).max(*end);
                    }
                }
            }
            m.committed_once = true;
        }
        true
    }

    /// A transaction commit as `kafka::transaction` runs it, up to `stop`: seal every range,
    /// wait until they are ready, send the offsets (refused to an older generation: a zombie),
    /// commit, write the WriteBatches, resume. True when it completed; otherwise the member is
    /// halted, and its transaction aborted unless it committed.
    pub fn transaction(&mut self, m: &mut Member, stop: Stop) -> bool {
        assert!(m.engine.wait_idle(Duration::from_secs(30)), "engine hung");
        m.engine.seal_for_transaction();
        let deadline = Instant::now() + Duration::from_secs(30);
        let ready = loop {
            match m.engine.transaction_ready() {
                Ok(true) => break true,
                Ok(false) => {
                    assert!(Instant::now() < deadline, "the ranges did not seal");
                    std::thread::sleep(Duration::from_millis(1));
                }
                // A lost record (the process died) or a fenced task.
                Err(_) => break false,
            }
        };
        let fenced = m.generation != self.generation;
        if !ready || fenced || stop == Stop::BeforeCommit {
            assert!(
                m.engine.halt(Duration::from_secs(30)),
                "the ranges did not halt"
            );
            m.process.abort_transaction();
            return false;
        }
        let progress = m.engine.prepare_transaction();
        self.offset_commit(m, &progress);
        m.process.commit_transaction();
        if stop == Stop::BeforeWrite {
            assert!(
                m.engine.halt(Duration::from_secs(30)),
                "the ranges did not halt"
            );
            return false;
        }
        m.engine
            .finish_transaction()
            .expect("writing the committed transaction's state");
        m.engine.resume_after_transaction();
        true
    }

    /// The coordinator accepts offset commits of the current generation only.
    pub fn offset_commit(&mut self, m: &Member, progress: &[PartitionProgress]) {
        if m.generation != self.generation || m.engine.failure().is_some() {
            return;
        }
        for p in progress {
            let Some(topic) = self.topics().into_iter().find(|t| *t == p.topic) else {
                continue;
            };
            self.committed.insert(
                topic,
                Committed {
                    offset: Some(p.low_watermark),
                    ranges: p.ranges.clone(),
                    lineage: p.lineage,
                },
            );
        }
    }

    /// Compacts every changelog as far as the repairs allow.
    pub fn compact(&self, drop_tombstones: bool) {
        for s in self.spec.stores() {
            let t = changelog_topic(APP, s);
            let below = self.compactable.get(&t).copied().unwrap_or(0);
            // The cleaner stops at the last stable offset.
            let below = match self.hidden.lock().unwrap().get(&t).and_then(|h| h.first()) {
                Some(stable) => below.min(*stable),
                None => below,
            };
            self.log.compact(&t, 0, below, drop_tombstones);
        }
    }

    /// Processes everything there is and commits, until nothing moves.
    pub fn drain(&mut self, m: &mut Member) {
        let topics = self.topics();
        let ends = |log: &MemoryChangelog| -> Vec<u64> {
            topics.iter().map(|t| log_end(log, t)).collect()
        };
        loop {
            let before = ends(&self.log);
            self.process(m, usize::MAX);
            assert!(
                self.commit(m, true),
                "a commit of the current member failed"
            );
            let after = ends(&self.log);
            let caught_up = topics
                .iter()
                .zip(&after)
                .all(|(t, end)| m.positions[t] >= *end);
            if caught_up && before == after {
                return;
            }
        }
    }
}

/// The committed progress each range of `factor` will have once a member re-split the local
/// state of partition 0 to it (`rill::state::resplit`): its own when the state is already in
/// those ranges, else composed from the ranges that hold it; `None` for a range without any.
fn local_progress(
    db: &Arc<StateDb>,
    stores: &[String],
    factor: usize,
) -> Vec<Option<rill::state::Progress>> {
    let target = rill::topology::ranges(factor);
    // Opening would create missing column families (slow, and visible to the engine): look first.
    let mut existing: Vec<KeyRange> = db
        .column_families()
        .into_iter()
        .filter(|cf| cf.partition == 0 && stores.contains(&cf.store))
        .map(|cf| cf.range)
        .collect();
    existing.sort_by_key(|r| r.start);
    existing.dedup();
    let open = |r: KeyRange| {
        rill::state::SubTaskState::open(db.clone(), stores, 0, r)
            .expect("open state")
            .committed_progress()
            .cloned()
    };
    let parts: Vec<_> = existing
        .iter()
        .filter(|r| !target.contains(r))
        .filter_map(|r| open(*r).map(|p| (*r, p)))
        .collect();
    if parts.is_empty() {
        return target
            .into_iter()
            .map(|r| existing.contains(&r).then(|| open(r)).flatten())
            .collect();
    }
    let parts: Vec<_> = parts.iter().map(|(r, p)| (*r, p)).collect();
    target
        .into_iter()
        .map(|r| Some(rill::state::carry::compose(r, &parts)))
        .collect()
}

/// One step of a model run.
#[derive(Clone, Debug)]
pub enum Op {
    /// Append records (key index, value index; [`Spec::record`] says what they mean).
    Produce(Vec<(u8, u8)>),
    /// The member (or the zombie) dispatches up to n records of each input.
    Process { n: usize, zombie: bool },
    /// A range commit, periodic or durable, then an offset commit.
    Commit { durable: bool, zombie: bool },
    /// The member dies after writing `after` more records during a durable commit.
    Crash { after: u64, ghost: bool },
    /// A new member on dir `dir` (wiped first when `wipe`); the old one is revoked cleanly, or
    /// becomes a zombie that goes on until `EndZombie`.
    Handover {
        dir: usize,
        wipe: bool,
        zombie: bool,
    },
    /// The zombie learns it lost the partition.
    EndZombie,
    /// Log compaction, as far as the repairs allow.
    Compact { tombstones: bool },
    /// A live change of the member's parallelising factor; with `keep`, the configuration says
    /// so too (later members start with it), else they start with the configured one.
    ChangeFactor { factor: usize, keep: bool },
    /// A new configured factor, for the members started from now on.
    Configure(usize),
}

/// A random step.
pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec((0u8..6, 0u8..4), 1..12).prop_map(Op::Produce),
        6 => (1usize..20, any::<bool>()).prop_map(|(n, z)| Op::Process { n, zombie: z && n % 3 == 0 }),
        4 => (any::<bool>(), any::<bool>()).prop_map(|(durable, z)| Op::Commit { durable, zombie: z && durable }),
        2 => (0u64..12, any::<bool>()).prop_map(|(after, ghost)| Op::Crash { after, ghost }),
        2 => (0usize..3, any::<bool>(), any::<bool>()).prop_map(|(dir, wipe, zombie)| Op::Handover { dir, wipe, zombie }),
        1 => Just(Op::EndZombie),
        1 => any::<bool>().prop_map(|tombstones| Op::Compact { tombstones }),
        1 => (1usize..5, any::<bool>()).prop_map(|(factor, keep)| Op::ChangeFactor { factor, keep }),
        1 => (1usize..5).prop_map(Op::Configure),
    ]
}

/// What a check is given: the cluster and the member whose state to check, and which it is.
pub type Check<'a> = &'a dyn Fn(&Cluster<'_>, &Engine, &str) -> Result<(), TestCaseError>;

/// Runs `ops` on a cluster of `spec` starting at `factor`, appends `closing` (key, value index)
/// records, drains, and calls `check` on the last member and on a member restored from scratch.
pub fn run(
    spec: &Spec,
    factor: usize,
    ops: Vec<Op>,
    closing: &[(u8, u8)],
    check: Check<'_>,
) -> Result<(), TestCaseError> {
    let mut cluster = Cluster::new(spec, factor);
    let partitions: Vec<TopicPartition> = cluster
        .topics()
        .into_iter()
        .map(|t| TopicPartition::new(t, 0))
        .collect();
    let mut dir = 0usize;
    let mut member = Some(cluster.start(dir));
    let mut zombie: Option<(Member, usize)> = None;
    for op in ops {
        match op {
            Op::Produce(records) => {
                for (k, v) in records {
                    cluster.produce(k, v);
                }
            }
            Op::Process { n, zombie: z } => {
                let m = if z {
                    zombie.as_mut().map(|(m, _)| m)
                } else {
                    member.as_mut()
                };
                if let Some(m) = m {
                    cluster.process(m, n);
                }
            }
            Op::Commit { durable, zombie: z } => {
                if z {
                    let refused = zombie
                        .as_mut()
                        .is_some_and(|(m, _)| !cluster.commit(m, durable));
                    if refused {
                        // Fenced at the transaction: it rolls back and rejoins as a new
                        // member, which the model does not need.
                        end_zombie(&mut zombie, &partitions);
                    }
                } else if let Some(m) = member.as_mut() {
                    assert!(cluster.commit(m, durable), "the member's commit failed");
                }
            }
            Op::Crash { after, ghost } => {
                if cluster.eos {
                    // Its transaction timed out, so that the restore can read past it.
                    end_zombie(&mut zombie, &partitions);
                }
                if let Some(mut m) = member.take() {
                    m.process.ghost.store(ghost, Ordering::SeqCst);
                    m.process.budget.store(after, Ordering::SeqCst);
                    if cluster.eos {
                        // A crash while sealing aborts; a ghost crash, once every range is
                        // ready, lands after the commit and before the state write.
                        let stop = if ghost {
                            Stop::BeforeWrite
                        } else {
                            Stop::BeforeCommit
                        };
                        cluster.transaction(&mut m, stop);
                        m.process.abort_transaction();
                    } else {
                        m.engine.request_durable_commit();
                        m.engine.wait_idle(Duration::from_secs(30));
                    }
                    drop(m); // the process is gone; its dir keeps what it wrote
                }
                member = Some(cluster.start(dir));
            }
            Op::Handover {
                dir: next,
                wipe,
                zombie: z,
            } => {
                // A zombie's dir cannot be used by another member while it runs.
                let next = if zombie.as_ref().is_some_and(|(_, d)| *d == next) || next == dir {
                    (dir + 1..dir + 4)
                        .map(|d| d % 3)
                        .find(|d| zombie.as_ref().is_none_or(|(_, z)| z != d))
                        .unwrap_or(dir)
                } else {
                    next
                };
                if next == dir {
                    continue;
                }
                if cluster.eos {
                    end_zombie(&mut zombie, &partitions);
                }
                if let Some(mut old) = member.take() {
                    if z && zombie.is_none() {
                        zombie = Some((old, dir));
                    } else if cluster.eos {
                        // As `revoke_in_transaction`: commit everything, then close. The
                        // runtime keeps the ranges parked until they close; here they resume,
                        // so what they did since (a tick's releases) is rolled back.
                        assert!(cluster.commit(&mut old, true), "the revoke's commit failed");
                        assert!(old.engine.halt(Duration::from_secs(30)), "no halt");
                        old.process.abort_transaction();
                        old.engine
                            .revoke(&partitions, Duration::from_secs(30), true);
                    } else {
                        let revoked =
                            old.engine
                                .revoke(&partitions, Duration::from_secs(30), false);
                        cluster.offset_commit(&old, &revoked.progress);
                    }
                }
                if wipe {
                    cluster.wipe(next);
                }
                dir = next;
                member = Some(cluster.start(dir));
            }
            Op::EndZombie => end_zombie(&mut zombie, &partitions),
            Op::Compact { tombstones } => cluster.compact(tombstones),
            Op::ChangeFactor { factor, keep } => {
                // `exactly_once_v2` refuses live changes (`kafka::elastic`): restarts only.
                if let Some(m) = member.as_mut().filter(|_| !cluster.eos) {
                    if m.engine.failure().is_none() {
                        m.engine
                            .set_parallelising_factor(factor, None, Duration::from_secs(30))
                            .map_err(|e| TestCaseError::fail(format!("factor change: {e}")))?;
                    }
                }
                if keep {
                    cluster.factor = factor;
                }
            }
            Op::Configure(factor) => cluster.factor = factor,
        }
    }
    end_zombie(&mut zombie, &partitions);
    for &(k, v) in closing {
        cluster.produce(k, v);
    }
    let mut last = member.take().expect("a member");
    cluster.drain(&mut last);
    assert!(
        cluster
            .hidden
            .lock()
            .unwrap()
            .values()
            .all(BTreeSet::is_empty),
        "a transaction is still open after the drain"
    );
    check(&cluster, &last.engine, "the last member")?;
    drop(last);
    // A member restored from scratch (compacted as far as allowed) agrees.
    cluster.compact(true);
    if std::env::var("PROPTEST_DEBUG_LOG").is_ok() {
        for s in spec.stores() {
            let t = changelog_topic(APP, s);
            eprintln!(
                "== {t} (compactable below {:?})",
                cluster.compactable.get(&t)
            );
            for (o, r) in cluster.log.records(&t, 0) {
                let h: Vec<String> = r
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{k}={}",
                            v.map(|v| v.iter().map(|b| format!("{b:02x}")).collect::<String>())
                                .unwrap_or_default()
                        )
                    })
                    .collect();
                eprintln!(
                    "{o}: {:?} = {:?} {}",
                    r.key.as_deref().map(String::from_utf8_lossy),
                    r.value.as_deref().map(|v| v.len()),
                    h.join(" ")
                );
            }
        }
    }
    let fresh = (dir + 1) % 3;
    cluster.wipe(fresh);
    let mut restored = cluster.start(fresh);
    cluster.drain(&mut restored);
    check(&cluster, &restored.engine, "a member restored from scratch")
}

/// The zombie learns it lost the partition; its open transaction aborts.
fn end_zombie(zombie: &mut Option<(Member, usize)>, partitions: &[TopicPartition]) {
    if let Some((mut z, _)) = zombie.take() {
        if z.process.txn.is_some() {
            assert!(
                z.engine.halt(Duration::from_secs(30)),
                "the zombie did not halt"
            );
            z.process.abort_transaction();
        }
        z.engine.revoke(partitions, Duration::from_secs(30), true);
    }
}

/// The cluster after `input` was produced and processed by one member at P = 1 without a
/// crash, a rebalance or a factor change: the sequential run a model compares with.
/// It runs under `at_least_once` whatever the spec says.
pub fn uninterrupted<'s>(spec: &'s Spec, input: &[(String, String, i64)]) -> (Cluster<'s>, Member) {
    let mut cluster = Cluster::new(spec, 1);
    cluster.eos = false;
    for (k, v, t) in input {
        cluster.append(k.clone(), v.clone(), *t);
    }
    let mut member = cluster.start(0);
    cluster.drain(&mut member);
    (cluster, member)
}
