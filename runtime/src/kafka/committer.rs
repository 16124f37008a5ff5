//! The offset committer: each partition's low watermark, with every range's next offset and the
//! task's lineage in the commit metadata (see [`super::metadata`]).
//!
//! A commit is skipped only when nothing it would carry changed since the last one succeeded
//! (offset, range offsets and lineage): a range that moves while the low watermark is held back
//! by a slower range still gets its offsets committed, so a crash does not replay its outputs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use rill_topology::KeyRange;

use super::metadata::{self, RangeOffsets};
use super::streams_group::OffsetToCommit;
use super::streams_member::StreamsMember;
use crate::engine::{PartitionProgress, TopicPartition};

/// Attempts of a synchronous commit while the group coordinator is not ready.
const SYNC_ATTEMPTS: usize = 20;
/// Pause between those attempts.
const SYNC_BACKOFF: Duration = Duration::from_millis(250);
/// How long a synchronous commit waits for its answer. librdkafka's own waits for ever, and
/// while the group rebalances the answer can wait for this very thread to poll (a source
/// thread hung so in CI); a commit that times out is handled as a failed one.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Commits partitions' progress, remembering what it committed.
#[derive(Default)]
pub struct Committer {
    /// The last progress handed to a commit per (topic, partition). Invariant: cleared whenever
    /// a commit fails, so a failed commit is always retried at the next interval.
    committed: Mutex<HashMap<TopicPartition, PartitionProgress>>,
    /// Per topic, per partition: the offset after the last record the consumer returned. Only
    /// the source loop's thread writes it (callbacks run inside its `poll`).
    returned: Mutex<HashMap<String, Vec<u64>>>,
    /// Under `group.protocol=streams`: commits go to the coordinator at the member epoch
    /// (librdkafka is not a member of that group). Taken on the source loop's thread only.
    streams: Option<Arc<Mutex<StreamsMember>>>,
}

fn is_coordinator_busy(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::NotCoordinator | C::CoordinatorLoadInProgress | C::CoordinatorNotAvailable)
    )
}

impl Committer {
    /// A committer of a streams group member: commits go through `member`.
    pub fn via_streams_group(member: Arc<Mutex<StreamsMember>>) -> Self {
        Committer {
            streams: Some(member),
            ..Committer::default()
        }
    }

    /// Under `group.protocol=streams`: the member's (group, member id, epoch), which a
    /// transaction's offsets are sent as.
    pub fn streams_identity(&self) -> Option<(String, String, i32)> {
        self.streams.as_ref().map(|m| m.lock().identity())
    }

    /// Notes that the consumer returned the record at `offset` of `topic`/`partition`.
    pub fn note_returned(&self, topic: &str, partition: u32, offset: u64) {
        let mut returned = self.returned.lock();
        let per_partition = match returned.get_mut(topic) {
            Some(p) => p,
            None => returned.entry(topic.to_string()).or_default(),
        };
        let i = partition as usize;
        if per_partition.len() <= i {
            per_partition.resize(i + 1, 0);
        }
        per_partition[i] = offset + 1;
    }

    /// Moves the offset of each partition that has committed every record the consumer
    /// returned past what the consumer skipped after them without returning it: transaction
    /// markers and aborted records (`read_committed`). Kafka Streams commits the consumer's
    /// position there too, so a transactional input shows no lag of one per partition.
    pub fn past_unreturned<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        progress: &mut [PartitionProgress],
    ) {
        let Ok(positions) = consumer.position() else {
            return;
        };
        let returned = self.returned.lock();
        for p in progress {
            let caught_up = returned
                .get(&p.topic)
                .and_then(|ps| ps.get(p.partition as usize))
                .is_some_and(|&r| r == p.low_watermark);
            let position = positions
                .find_partition(&p.topic, p.partition as i32)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o as u64),
                    _ => None,
                });
            if let (true, Some(position)) = (caught_up, position) {
                skip_to(p, position);
            }
        }
    }

    /// Forgets what was committed (after a failed commit), so the next commit sends everything.
    pub fn forget(&self) {
        self.committed.lock().clear();
    }

    /// Commits `progress` synchronously, retrying while the group coordinator is not ready (a
    /// fresh broker is still creating `__consumer_offsets`); logs and counts a failure.
    /// `handed_over`: the commit ends this instance's ownership with nothing processed past it
    /// (a drained revoke or stop), which the metadata tells the next owner.
    pub fn commit_sync<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        progress: &[PartitionProgress],
        handed_over: bool,
    ) {
        for attempt in 1..=SYNC_ATTEMPTS {
            match self.commit_as(consumer, progress, CommitMode::Sync, handed_over) {
                Ok(_) => return,
                Err(e) if attempt < SYNC_ATTEMPTS && is_coordinator_busy(&e) => {
                    self.forget();
                    std::thread::sleep(SYNC_BACKOFF);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "offset commit failed");
                    crate::metrics::record_error("offset_commit");
                    self.forget();
                    return;
                }
            }
        }
    }

    /// Commits each partition's low watermark with its range offsets and lineage as metadata;
    /// an asynchronous commit leaves out partitions whose progress did not change. Returns how
    /// many partitions it committed.
    pub fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        progress: &[PartitionProgress],
        mode: CommitMode,
    ) -> Result<usize, KafkaError> {
        self.commit_as(consumer, progress, mode, false)
    }

    /// [`Committer::commit`], marking the metadata handed over (see [`Committer::commit_sync`]).
    fn commit_as<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        progress: &[PartitionProgress],
        mode: CommitMode,
        handed_over: bool,
    ) -> Result<usize, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        let mut committed = self.committed.lock();
        for p in progress {
            let key = TopicPartition::new(p.topic.clone(), p.partition);
            if matches!(mode, CommitMode::Async) && committed.get(&key) == Some(p) {
                continue;
            }
            let mut elem = tpl.add_partition(&p.topic, p.partition as i32);
            elem.set_offset(Offset::Offset(p.low_watermark as i64))?;
            let offsets = RangeOffsets {
                hash_id: p.hash_id,
                ranges: p.ranges.clone(),
                lineage: p.lineage,
                applied: p.applied.clone(),
                handed_over,
            };
            let text = metadata::encode(&offsets, p.low_watermark).or_else(|e| {
                tracing::warn!(topic = %p.topic, partition = p.partition, error = %e,
                    "range offsets do not fit in the commit metadata; committing the low watermark and the lineage alone");
                metrics::counter!(crate::metrics::COMMIT_METADATA_OVERFLOW).increment(1);
                // One range at the watermark: always fits, and keeps the lineage.
                let alone = RangeOffsets {
                    hash_id: p.hash_id,
                    ranges: vec![(KeyRange::FULL, p.low_watermark)],
                    lineage: p.lineage,
                    applied: Vec::new(),
                    handed_over,
                };
                metadata::encode(&alone, p.low_watermark)
            });
            match text {
                Ok(text) => elem.set_metadata(text),
                Err(e) => {
                    tracing::warn!(topic = %p.topic, partition = p.partition, error = %e, "commit metadata left out")
                }
            }
            committed.insert(key, p.clone());
        }
        drop(committed);
        if tpl.count() == 0 {
            return Ok(0);
        }
        if let Some(member) = &self.streams {
            return commit_at_member_epoch(&mut member.lock(), &tpl)
                .map(|()| tpl.count())
                .inspect_err(|_| self.forget());
        }
        match mode {
            CommitMode::Sync => commit_within(consumer, &tpl, SYNC_TIMEOUT)?,
            CommitMode::Async => consumer.commit(&tpl, mode)?,
        }
        Ok(tpl.count())
    }
}

/// Moves `p` to `position` when it is ahead: every offset in between holds nothing the
/// consumer returns, so no range has anything there to apply.
fn skip_to(p: &mut PartitionProgress, position: u64) {
    if position <= p.low_watermark {
        return;
    }
    p.low_watermark = position;
    for (_, next) in &mut p.ranges {
        *next = (*next).max(position);
    }
    for ((_, next), applied) in p.ranges.iter().zip(&mut p.applied) {
        applied.retain(|o| o > next);
    }
}

/// A synchronous commit that gives up after `within` (`OperationTimedOut`): the answer comes
/// on a queue of its own, which is dropped unread if it is late.
fn commit_within<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
    within: Duration,
) -> Result<(), KafkaError> {
    use rdkafka::bindings as rd;
    use rdkafka::error::RDKafkaErrorCode;
    let rk = consumer.client().native_ptr();
    let ms = i32::try_from(within.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `rk` and the list are valid for the call; the queue is ours and destroyed once
    // (librdkafka keeps it alive for an answer still on its way).
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let err = rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue, None, std::ptr::null_mut());
        let result = if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Err(RDKafkaErrorCode::from(err))
        } else {
            let event = rd::rd_kafka_queue_poll(queue, ms);
            if event.is_null() {
                Err(RDKafkaErrorCode::OperationTimedOut)
            } else {
                let err = rd::rd_kafka_event_error(event);
                rd::rd_kafka_event_destroy(event);
                match err {
                    rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
                    e => Err(RDKafkaErrorCode::from(e)),
                }
            }
        };
        rd::rd_kafka_queue_destroy(queue);
        result.map_err(KafkaError::ConsumerCommit)
    }
}

/// Commits `tpl` through the streams group's coordinator at the member's epoch.
fn commit_at_member_epoch(
    member: &mut StreamsMember,
    tpl: &TopicPartitionList,
) -> Result<(), KafkaError> {
    use rdkafka::error::RDKafkaErrorCode as C;
    let offsets: Vec<OffsetToCommit> = tpl
        .elements()
        .iter()
        .map(|e| OffsetToCommit {
            topic: e.topic().to_string(),
            partition: e.partition(),
            offset: match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            },
            metadata: Some(e.metadata().to_string()).filter(|m| !m.is_empty()),
        })
        .collect();
    let answers = member.commit(&offsets).map_err(|e| {
        tracing::debug!(error = %e, "offset commit to the streams group failed");
        KafkaError::ConsumerCommit(C::Fail)
    })?;
    match answers.iter().find(|(_, _, code)| *code != 0) {
        None => Ok(()),
        Some((topic, partition, code)) => {
            tracing::debug!(%topic, partition, code, "the streams group refused an offset commit");
            Err(KafkaError::ConsumerCommit(match code {
                25 => C::UnknownMemberId,
                110 => C::FencedMemberEpoch,
                113 => C::StaleMemberEpoch,
                _ => C::Fail,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::consumer::BaseConsumer;
    use rdkafka::mocking::MockCluster;
    use rdkafka::ClientConfig;
    use rill_topology::ranges;

    use super::*;

    fn progress(low: u64, next: [u64; 2]) -> PartitionProgress {
        PartitionProgress {
            topic: "t".into(),
            partition: 0,
            low_watermark: low,
            ranges: ranges(2).into_iter().zip(next).collect(),
            lineage: Some(42),
            applied: Vec::new(),
            hash_id: rill_topology::HASH_ID,
        }
    }

    /// Offsets the consumer skipped after a partition's last returned record (transaction
    /// markers) are committed past: the low watermark and every range behind move there, and
    /// applied offsets at or below a range's new offset go.
    #[test]
    fn a_caught_up_partition_skips_to_the_position() {
        let mut p = progress(10, [10, 14]);
        p.applied = vec![vec![], vec![16]];
        skip_to(&mut p, 12);
        assert_eq!(p.low_watermark, 12);
        assert_eq!(p.ranges.iter().map(|r| r.1).collect::<Vec<_>>(), [12, 14]);
        assert_eq!(p.applied, [Vec::<u64>::new(), vec![16]]);
        skip_to(&mut p, 16);
        assert_eq!(p.ranges.iter().map(|r| r.1).collect::<Vec<_>>(), [16, 16]);
        assert_eq!(p.applied, [Vec::<u64>::new(), Vec::new()]);
        let before = p.clone();
        skip_to(&mut p, 3);
        assert_eq!(p, before, "a position behind changes nothing");
    }

    /// A synchronous commit that gets no answer (no coordinator: nothing listens at the
    /// bootstrap address) gives up after its bound instead of waiting for ever.
    #[test]
    fn a_synchronous_commit_without_an_answer_times_out() {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "committer-timeout-test")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("t", 0, Offset::Offset(5)).unwrap();
        let started = std::time::Instant::now();
        let r = commit_within(&consumer, &tpl, Duration::from_millis(500));
        assert!(r.is_err(), "committed without a broker: {r:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited {:?}",
            started.elapsed()
        );
        // Closing waits for a coordinator that never comes: not on the test's time.
        std::thread::spawn(move || drop(consumer));
    }

    /// Issue 10, item 8: a range that moves on while another holds the low watermark back
    /// still gets its offset committed (the metadata used to go stale until the watermark moved).
    #[test]
    fn a_commit_is_skipped_only_when_nothing_it_carries_changed() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "committer-test")
            .create()
            .unwrap();
        let committer = Committer::default();
        let first = progress(10, [10, 12]);
        assert_eq!(
            committer
                .commit(&consumer, std::slice::from_ref(&first), CommitMode::Sync)
                .unwrap(),
            1
        );
        assert_eq!(
            committer
                .commit(&consumer, &[first], CommitMode::Async)
                .unwrap(),
            0,
            "nothing changed"
        );
        let moved = progress(10, [10, 30]);
        assert_eq!(
            committer
                .commit(&consumer, &[moved], CommitMode::Sync)
                .unwrap(),
            1,
            "range 1 moved while the low watermark did not"
        );
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("t", 0);
        let got = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        let e = &got.elements()[0];
        assert_eq!(e.offset(), Offset::Offset(10));
        let decoded = metadata::decode(e.metadata(), 10).unwrap();
        assert_eq!(decoded.ranges[1].1, 30);
        assert_eq!(decoded.lineage, Some(42));
    }
}
