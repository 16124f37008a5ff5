//! The rebalance protocol: what the consumer-group member does when partitions are assigned,
//! revoked or lost.
//!
//! - **Assign**: for each new partition, read its committed offset and raw commit metadata (range
//!   offsets and the lineage that committed last), hand them to the engine with the group
//!   generation, and start fetching where the engine says. A task starts only when the same
//!   partition of every input topic of its sub-topology is assigned here (co-partitioning; see
//!   `engine::task`); until then, and while it restores, its partitions stay paused.
//! - **Revoke**: the revoked tasks drain their mailboxes and range-commit, all within one
//!   `shutdown.timeout.ms`, then their progress is committed synchronously, before librdkafka
//!   gives the partitions away. A task that does not drain in time is fenced: it commits nothing
//!   after this callback returns. Other partitions keep their sub-tasks.
//! - **Lost** (`assignment_lost`: the member was fenced out of the group, for example after a
//!   pause longer than the session timeout): another member may own the partitions already, so
//!   their tasks are fenced at once and nothing of them is committed, not even offsets.
//!
//! All of it runs inside `poll`, on the source loop's thread, so the engine lock is free.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use rill_topology::HASH_ID;

use super::committer::Committer;
use super::metadata;
use super::streams_member::StreamsMember;
use super::transaction::Transactions;
use crate::engine::{partition_list, Engine, PriorClaim, Resume, TopicPartition};

/// Time allowed for metadata and committed-offset requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the source loop shares with the rebalance callbacks.
pub struct SourceContext {
    /// Invariant: the loop never holds this lock across `poll`, where callbacks take it.
    pub engine: Arc<Mutex<Engine>>,
    /// Bound on draining revoked partitions.
    pub drain_timeout: Duration,
    /// Offset commits and what was committed last.
    pub committer: Committer,
    /// Set when a callback hit an error the loop must stop on.
    pub error: Mutex<Option<String>>,
    /// Records a partition may park beyond its full mailboxes before the loop stops polling.
    pub held_limit: usize,
    /// Rebalances seen.
    pub rebalances: std::sync::atomic::AtomicU64,
    /// Partitions paused until their task runs (restoring, or waiting for its other inputs); the
    /// loop resumes each once it runs. Invariant: an entry here is paused in the consumer and
    /// assigned. Taken after `engine` when both are held.
    pub restoring: Mutex<BTreeSet<TopicPartition>>,
    /// Readiness: assigned, and no task restoring.
    pub health: Arc<crate::health::Health>,
    /// How long the loop runs with no broker connection up before it stops (`None`: for ever).
    pub unavailable_timeout: Option<Duration>,
    /// The last high watermark librdkafka's statistics gave per partition (for range lag).
    /// Taken after `engine` when both are held.
    pub high_watermarks: Mutex<HashMap<TopicPartition, u64>>,
    /// Under `exactly_once_v2`: the instance's transactions (commits go through them instead
    /// of `committer`).
    pub transactions: Option<Arc<Transactions>>,
    /// Under `exactly_once_v2`: set by a callback whose partitions were lost or whose commit
    /// failed; the loop then aborts the transaction and every task rolls back.
    pub roll_back: Mutex<Option<String>>,
    /// Records of tasks with several inputs, waiting for their turn in timestamp order. Only the
    /// loop's thread takes it (callbacks run inside `poll`); never held across `poll`.
    pub time_sync: Mutex<super::time_sync::TimeSync>,
    /// Gives the consumer its `bootstrap.servers` back when it forgot every broker.
    pub brokers: super::broker_watch::BrokerWatch,
    /// Under `group.protocol=streams`: the membership (the consumer is assigned manually, and
    /// no callback runs; see [`SourceContext::streams_turn`]). Never held across a call into
    /// this context's other methods: `committer` takes it to commit.
    pub streams: Option<Arc<Mutex<StreamsMember>>>,
    /// Interactive queries are on: a task another member ran before answers them once it has
    /// taken its input up to the end offset read at assignment (`engine::task::CatchUp`).
    pub queries_catch_up: bool,
}

/// How long a streams group member may go without a heartbeat answer before it counts its tasks
/// as lost: the broker's default `group.streams.session.timeout.ms`.
const STREAMS_SESSION: Duration = Duration::from_secs(45);

impl ClientContext for SourceContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        super::client_log::forward(level, fac, log_message);
    }

    /// librdkafka's statistics (every `statistics.interval.ms`, served by `poll` on the loop's
    /// thread): sets `rill_consumer_lag_records` from each partition's `consumer_lag`, keeps
    /// the high watermarks for `rill_range_lag_records`, and sets readiness from whether any
    /// broker connection is up (logged when that changes).
    fn stats(&self, statistics: rdkafka::Statistics) {
        let high = crate::metrics::set_lag_from_statistics(&statistics);
        self.high_watermarks.lock().extend(high);
        self.brokers.check(&statistics);
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        if self.health.set_brokers_reachable(up) {
            if up {
                tracing::info!("a broker connection is up again: ready");
            } else {
                let brokers: Vec<String> = statistics
                    .brokers
                    .values()
                    .map(|b| format!("{} {}", b.name, b.state))
                    .collect();
                tracing::warn!(brokers = %brokers.join(", "), "no broker connection is up: not ready until one is (processing resumes by itself)");
            }
        }
    }
}

impl ConsumerContext for SourceContext {
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        _offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            // Forget what we think is committed, so the next interval commits again.
            tracing::debug!(error = %e, "async offset commit failed; retrying next interval");
            crate::metrics::record_error("offset_commit");
            self.committer.forget();
        }
    }

    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        // Revoking waits for sub-tasks: records of the poll burst must have their jobs first.
        crate::engine::Burst::release();
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        self.health.set_rebalancing(true);
        crate::metrics::record_rebalance();
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let listed: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| TopicPartition::new(e.topic(), e.partition() as u32))
            .collect();
        tracing::info!(event = ?err, partitions = %partition_list(&listed), cooperative, "rebalance");
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self
                .on_assign(consumer, tpl)
                .and_then(|()| {
                    if cooperative {
                        consumer.incremental_assign(tpl)
                    } else {
                        consumer.assign(tpl)
                    }
                })
                .and_then(|()| self.pause_waiting(consumer, tpl)),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.on_revoke(consumer, tpl, consumer.assignment_lost());
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(error = ?other, "rebalance error");
                if cooperative {
                    Ok(())
                } else {
                    consumer.unassign()
                }
            }
        };
        match result {
            Err(e) => {
                tracing::error!(error = %e, "rebalance failed");
                crate::metrics::record_error("rebalance");
                *self.error.lock() = Some(format!("rebalance failed: {e}"));
            }
            // Ready once assigned; a changelog restore holds readiness back through `health`.
            Ok(()) if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.health.set_assigned();
                if cooperative {
                    // librdkafka resumed the partitions it paused around the rebalance in
                    // `incremental_assign`. (Not `consumer.assignment()`: inside a callback
                    // of a closing consumer it waits for ever.)
                    let kept = self.engine.lock().assigned_partitions();
                    wake_fetchers(consumer, &kept);
                }
            }
            Ok(()) => {}
        }
        self.health.set_rebalancing(false);
    }
}

/// Partitions whose leaders get a wake-up request (see [`wake_fetchers`]).
const WAKE_AT_MOST: usize = 8;

/// How long a wake-up request may take (the broker answers it from memory).
const WAKE_TIMEOUT: Duration = Duration::from_millis(500);

/// Makes the fetchers of `partitions`, just resumed, fetch at once. librdkafka resumes a
/// partition (its own pause around a cooperative rebalance callback, or the application's)
/// from its main thread without waking the leader's broker thread; when that thread has
/// nothing else to fetch it sleeps through its idle wait of up to 1 s first: partitions kept
/// through a rebalance stalled ~0.5 s. A request to a partition's leader (its watermarks)
/// wakes that leader's broker thread; of many partitions, the first few are asked.
pub fn wake_fetchers<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[TopicPartition],
) {
    for tp in partitions.iter().take(WAKE_AT_MOST) {
        // Only the wake-up matters; a failure just leaves the idle wait.
        let _ = consumer.fetch_watermarks(&tp.topic, tp.partition as i32, WAKE_TIMEOUT);
    }
}

/// How long an assignment waits for its committed offsets while the brokers do not answer
/// (inside the callback: librdkafka heartbeats meanwhile, bounded by `max.poll.interval.ms`).
const COMMITTED_OFFSETS_PATIENCE: Duration = Duration::from_secs(120);

/// The committed offsets and metadata of `tpl`, retried while the brokers do not answer (a broker
/// that pauses during an assignment must not stop the runtime).
fn committed_offsets(
    consumer: &BaseConsumer<SourceContext>,
    tpl: &TopicPartitionList,
) -> Result<TopicPartitionList, KafkaError> {
    let started = Instant::now();
    loop {
        match consumer.committed_offsets(tpl.clone(), REQUEST_TIMEOUT) {
            Ok(c) => return Ok(c),
            Err(e) if started.elapsed() < COMMITTED_OFFSETS_PATIENCE => {
                tracing::warn!(error = %e, "reading the committed offsets of an assignment failed (retrying)");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The consumer-group generation (the member epoch with `group.protocol=consumer`) this member
/// is in now; 0 when unknown.
pub fn group_generation<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> i32 {
    use rdkafka::bindings as rd;
    // SAFETY: the handle is valid for the consumer's life; librdkafka returns an owned copy of
    // the group metadata (or null), which is destroyed right after reading it.
    unsafe {
        let md = rd::rd_kafka_consumer_group_metadata(consumer.client().native_ptr());
        if md.is_null() {
            return 0;
        }
        let generation = rd::rd_kafka_consumer_group_metadata_generation_id(md);
        rd::rd_kafka_consumer_group_metadata_destroy(md);
        generation
    }
}

/// The metadata bytes of every element of `tpl`, in element order. rdkafka's own accessor
/// panics on metadata that is not UTF-8, which any other client of the group may have written.
pub fn raw_metadata(tpl: &TopicPartitionList) -> Vec<Vec<u8>> {
    // SAFETY: `tpl.ptr()` is a valid list for the borrow; `cnt` elements follow `elems`, and
    // each element's metadata pointer is null or points at `metadata_size` bytes it owns.
    unsafe {
        let list = &*tpl.ptr();
        (0..usize::try_from(list.cnt).unwrap_or(0))
            .map(|i| {
                let e = &*list.elems.add(i);
                if e.metadata.is_null() || e.metadata_size == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(e.metadata as *const u8, e.metadata_size).to_vec()
                }
            })
            .collect()
    }
}

impl SourceContext {
    /// Under `group.protocol=streams`: heartbeats when due and applies what the broker's
    /// assignment changed, as the rebalance callback does under the other protocols: revoked
    /// partitions drain and commit (or, lost, are dropped), then new ones are assigned.
    pub fn streams_turn(&self, consumer: &BaseConsumer<Self>) -> Result<(), String> {
        let Some(member) = &self.streams else {
            return Ok(());
        };
        let change = member.lock().turn(STREAMS_SESSION);
        let change = match change {
            Ok(Some(change)) => change,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        crate::engine::Burst::release();
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        self.health.set_rebalancing(true);
        crate::metrics::record_rebalance();
        tracing::info!(revoke = %partition_list(&change.revoke), assign = %partition_list(&change.assign), lost = change.lost, "streams group assignment");
        let result = (|| {
            if !change.revoke.is_empty() {
                let tpl = partitions_to_list(&change.revoke);
                self.on_revoke(consumer, &tpl, change.lost);
                consumer.incremental_unassign(&tpl)?;
            }
            if !change.assign.is_empty() {
                let mut tpl = partitions_to_list(&change.assign);
                self.on_assign(consumer, &mut tpl)?;
                consumer.incremental_assign(&tpl)?;
                self.pause_waiting(consumer, &tpl)?;
                self.health.set_assigned();
            }
            Ok::<(), KafkaError>(())
        })();
        self.health.set_rebalancing(false);
        result.map_err(|e| format!("applying the streams group's assignment: {e}"))
    }

    /// Under `group.protocol=streams`: revokes every partition (draining and committing) and
    /// leaves the group, so the broker hands the tasks to the other members at once.
    pub fn leave_streams_group(&self, consumer: &BaseConsumer<Self>) {
        let Some(member) = &self.streams else {
            return;
        };
        let all = self.engine.lock().assigned_partitions();
        if !all.is_empty() {
            let tpl = partitions_to_list(&all);
            self.on_revoke(consumer, &tpl, false);
            if let Err(e) = consumer.incremental_unassign(&tpl) {
                tracing::debug!(error = %e, "unassigning on leave");
            }
        }
        member.lock().leave();
    }

    /// Under `exactly_once_v2`: commits the instance's transaction (every task's work, not only
    /// the revoked ones', as Kafka Streams does), then closes the revoked tasks. Lost partitions,
    /// or a commit that fails, make the loop roll every task back.
    fn revoke_in_transaction(
        &self,
        consumer: &BaseConsumer<Self>,
        tx: &Transactions,
        revoked: &[TopicPartition],
        lost: bool,
        started: Instant,
    ) {
        let committed = if lost {
            *self.roll_back.lock() = Some("partitions were lost".into());
            false
        } else {
            match tx.commit(
                &self.engine,
                consumer,
                &self.committer,
                false,
                true,
                self.drain_timeout,
            ) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "the transaction did not commit during a revoke");
                    *self.roll_back.lock() = Some(e.to_string());
                    false
                }
            }
        };
        let mut engine = self.engine.lock();
        // Closed without committing more: what they did is in the committed transaction.
        engine.revoke(revoked, self.drain_timeout, true);
        engine.resume_after_transaction();
        drop(engine);
        let committed_ms = started.elapsed().as_millis() as u64;
        for tp in revoked {
            tracing::debug!(topic = %tp.topic, partition = tp.partition, committed_ms, committed, lost, "partition revoked");
        }
    }

    fn on_assign(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &mut TopicPartitionList,
    ) -> Result<(), KafkaError> {
        if tpl.count() == 0 {
            return Ok(());
        }
        let committed = committed_offsets(consumer, tpl)?;
        let raw = raw_metadata(&committed);
        let generation = match &self.streams {
            Some(member) => member.lock().epoch(),
            None => group_generation(consumer),
        };
        let mut resumes = Vec::new();
        for (e, meta) in committed.elements().iter().zip(raw) {
            let (topic, partition) = (e.topic().to_string(), e.partition() as u32);
            let base = match e.offset() {
                Offset::Offset(o) if o >= 0 => Some(o as u64),
                _ => None,
            };
            let mut resume = Resume {
                committed: base,
                generation,
                claim: PriorClaim::None,
                ranges: Vec::new(),
                applied: Vec::new(),
                hash_id: HASH_ID,
                end: None,
            };
            // Whether the last owner may have processed past its commit (it did not hand over).
            let mut unfinished = false;
            if let Some(base) = base {
                match std::str::from_utf8(&meta)
                    .map_err(|_| metadata::MetadataError::NotRill)
                    .and_then(|text| metadata::decode(text, base))
                {
                    Ok(m) => {
                        resume.hash_id = m.hash_id;
                        resume.applied = m.ranges.iter().map(|(r, _)| *r).zip(m.applied).collect();
                        resume.ranges = m.ranges;
                        if let Some(l) = m.lineage {
                            resume.claim = PriorClaim::Lineage(l);
                            unfinished = !m.handed_over;
                        }
                    }
                    Err(err) => {
                        if !meta.is_empty() {
                            tracing::warn!(%topic, partition, error = %err, "ignoring commit metadata");
                        }
                    }
                }
            }
            resumes.push((topic, partition, base, resume, unfinished));
        }
        if self.queries_catch_up {
            let unfinished: Vec<(&str, u32)> = resumes
                .iter()
                .filter(|r| r.4)
                .map(|r| (r.0.as_str(), r.1))
                .collect();
            let ends = end_offsets(consumer, &unfinished);
            for (topic, partition, _, resume, _) in &mut resumes {
                resume.end = ends.get(&(topic.clone(), *partition)).copied();
            }
        }
        let mut engine = self.engine.lock();
        for (topic, partition, base, resume, _) in resumes {
            let end = resume.end;
            let start = match engine.assign(&topic, partition, resume) {
                Ok(start) => start,
                Err(err) => {
                    *self.error.lock() = Some(format!("assigning {topic}-{partition}: {err}"));
                    return Err(KafkaError::Subscription(err.to_string()));
                }
            };
            tracing::debug!(%topic, partition, committed = ?base, start = ?start, ?end, generation, "partition assigned");
            let offset = start.map_or(Offset::Beginning, |o| Offset::Offset(o as i64));
            tpl.set_partition_offset(&topic, partition as i32, offset)?;
        }
        Ok(())
    }

    /// Pauses the newly assigned partitions whose task does not run yet (it restores, or waits
    /// for the partitions of its other inputs), until it does.
    fn pause_waiting(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        let engine = self.engine.lock();
        let mut pause = TopicPartitionList::new();
        let mut restoring = self.restoring.lock();
        for e in tpl.elements() {
            if engine.is_restoring(e.topic(), e.partition() as u32) {
                pause.add_partition(e.topic(), e.partition());
                if restoring.insert(TopicPartition::new(e.topic(), e.partition() as u32)) {
                    self.health.restore_started();
                }
            }
        }
        if pause.count() > 0 {
            let paused: Vec<TopicPartition> = pause
                .elements()
                .iter()
                .map(|e| TopicPartition::new(e.topic(), e.partition() as u32))
                .collect();
            tracing::info!(
                partitions = %partition_list(&paused),
                "restoring state (or waiting for co-partitioned inputs) before processing"
            );
            consumer.pause(&pause)?;
        }
        Ok(())
    }

    /// Closes every task without committing: the consumer hit a fatal error (the broker fenced
    /// it), so the whole assignment is gone and another member may own it already.
    pub fn lose_assignment(&self) {
        let all = self.engine.lock().assigned_partitions();
        self.forget_restoring(&all);
        self.engine.lock().revoke(&all, self.drain_timeout, true);
        if !all.is_empty() {
            tracing::warn!(partitions = ?all, "partitions lost with the fatal consumer: nothing of them is committed");
        }
    }

    /// Drops `partitions` from the restoring set (readiness waits for it no longer).
    fn forget_restoring(&self, partitions: &[TopicPartition]) {
        let mut restoring = self.restoring.lock();
        for key in partitions {
            if restoring.remove(key) {
                self.health.restore_finished();
            }
        }
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList, lost: bool) {
        let revoked: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| TopicPartition::new(e.topic(), e.partition() as u32))
            .collect();
        self.forget_restoring(&revoked);
        // Never dispatched: the next owner reads them from the committed offsets.
        self.time_sync.lock().forget(&revoked);
        let started = Instant::now();
        if let Some(tx) = &self.transactions {
            self.revoke_in_transaction(consumer, tx, &revoked, lost, started);
            return;
        }
        let outcome = self
            .engine
            .lock()
            .revoke(&revoked, self.drain_timeout, lost);
        if !outcome.drained {
            tracing::warn!(partitions = ?revoked, "revoked partitions did not drain in time: fenced, the rest is replayed by the next owner");
        }
        let drained_ms = started.elapsed().as_millis() as u64;
        if lost {
            tracing::warn!(partitions = ?revoked, "partitions lost (this member was fenced out of the group): nothing of them is committed");
        } else {
            self.committer
                .commit_sync(consumer, &outcome.progress, outcome.drained);
        }
        let committed_ms = started.elapsed().as_millis() as u64;
        for tp in &revoked {
            tracing::debug!(topic = %tp.topic, partition = tp.partition, drained_ms, committed_ms, lost, "partition revoked");
        }
    }
}

/// How long an assignment waits for the inputs' end offsets (interactive queries on).
const END_OFFSETS_TIMEOUT: Duration = Duration::from_secs(5);

/// librdkafka's list of `tps` (no offsets).
fn partitions_to_list(tps: &[TopicPartition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for tp in tps {
        tpl.add_partition(&tp.topic, tp.partition as i32);
    }
    tpl
}

/// The end offset of each of `partitions`, in one request; empty, with a warning, when the
/// broker does not answer (queries of those tasks are then answered as soon as they run).
fn end_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[(&str, u32)],
) -> HashMap<(String, u32), u64> {
    let mut ask = TopicPartitionList::new();
    for (topic, partition) in partitions {
        // A timestamp of -1 asks for the end (librdkafka's `offsets_for_times`).
        let _ = ask.add_partition_offset(topic, *partition as i32, Offset::End);
    }
    if ask.count() == 0 {
        return HashMap::new();
    }
    match consumer.offsets_for_times(ask, END_OFFSETS_TIMEOUT) {
        Ok(ends) => ends
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) if o >= 0 => {
                    Some(((e.topic().to_string(), e.partition() as u32), o as u64))
                }
                _ => None,
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the inputs' end offsets: queries of the assigned tasks are answered without waiting for them to catch up");
            HashMap::new()
        }
    }
}
