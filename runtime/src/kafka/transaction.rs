//! The instance's Kafka transaction under `processing.guarantee=exactly_once_v2`: one
//! transactional producer, one transaction per commit interval over every key range (why, and
//! how the ranges seal and park, is in [`crate::engine::transaction`]).
//!
//! [`Transactions::commit`] runs the whole commit from the source loop's thread (also inside a
//! revoke callback, and at shutdown): seal every range, wait until their records and markers are
//! acknowledged, send each partition's low watermark and range offsets with the consumer's group
//! metadata (`send_offsets_to_transaction`: the coordinator refuses a member of an older
//! generation, so a zombie cannot commit: KIP-447), commit, write the ranges' WriteBatches,
//! begin the next transaction.
//!
//! Failures, as Kafka Streams handles them: an error the transaction can recover from
//! (`txn_requires_abort`: a refused offset commit, a timeout, a fenced task) aborts it and
//! reports [`TransactionError::Aborted`], on which the runtime closes every task without
//! committing and rejoins the group with a new consumer (the aborted work is processed again); a
//! retriable commit error is retried; a fatal producer error (`ProducerFenced`: another producer
//! with this transactional id) is [`TransactionError::Fatal`] and stops the runtime.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::metadata::{self, RangeOffsets};
use super::producer::KafkaSink;
use crate::engine::{Engine, EngineError, PartitionProgress};

/// Time allowed for one transactional request (offsets, commit, abort, init).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of `commit_transaction` while it fails with a retriable error (each up to
/// [`REQUEST_TIMEOUT`]).
const COMMIT_ATTEMPTS: u32 = 4;
/// A commit slower than this is logged with where its time went.
const SLOW_COMMIT: Duration = Duration::from_secs(2);

/// How long an abort waits for the key ranges to stop sending.
const HALT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long past [`REQUEST_TIMEOUT`] sending the offsets may take before the producer is given
/// up. librdkafka does not always bound `send_offsets_to_transaction` by its timeout: after a
/// kill of the group coordinator it waited for minutes in the chaos run (librdkafka issues
/// #5456 and #5511), with every task parked and nothing committed.
const HUNG_CALL_MARGIN: Duration = Duration::from_secs(15);

/// Runs `call` on a thread of its own and waits at most `limit` for its result. On a timeout
/// the call goes on running, and what it holds (the old producer) is released when it returns.
fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("rill-txn-call".into())
        .spawn(move || {
            // The receiver is gone when the caller gave up waiting: nothing to tell.
            let _ = tx.send(call());
        })
        .map_err(|e| format!("{what}: could not start its thread: {e}"))?;
    rx.recv_timeout(limit).map_err(|_| {
        format!(
            "{what} did not return within {limit:?} (librdkafka did not bound it by its \
             timeout); the transactional producer is replaced"
        )
    })
}

/// Why a transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    /// Aborted: every task must close without committing and processing starts again from
    /// the last committed transaction.
    #[error("the transaction was aborted ({0}); every task restarts from the last committed transaction")]
    Aborted(String),
    /// The producer cannot go on (fenced by another producer with its transactional id).
    #[error("the transactional producer failed for good ({0}): if two instances share a state directory or kafka.group.instance.id, give each its own")]
    Fatal(String),
    /// A transactional call did not return in time: the producer is replaced (which fences the
    /// stuck one and aborts its transaction), as after [`TransactionError::Fatal`].
    #[error("the transactional producer stopped answering ({0}); it is replaced and every task resumes from the last committed transaction")]
    Stuck(String),
    /// Processing failed, or the state could not be written.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The transactional producer's commit cycle.
pub struct Transactions {
    sink: std::sync::Arc<KafkaSink>,
    /// Held across a commit: the source loop and a revoke callback never commit at once.
    commit: Mutex<()>,
}

/// Aborts the open transaction and begins the next one; counted.
fn abort_and_begin(sink: &KafkaSink) -> Result<(), String> {
    metrics::counter!(crate::metrics::TRANSACTION_ABORTS).increment(1);
    sink.clear_transaction_failed();
    let p = sink.producer();
    // Aborting when no transaction holds anything is accepted; a state error changes nothing.
    if let Err(e) = p.abort_transaction(REQUEST_TIMEOUT) {
        match &e {
            KafkaError::Transaction(t) if t.is_fatal() => return Err(e.to_string()),
            _ => tracing::debug!(error = %e, "aborting the transaction"),
        }
    }
    p.begin_transaction().map_err(|e| e.to_string())
}

/// Aborts the transaction after `what` failed with `e` (fatal errors are not aborted), once
/// no task can send anything more into it.
fn aborted(
    sink: &KafkaSink,
    engine: &Mutex<Engine>,
    what: &str,
    e: Option<KafkaError>,
) -> TransactionError {
    let why = match &e {
        Some(e) => format!("{what}: {e}"),
        None => what.to_string(),
    };
    if let Some(KafkaError::Transaction(t)) = &e {
        if t.is_fatal() {
            return TransactionError::Fatal(why);
        }
    }
    if !engine.lock().halt(HALT_TIMEOUT) {
        return TransactionError::Fatal(format!(
            "{why}; then the key ranges did not stop within {HALT_TIMEOUT:?}"
        ));
    }
    match abort_and_begin(sink) {
        Ok(()) => TransactionError::Aborted(why),
        Err(a) => TransactionError::Fatal(format!("{why}; then aborting it: {a}")),
    }
}

/// A transactional call hung: fences every task, so nothing of the work the stuck transaction
/// holds commits anywhere (the producer's replacement aborts the transaction itself).
fn stuck(engine: &Mutex<Engine>, why: String) -> TransactionError {
    if !engine.lock().halt(HALT_TIMEOUT) {
        return TransactionError::Fatal(format!(
            "{why}; then the key ranges did not stop within {HALT_TIMEOUT:?}"
        ));
    }
    TransactionError::Stuck(why)
}

/// Sends `offsets` to `producer`'s open transaction as `member` of a streams group (group,
/// member id, member epoch). librdkafka builds group metadata only for groups it is a member of,
/// and in a streams group rill is the member (`kafka::streams_member`); the coordinator fences a
/// stale epoch as it fences a stale generation. A refusal is its message, and whether the
/// producer is done for (fatal).
fn send_offsets_as_member<P: Producer<C>, C: rdkafka::producer::ProducerContext>(
    producer: &P,
    offsets: &TopicPartitionList,
    member: &(String, String, i32),
) -> Result<(), (String, bool)> {
    use rdkafka::bindings as rd;
    use std::ffi::{CStr, CString};
    let text = |s: &str| CString::new(s).map_err(|_| (format!("{s:?} holds a NUL byte"), false));
    let (group, member_id) = (text(&member.0)?, text(&member.1)?);
    let timeout = i32::try_from(REQUEST_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the strings and the list outlive the calls; librdkafka copies the metadata's
    // strings, and the metadata and any error object are destroyed exactly once, here.
    unsafe {
        let md = rd::rd_kafka_consumer_group_metadata_new_with_genid(
            group.as_ptr(),
            member.2,
            member_id.as_ptr(),
            std::ptr::null(),
        );
        if md.is_null() {
            return Err(("librdkafka built no group metadata".into(), false));
        }
        let err = rd::rd_kafka_send_offsets_to_transaction(
            producer.client().native_ptr(),
            offsets.ptr(),
            md,
            timeout,
        );
        rd::rd_kafka_consumer_group_metadata_destroy(md);
        if err.is_null() {
            return Ok(());
        }
        let message = CStr::from_ptr(rd::rd_kafka_error_string(err))
            .to_string_lossy()
            .into_owned();
        let fatal = rd::rd_kafka_error_is_fatal(err) != 0;
        rd::rd_kafka_error_destroy(err);
        Err((message, fatal))
    }
}

impl Transactions {
    /// Registers the producer's transactional id with the coordinator (fencing an earlier
    /// producer with that id and aborting its open transaction) and begins the first transaction.
    pub fn init(sink: std::sync::Arc<KafkaSink>) -> Result<Self, KafkaError> {
        sink.producer().init_transactions(REQUEST_TIMEOUT)?;
        sink.producer().begin_transaction()?;
        Ok(Transactions {
            sink,
            commit: Mutex::new(()),
        })
    }

    /// Commits what every range processed so far, with the consumed offsets, in the open
    /// transaction, then begins the next one. `force` commits even when nothing was processed
    /// or sent (a revoke, a shutdown). With `resume` the ranges go on afterwards; without, they
    /// stay parked (the caller closes them). False when there was nothing to commit.
    pub fn commit<C: ConsumerContext>(
        &self,
        engine: &Mutex<Engine>,
        consumer: &BaseConsumer<C>,
        committer: &super::committer::Committer,
        resume: bool,
        force: bool,
        timeout: Duration,
    ) -> Result<bool, TransactionError> {
        let _one = self.commit.lock();
        let started = Instant::now();
        {
            let mut e = engine.lock();
            let sent = self.sink.take_sent();
            if !force && sent == 0 && e.uncommitted() == 0 {
                return Ok(false);
            }
            e.seal_for_transaction();
        }
        let deadline = started + timeout;
        loop {
            match engine.lock().transaction_ready() {
                Ok(true) => break,
                Ok(false) => {}
                Err(EngineError::Fenced) => {
                    return Err(aborted(
                        &self.sink,
                        engine,
                        "a task was fenced while sealing",
                        None,
                    ))
                }
                Err(e) => return Err(e.into()),
            }
            if Instant::now() > deadline {
                return Err(aborted(
                    &self.sink,
                    engine,
                    &format!("the key ranges did not seal within {timeout:?}"),
                    None,
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let sealed = started.elapsed();
        let mut progress = engine.lock().prepare_transaction();
        committer.past_unreturned(consumer, &mut progress);
        let offsets = offsets(&progress)?;
        let limit = REQUEST_TIMEOUT + HUNG_CALL_MARGIN;
        if let (true, Some(member)) = (offsets.count() > 0, committer.streams_identity()) {
            let (producer, list) = (self.sink.producer(), offsets.clone());
            let sent = bounded("sending the offsets", limit, move || {
                send_offsets_as_member(&*producer, &list, &member)
            })
            .map_err(|why| stuck(engine, why))?;
            if let Err(refusal) = sent {
                let what = format!("sending the offsets as streams group member: {}", refusal.0);
                return Err(if refusal.1 {
                    TransactionError::Fatal(what)
                } else {
                    aborted(&self.sink, engine, &what, None)
                });
            }
        } else if offsets.count() > 0 {
            let group = consumer.group_metadata().ok_or_else(|| {
                aborted(
                    &self.sink,
                    engine,
                    "the consumer has no group metadata",
                    None,
                )
            });
            let sent = group.and_then(|g| {
                let (producer, list) = (self.sink.producer(), offsets.clone());
                bounded("sending the offsets", limit, move || {
                    producer.send_offsets_to_transaction(&list, &g, REQUEST_TIMEOUT)
                })
                .map_err(|why| stuck(engine, why))?
                .map_err(|e| aborted(&self.sink, engine, "sending the offsets", Some(e)))
            });
            sent?;
        }
        let offsets_sent = started.elapsed();
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.sink.producer().commit_transaction(REQUEST_TIMEOUT) {
                Ok(()) => break,
                // Bounded: the loop polls nothing meanwhile, and its members' sessions run out.
                Err(KafkaError::Transaction(t))
                    if t.is_retriable() && attempts < COMMIT_ATTEMPTS =>
                {
                    tracing::warn!(error = %t, attempts, "committing the transaction (retrying)");
                }
                Err(e) => return Err(aborted(&self.sink, engine, "committing", Some(e))),
            }
        }
        engine.lock().finish_transaction()?;
        // Begun before any range goes on: a send outside a transaction is refused.
        self.sink
            .producer()
            .begin_transaction()
            .map_err(|e| TransactionError::Fatal(format!("beginning a transaction: {e}")))?;
        if resume {
            engine.lock().resume_after_transaction();
        }
        metrics::histogram!(crate::metrics::TRANSACTION_COMMIT_LATENCY).record(started.elapsed());
        tracing::debug!(
            sealed_ms = sealed.as_secs_f64() * 1e3,
            offsets_sent_ms = offsets_sent.as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "committed a transaction"
        );
        if started.elapsed() > SLOW_COMMIT {
            tracing::warn!(
                sealed_ms = sealed.as_millis() as u64,
                total_ms = started.elapsed().as_millis() as u64,
                "a transaction commit was slow (sealed_ms: until every key range had parked and the broker had acknowledged its records)"
            );
        }
        Ok(true)
    }

    /// Whether a record was refused because the open transaction failed: processing stopped
    /// on it, and what it needs is an abort and a rollback.
    pub fn failed(&self) -> bool {
        self.sink.transaction_failed()
    }

    /// After [`TransactionError::Fatal`] (the producer was fenced, or the coordinator bumped
    /// its epoch) or [`TransactionError::Stuck`]: a new producer with the same transactional id, registered, with a
    /// transaction begun. The tasks must have been closed first.
    pub fn renew(&self) -> Result<(), KafkaError> {
        let _one = self.commit.lock();
        self.sink.renew()?;
        self.sink.clear_transaction_failed();
        let p = self.sink.producer();
        p.init_transactions(REQUEST_TIMEOUT)?;
        p.begin_transaction()
    }

    /// Aborts the open transaction once no task sends into it any more (its work is rolled
    /// back by closing the tasks, which this fences) and begins the next one.
    pub fn abort(&self, engine: &Mutex<Engine>, why: &str) -> TransactionError {
        let _one = self.commit.lock();
        aborted(&self.sink, engine, why, None)
    }
}

/// Each partition's low watermark with every range's offset and the lineage as metadata. Under
/// `exactly_once_v2` the range offsets must fit: the low watermark alone would make a restart
/// re-emit outputs of the ranges ahead of it that this transaction commits.
fn offsets(progress: &[PartitionProgress]) -> Result<TopicPartitionList, TransactionError> {
    let mut tpl = TopicPartitionList::new();
    for p in progress {
        let text = metadata::encode(
            &RangeOffsets {
                hash_id: p.hash_id,
                ranges: p.ranges.clone(),
                lineage: p.lineage,
                applied: p.applied.clone(),
                handed_over: false,
            },
            p.low_watermark,
        )
        .map_err(|e| {
            TransactionError::Engine(EngineError::Config {
                key: "parallelising.factor",
                message: format!(
                    "the range offsets of {}-{} do not fit in the commit metadata ({e}): lower it",
                    p.topic, p.partition
                ),
            })
        })?;
        let mut elem = tpl.add_partition(&p.topic, p.partition as i32);
        elem.set_offset(Offset::Offset(p.low_watermark as i64))
            .map_err(|e| TransactionError::Fatal(format!("offsets: {e}")))?;
        elem.set_metadata(text);
    }
    Ok(tpl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_does_not_return_in_time_is_given_up_and_one_that_does_is_answered() {
        assert_eq!(
            bounded("a quick call", Duration::from_secs(10), || 7),
            Ok(7)
        );
        let started = Instant::now();
        let (release, hold) = crossbeam_channel::bounded::<()>(0);
        let hung = bounded("a hung call", Duration::from_millis(100), move || {
            let _ = hold.recv();
        });
        let why = hung.unwrap_err();
        assert!(
            why.starts_with("a hung call did not return within 100ms"),
            "{why}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // The abandoned call ends once what it waits for comes.
        drop(release);
    }
}
