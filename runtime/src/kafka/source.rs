//! The Kafka source loop: a consumer-group member that feeds the engine.
//!
//! Each turn of the loop: stop on a signal or a callback's error; start the tasks whose restore
//! finished (committing their lineage before they process, see below); offer parked records again
//! ([`super::backpressure`]); poll a record and dispatch it, with what else librdkafka already
//! holds (at most `BURST` records, as one [`Burst`]: at a low rate, quick sub-tasks run the
//! burst's records on this thread); fire due wall-clock punctuations;
//! and on the commit interval, ask every range to commit and commit the partitions' progress
//! ([`super::committer`]). Rebalances run inside `poll` ([`super::rebalance`]).
//!
//! A task that finished restoring commits its partitions' offsets **synchronously with its new
//! lineage** before it processes: the coordinator fences offset commits, so once that commit
//! succeeded, the next owner of the partition knows whose local state it may trust.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rill_topology::{Headers, RawRecord};

use super::backpressure::{single, Backpressure};
use super::elastic::LiveFactor;
use super::rebalance::SourceContext;
use super::time_sync::{Admitted, Downstream, Fetched};
use super::transaction::TransactionError;
use crate::auto_factor::AutoFactor;
use crate::elastic::FactorRequest;
use crate::engine::{Burst, EngineError, TopicPartition, HERE_MAX};
use crate::queue_time::QueueTimes;

/// How long a task may wait for the partitions of its other input topics before the source stops
/// with an error (they were assigned to another member: the assignor does not co-partition).
pub const CO_PARTITION_WAIT: Duration = Duration::from_secs(30);

/// Finest interval at which wall-clock punctuations are fired.
const WALL_CLOCK_TICK: Duration = Duration::from_millis(10);

/// Most records one turn of the loop takes from librdkafka's queue without waiting.
const BURST: usize = 64;

/// Converts a consumed message into the engine's raw record.
pub fn raw_record(m: &BorrowedMessage<'_>) -> RawRecord {
    let mut headers = Headers::new();
    if let Some(hs) = m.headers() {
        headers = Headers::with_capacity(hs.count());
        for h in hs.iter() {
            match h.value {
                Some(v) => headers.add(h.key, v),
                None => headers.add_null(h.key),
            };
        }
    }
    RawRecord {
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        timestamp: m.timestamp().to_millis().unwrap_or(0),
        headers,
    }
}

/// Why the source loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The engine failed (a processor, a deserialization under `fail`, state).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Under `exactly_once_v2`: the instance's transaction did not commit.
    #[error(transparent)]
    Transaction(TransactionError),
    /// Kafka failed in a way that cannot be retried.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A rebalance callback failed.
    #[error("{0}")]
    Rebalance(String),
    /// The consumer hit a fatal error and never fetches again (librdkafka raises one when the
    /// broker fences this static member: another member joined with its `group.instance.id`).
    #[error("the consumer hit a fatal error ({code:?}: {reason}); if another instance runs with the same kafka.group.instance.id, give each instance its own")]
    Fatal {
        /// librdkafka's error code (`FencedInstanceId` for a fenced static member).
        code: RDKafkaErrorCode,
        /// librdkafka's description.
        reason: String,
    },
    /// No broker connection was up for longer than `brokers.unavailable.timeout.ms`.
    #[error("no broker connection has been up for {:.0} s, longer than brokers.unavailable.timeout.ms ({} ms): check that the brokers run and are reachable at bootstrap.servers; what was committed before the outage stays, so a restart resumes exactly", .down.as_secs_f64(), .bound.as_millis())]
    BrokersUnavailable {
        /// How long no connection was up.
        down: Duration,
        /// The bound.
        bound: Duration,
    },
    /// Another instance's uncaught-error handler asked every instance of the application to
    /// stop (`UncaughtErrorResponse::ShutdownApplication`); this one committed and left.
    #[error("instance {by} asked every instance of the application to stop after an error: {error}; fix that error, then start the instances again")]
    ApplicationShutdown {
        /// The instance that asked.
        by: String,
        /// Its error.
        error: String,
    },
    /// A task's input partitions were not all assigned to this member.
    #[error("partition {partition} of {missing:?} is not assigned to this member although partition {partition} of {assigned:?} is: one sub-topology reads them together, so they must be assigned together (co-partitioning); rill asks for the `range` assignor for such topologies, so check `kafka.partition.assignment.strategy` / `kafka.group.remote.assignor` and that the topics have the same partition count")]
    NotCoPartitioned {
        /// The partition.
        partition: u32,
        /// Topics whose partition is assigned here.
        assigned: Vec<String>,
        /// Topics whose partition is not.
        missing: Vec<String>,
    },
}

/// Polls, dispatches and commits until `stop` is set or an error occurs; then drains, commits and
/// returns.
pub fn run(
    consumer: &BaseConsumer<SourceContext>,
    stop: &AtomicBool,
    commit_interval: Duration,
    factor_requests: Receiver<FactorRequest>,
    mut auto_factor: Option<&mut AutoFactor>,
) -> Result<(), SourceError> {
    let ctx = consumer.context().clone();
    let mut live_factor = LiveFactor::new(factor_requests);
    let mut backpressure = Backpressure::new(ctx.held_limit);
    let mut last_commit = Instant::now();
    let mut last_wall_clock = Instant::now();
    let mut last_error_log = Instant::now() - Duration::from_secs(60);
    let mut queue_times = QueueTimes::default();
    // When the statistics first showed no broker connection up (for `unavailable_timeout`).
    let mut unreachable_since: Option<Instant> = None;
    let result = loop {
        if stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        if let Some(e) = ctx.error.lock().take() {
            break Err(SourceError::Rebalance(e));
        }
        if consumer.assignment_lost() {
            // Fenced out of the group: stop committing at once, before the revoke arrives.
            ctx.engine.lock().fence_all();
            if ctx.transactions.is_some() && !ctx.engine.lock().assigned_partitions().is_empty() {
                // The open transaction holds the lost tasks' outputs: it must not commit.
                break Err(roll_back(&ctx, "this member lost its partitions"));
            }
        }
        if let Some(why) = ctx.roll_back.lock().take() {
            break Err(roll_back(&ctx, &why));
        }
        if let Some((code, reason)) = consumer.client().fatal_error() {
            // This consumer is dead and its partitions may be another member's already.
            ctx.engine.lock().fence_all();
            break Err(SourceError::Fatal { code, reason });
        }
        if let Err(e) = ctx.streams_turn(consumer) {
            break Err(SourceError::Rebalance(e));
        }
        if let Err(e) = start_restored(consumer, &ctx) {
            break Err(e);
        }
        if let Err(e) = live_factor.turn(consumer, &ctx) {
            break Err(e);
        }
        if let Some(auto) = auto_factor.as_deref_mut() {
            auto.turn(&ctx.engine.lock());
        }
        if queue_times.due() {
            queue_times.publish(&ctx.engine.lock());
        }
        if let Err(e) = backpressure.retry(consumer, &ctx) {
            break Err(e.into());
        }
        let queue_limit = ctx.engine.lock().queue_limit();
        let poll = match backpressure.may_poll(consumer, queue_limit) {
            Ok(p) => p,
            Err(e) => break Err(e.into()),
        };
        match if poll {
            consumer.poll(backpressure.poll_timeout())
        } else {
            None
        } {
            None => {}
            // A broker that goes away is retried by librdkafka; say so, but not on every poll.
            Some(Err(e)) if last_error_log.elapsed() > Duration::from_secs(5) => {
                tracing::warn!(error = %e, "consumer error (retrying)");
                crate::metrics::record_error("consumer");
                last_error_log = Instant::now();
            }
            Some(Err(_)) => crate::metrics::record_error("consumer"),
            Some(Ok(m)) => {
                // Take what librdkafka already holds in one burst: the records' sub-tasks are
                // woken once at its end, not once per record.
                let burst = Burst::begin();
                let mut next = Some(m);
                let mut taken = 0;
                let mut failed = None;
                while let Some(m) = next.take() {
                    if let Err(e) = take(consumer, &ctx, &mut backpressure, m) {
                        failed = Some(e);
                        break;
                    }
                    taken += 1;
                    if taken < BURST && backpressure.is_clear() {
                        next = match consumer.poll(Duration::ZERO) {
                            Some(Ok(m)) => Some(m),
                            Some(Err(_)) => {
                                crate::metrics::record_error("consumer");
                                None
                            }
                            None => None,
                        };
                    }
                }
                if let Some(e) = failed {
                    break Err(e);
                }
                burst.end(taken <= HERE_MAX);
            }
        }
        if let Err(e) = release_synced(consumer, &ctx, &mut backpressure) {
            break Err(e);
        }
        backpressure.wake_resumed(consumer);
        // The interval is read first: a guard in the `if let` would live through the block.
        let wall_clock = ctx.engine.lock().wall_clock_interval();
        if let Some(every) = wall_clock {
            if last_wall_clock.elapsed() >= every.clamp(WALL_CLOCK_TICK, commit_interval) {
                last_wall_clock = Instant::now();
                ctx.engine.lock().punctuate_wall_clock(wall_clock_ms());
            }
        }
        if last_commit.elapsed() >= commit_interval {
            last_commit = Instant::now();
            if ctx.health.brokers_reachable() {
                unreachable_since = None;
            } else {
                let since = *unreachable_since.get_or_insert(last_commit);
                if let Some(bound) = ctx.unavailable_timeout.filter(|b| since.elapsed() > *b) {
                    // No commit can complete without a broker: fenced and abandoned, the waits
                    // for acknowledgements and for room in the producer's queue end at once,
                    // and the records replay after a restart.
                    let engine = ctx.engine.lock();
                    engine.fence_all();
                    engine.abandon();
                    drop(engine);
                    break Err(SourceError::BrokersUnavailable {
                        down: since.elapsed(),
                        bound,
                    });
                }
            }
            {
                let engine = ctx.engine.lock();
                if let Some(e) = engine.failure() {
                    break Err(SourceError::Engine(EngineError::Stopped(e)));
                }
                if let Some((partition, assigned, missing)) = engine
                    .incomplete_tasks(CO_PARTITION_WAIT)
                    .into_iter()
                    .next()
                {
                    break Err(SourceError::NotCoPartitioned {
                        partition,
                        assigned,
                        missing,
                    });
                }
                engine.publish_metrics(&ctx.high_watermarks.lock());
            }
            if let Some(tx) = &ctx.transactions {
                match tx.commit(
                    &ctx.engine,
                    consumer,
                    &ctx.committer,
                    true,
                    false,
                    ctx.drain_timeout,
                ) {
                    Ok(_) => continue,
                    // An engine stopped by a failed transaction rolls back (see below).
                    Err(TransactionError::Engine(e)) => break Err(SourceError::Engine(e)),
                    Err(e) => break Err(SourceError::Transaction(e)),
                }
            }
            let mut progress = {
                let mut engine = ctx.engine.lock();
                engine.request_commit();
                engine.collect_progress()
            };
            ctx.committer.past_unreturned(consumer, &mut progress);
            if let Err(e) = ctx.committer.commit(consumer, &progress, CommitMode::Async) {
                tracing::warn!(error = %e, "offset commit failed (will retry)");
                crate::metrics::record_error("offset_commit");
            }
        }
    };
    // Under exactly_once_v2 a record refused because the open transaction failed stops the
    // engine; what that needs is an abort and a rollback, not a stop.
    let result = match result {
        Err(SourceError::Engine(e)) if ctx.transactions.as_ref().is_some_and(|t| t.failed()) => {
            tracing::warn!(error = %e, "the open transaction failed: rolling back");
            Err(roll_back(
                &ctx,
                &format!("the open transaction failed: {e}"),
            ))
        }
        r => r,
    };
    if matches!(
        result,
        Err(SourceError::Fatal { .. }
            | SourceError::BrokersUnavailable { .. }
            | SourceError::Transaction(_))
    ) {
        // The tasks are fenced, or their transaction aborted: nothing more is committed (the
        // caller closes them).
        return result;
    }
    if let Some(tx) = &ctx.transactions {
        // Commit what was processed (the rest of the mailboxes replays after a restart), or
        // nothing when stopping on an error.
        let committed = match &result {
            Ok(()) => tx.commit(
                &ctx.engine,
                consumer,
                &ctx.committer,
                false,
                true,
                ctx.drain_timeout,
            ),
            Err(_) => Err(TransactionError::Aborted("stopping on an error".into())),
        };
        if let Err(e) = committed {
            tracing::warn!(error = %e, "the last transaction did not commit: its work replays after a restart");
            if !matches!(e, TransactionError::Aborted(_)) || result.is_err() {
                let aborted = tx.abort(&ctx.engine, "stopping");
                tracing::debug!(%aborted, "the last transaction");
            }
        }
        return result;
    }
    // Drain and commit what was processed, whether stopping cleanly or on an error.
    let (mut progress, drained) = {
        let mut engine = ctx.engine.lock();
        engine.request_durable_commit();
        let drained = engine.wait_idle(ctx.drain_timeout);
        if !drained {
            tracing::warn!("sub-tasks did not drain within shutdown.timeout.ms: leaving the rest uncommitted (it is replayed after a restart)");
            engine.abandon();
        }
        (engine.collect_progress(), drained)
    };
    if !consumer.assignment_lost() {
        ctx.committer.past_unreturned(consumer, &mut progress);
        ctx.committer.commit_sync(consumer, &progress, drained);
    }
    result
}

/// Admits one polled record and dispatches it, or parks or queues it.
fn take(
    consumer: &BaseConsumer<SourceContext>,
    ctx: &SourceContext,
    backpressure: &mut Backpressure,
    m: BorrowedMessage<'_>,
) -> Result<(), SourceError> {
    let (topic, partition) = (m.topic(), m.partition() as u32);
    let offset = m.offset() as u64;
    ctx.committer.note_returned(topic, partition, offset);
    let raw = raw_record(&m);
    // Lock order: time_sync, then engine.
    let admitted = ctx
        .time_sync
        .lock()
        .admit(topic, partition, offset, raw, || {
            ctx.engine.lock().synced_input(topic)
        });
    match admitted {
        Admitted::Pass(raw) => backpressure
            .offer(ctx, topic, partition, offset, raw)
            .map_err(Into::into),
        Admitted::Queued { pause: false } => Ok(()),
        Admitted::Queued { pause: true } => {
            let key = TopicPartition::new(topic, partition);
            tracing::debug!(partition = %key, "time-ordered queue full: pausing partition");
            consumer.pause(&single(&key)).map_err(Into::into)
        }
    }
}

/// Aborts the open transaction after `why`: every task must close without committing and the
/// member rejoin (see [`crate::engine::transaction`], "Rollback").
fn roll_back(ctx: &SourceContext, why: &str) -> SourceError {
    match &ctx.transactions {
        Some(tx) => SourceError::Transaction(tx.abort(&ctx.engine, why)),
        None => SourceError::Transaction(TransactionError::Aborted(why.to_string())),
    }
}

/// Dispatches the queued records of ready tasks with several inputs in timestamp order (see
/// [`super::time_sync`]); resumes the partitions whose queue was full and is half empty now.
fn release_synced(
    consumer: &BaseConsumer<SourceContext>,
    ctx: &SourceContext,
    backpressure: &mut Backpressure,
) -> Result<(), SourceError> {
    let mut sync = ctx.time_sync.lock();
    if sync.queued() == 0 {
        return Ok(());
    }
    sync.release(
        Instant::now(),
        &mut Synced {
            consumer,
            ctx,
            backpressure,
        },
    )?;
    let enforced = sync.take_enforced();
    if enforced > 0 {
        crate::metrics::record_enforced(enforced);
    }
    let resumed = sync.take_resumable();
    drop(sync);
    for key in &resumed {
        tracing::debug!(partition = %key, "time-ordered queue drained: resuming partition");
        consumer.resume(&single(key))?;
    }
    backpressure.note_resumed(resumed);
    Ok(())
}

/// The source loop as [`super::time_sync::TimeSync`]'s downstream: lag from librdkafka's cached high watermarks,
/// released records through the backpressure.
struct Synced<'a> {
    consumer: &'a BaseConsumer<SourceContext>,
    ctx: &'a SourceContext,
    backpressure: &'a mut Backpressure,
}

impl Downstream for Synced<'_> {
    type Error = EngineError;

    fn fetched(&mut self, tp: &TopicPartition, next: Option<u64>) -> Fetched {
        match cached_watermarks(self.consumer, tp) {
            Some((low, high)) if high >= 0 => {
                // Nothing polled yet: reading starts where the ranges resume, else at the start.
                let position = next
                    .or_else(|| {
                        self.ctx
                            .engine
                            .lock()
                            .resume_offset(&tp.topic, tp.partition)
                    })
                    .unwrap_or(low.max(0) as u64);
                if high as u64 > position {
                    Fetched::Behind
                } else {
                    Fetched::CaughtUp
                }
            }
            _ => Fetched::Unknown,
        }
    }

    fn offer(
        &mut self,
        tp: &TopicPartition,
        offset: u64,
        raw: RawRecord,
    ) -> Result<(), EngineError> {
        self.backpressure
            .offer(self.ctx, &tp.topic, tp.partition, offset, raw)
    }

    fn holds(&self, tp: &TopicPartition) -> bool {
        self.backpressure.holds(tp)
    }
}

/// The low and high watermarks librdkafka last saw for `tp` (the high one from the last fetch
/// response), without a request; negative when not known. rdkafka does not wrap this call.
fn cached_watermarks(
    consumer: &BaseConsumer<SourceContext>,
    tp: &TopicPartition,
) -> Option<(i64, i64)> {
    use rdkafka::bindings as rd;
    let topic = std::ffi::CString::new(tp.topic.as_str()).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the handle is valid for the consumer's life, `topic` is a NUL-terminated string
    // that outlives the call, and the out-pointers point at live locals.
    let err = unsafe {
        rd::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            tp.partition as i32,
            &mut low,
            &mut high,
        )
    };
    (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then_some((low, high))
}

/// Milliseconds since the Unix epoch, for wall-clock punctuation.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Starts the tasks whose restore finished: commits their partitions' offsets with the new
/// lineage (synchronously), then resumes the partitions.
fn start_restored(
    consumer: &BaseConsumer<SourceContext>,
    ctx: &SourceContext,
) -> Result<(), SourceError> {
    if ctx.restoring.lock().is_empty() {
        return Ok(());
    }
    // Lock order, as in the rebalance callback: engine, then restoring.
    let mut engine = ctx.engine.lock();
    engine.finish_restores()?;
    let done: Vec<TopicPartition> = {
        let mut restoring = ctx.restoring.lock();
        let done: Vec<_> = restoring
            .iter()
            .filter(|tp| !engine.is_restoring(&tp.topic, tp.partition))
            .cloned()
            .collect();
        for key in &done {
            if restoring.remove(key) {
                ctx.health.restore_finished();
            }
        }
        done
    };
    if done.is_empty() {
        return Ok(());
    }
    let progress: Vec<_> = engine
        .collect_progress()
        .into_iter()
        .filter(|p| {
            done.iter()
                .any(|tp| tp.topic == p.topic && tp.partition == p.partition)
        })
        .collect();
    drop(engine);
    ctx.committer.commit_sync(consumer, &progress, false);
    tracing::info!(partitions = %crate::engine::partition_list(&done), "restored: processing");
    for key in &done {
        consumer.resume(&single(key))?;
    }
    super::rebalance::wake_fetchers(consumer, &done);
    Ok(())
}
