//! What a sub-task gives the topology while it processes one item: its stores, its outputs
//! (repartition records stamped with their origin, each with a delivery ticket of the range's
//! current epoch), and the counters of dropped records.

use std::sync::Arc;

use rill_state::SubTaskState;
use rill_topology::exec::TaskEnv;
use rill_topology::serdes::SerdeError;
use rill_topology::store::{KeyValueBytes, StoreError};
use rill_topology::{RawRecord, Topic};

use super::origin::{Origin, ORIGIN_HEADER};
use super::subtask::SubTaskId;
use super::{EngineError, Shared};
use crate::sink::Deliveries;

/// The [`TaskEnv`] of one sub-task while it processes one item.
pub(super) struct Env<'a> {
    shared: &'a Shared,
    id: &'a SubTaskId,
    state: Option<&'a mut SubTaskState>,
    deliveries: &'a Arc<Deliveries>,
    /// (input topic id, input offset) of the record being processed; `None` outside of one
    /// (wall-clock punctuation, init), whose repartition outputs carry no origin.
    pub(super) origin: Option<(u64, u64, u64)>,
    /// Behind an async stage: the time the range had settled when the outputs were made,
    /// stamped on its internal-topic outputs as [`SETTLED_HEADER`] (`i64::MIN`: nothing settled
    /// yet).
    pub(super) settled: Option<i64>,
    seq: u32,
    error: Option<EngineError>,
}

/// Header of a record written to an internal topic behind an async stage: the settled time of
/// the range that wrote it (big-endian i64). The results of a range's calls reach the topic in
/// the order they complete; a reader moves its stream time no further than this bound (see
/// [`time_bound`]), so a record still waiting for its call when a later one was written is not
/// late when it arrives (Flink's async I/O anchor: results reorder, never across a watermark).
pub(crate) const SETTLED_HEADER: &str = "rill.settled";

/// The bound [`SETTLED_HEADER`] carries, if any; the header is removed (processors never see it,
/// so their outputs do not carry it on).
pub(crate) fn take_time_bound(headers: &mut rill_topology::Headers) -> Option<i64> {
    let bound = time_bound(headers);
    if bound.is_some() {
        headers.remove(SETTLED_HEADER);
    }
    bound
}

/// The bound [`SETTLED_HEADER`] carries, if any.
pub(crate) fn time_bound(headers: &rill_topology::Headers) -> Option<i64> {
    headers
        .last(SETTLED_HEADER)
        .flatten()
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(i64::from_be_bytes)
}

impl<'a> Env<'a> {
    pub(super) fn new(
        shared: &'a Shared,
        id: &'a SubTaskId,
        state: Option<&'a mut SubTaskState>,
        deliveries: &'a Arc<Deliveries>,
    ) -> Self {
        Env {
            shared,
            id,
            state,
            deliveries,
            origin: None,
            settled: None,
            seq: 0,
            error: None,
        }
    }

    pub(super) fn finish(self) -> Result<(), EngineError> {
        self.error.map_or(Ok(()), Err)
    }
}

impl TaskEnv for Env<'_> {
    fn global_get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.shared.globals.get(store, key)
    }

    fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError> {
        self.state
            .as_mut()
            .and_then(|s| s.store(name))
            .ok_or_else(|| StoreError::UnknownStore(name.to_string()))
    }

    fn emit(&mut self, topic: &Topic, mut record: RawRecord) {
        if self.error.is_some() {
            return;
        }
        let resolved = self.shared.output_name(topic);
        let partition =
            if topic.is_internal() {
                let ordered = !self.shared.unordered[self.id.sub_topology];
                if let Some((topic, offset, hash)) = self.origin.filter(|_| ordered) {
                    let origin = Origin {
                        topic,
                        partition: self.id.partition,
                        range: self.id.range,
                        hash,
                        offset,
                        seq: self.seq,
                    };
                    self.seq += 1;
                    record.headers.add(ORIGIN_HEADER, origin.encode());
                }
                let named = record
                    .headers
                    .last(rill_topology::PARTITION_HEADER)
                    .flatten()
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_be_bytes)
                    .filter(|&p| p < self.shared.partitions_of(topic));
                record.headers.remove(rill_topology::PARTITION_HEADER);
                if let Some(bound) = self.settled {
                    record.headers.remove(SETTLED_HEADER);
                    record
                        .headers
                        .add(SETTLED_HEADER, bound.to_be_bytes().to_vec());
                }
                Some(named.unwrap_or_else(|| {
                    self.shared.internal_partition(topic, record.key.as_deref())
                }))
            } else {
                None
            };
        let ticket = self.deliveries.ticket();
        if let Err(e) = self.shared.sink.send(&resolved, partition, record, ticket) {
            self.error = Some(e.into());
        } else {
            self.shared.stats.count_produced();
            self.shared.metrics.produced(&resolved);
        }
    }

    fn dropped(&mut self, reason: &'static str) {
        self.shared.stats.count_discarded(reason);
    }

    fn late_dropped(&mut self, store: &str) {
        // Kafka Streams logs each skipped record of an expired window; at debug here (a backlog
        // of late records would flood the log at warn), with what finds the record again.
        let offset = self.origin.map(|(_, offset, _)| offset);
        tracing::debug!(store, partition = self.id.partition, range = %self.id.range, ?offset, "a late record was dropped (its window closed)");
        self.shared.stats.count_late(store);
    }

    fn routing_hash(&self) -> Option<u64> {
        self.state.as_ref().and_then(|s| s.routing_hash())
    }

    fn set_routing_hash(&mut self, hash: u64) {
        if let Some(s) = self.state.as_mut() {
            s.set_routing_hash(hash);
        }
    }

    fn clear_routing_hash(&mut self) {
        if let Some(s) = self.state.as_mut() {
            s.clear_routing_hash();
        }
    }

    fn drop_unserializable(&mut self, topic: &Topic, error: &SerdeError) -> bool {
        if !self.shared.config.drop_unserializable_outputs {
            return false;
        }
        let resolved = self.shared.output_name(topic);
        tracing::warn!(topic = %resolved, partition = self.id.partition, range = ?self.id.range, %error, "an output record does not serialize: dropped (production.exception.handler=log_and_continue)");
        self.shared.stats.count_discarded("serialization_error");
        true
    }
}
