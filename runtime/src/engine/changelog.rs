//! Store changelogs: the records a range commit writes, and how a task restores from them.
//!
//! # Records
//!
//! Each store has a compacted topic `<application.id>-<store>-changelog`; partition = the input
//! partition. Three kinds of records go there:
//! - a **data record** per key a commit changed: key = the store key, value = the new value or
//!   null for a delete (a tombstone). Header `rill.c` carries the [`CommitId`] (the key range
//!   that wrote it, the writer's lineage and the commit attempt) and the routing hash of the
//!   input record that wrote the entry. Restore never derives a range from the store key (store
//!   keys need not be the routing key).
//! - a **range marker** per commit and store: header `rill.marker`, key
//!   `rill.marker/<start>-<end>/<lineage>` (compaction keeps each lineage's latest marker of each
//!   range), value = the range's prost [`Progress`] (offsets, origins, stream time, lineage,
//!   attempt, generation).
//! - a **claim** when a member takes over the task, in the *last* store's changelog only:
//!   header `rill.claim`, key `rill.claim/<lineage>` (never compacted away), value = [`Claim`]
//!   (lineage, consumer-group generation, the lineage it continues);
//! - a **base** right after the new owner's restore, also in the last store's changelog only:
//!   header `rill.base`, key `rill.base/<lineage>` (never compacted away), value = [`Base`]: per
//!   range, the progress of the newest complete commit the new lineage continues from, and per
//!   (commit range, lineage) the highest complete attempt its restore read since the last base
//!   (commit ranges, not current ones: after a factor change they differ).
//!
//! A **lineage** is one owner's tenure of a task: a random id chosen at assignment. Within a
//! lineage, a range's commit attempts are numbered 1, 2, ...; an attempt that does not finish
//! ends the lineage (the sub-task or the process stops), so every attempt of a lineage but the
//! last has its marker.
//!
//! # Write order (the range commit protocol with changelogs)
//!
//! 0. On assignment the new owner writes its claim, waits for the ack, then restores: every
//!    record before its claim is what it continues from; anything an older lineage writes after
//!    it (a zombie that lost the partition without knowing) is ignored by every later restore.
//!    Then it writes its base (what its restore confirmed, per range) before it processes.
//! 1. A commit seals its writes and sends their data records, in the range's delivery epoch.
//! 2. Once the sink acknowledged every output and data record of that epoch, the marker goes to
//!    the first store's changelog; once acknowledged, to the next store's, and so on. The last
//!    store's marker therefore proves that every store has its data and marker.
//! 3. Then the state, the progress and each changelog position (the offset after the marker) are
//!    written in one WriteBatch, and the range reports its progress.
//!
//! # Restore
//!
//! The last store's changelog is read first and decides. In log order: a claim whose generation
//! is not below the accepted one makes its lineage the accepted one; data records wait for their
//! range's confirmation; a marker of the accepted lineage confirms that lineage's waiting data
//! (attempts up to its own) and becomes the range's newest complete commit; a base of the accepted
//! lineage confirms the waiting data of the commits it lists (per commit range and lineage, the
//! attempts up to the listed one) and drops every other older lineage's data. Data and markers of a lineage that is
//! not the accepted one when they appear are dropped. Everything dropped, and data still waiting
//! at the end, has its keys **repaired**: the first commit after the restore of the range that
//! holds the key (by the restored state, not the record's hash) rewrites its current value. Every other store then applies exactly the data of the commits the last store
//! confirmed. Each
//! range resumes from the changelog positions in its local progress, so an intact state dir
//! restores only the tail, and a missing (or untrusted) one restores from the start, as does a task
//! whose in-memory stores are gone with the process that held them.
//!
//! Only logged stores take part: a store built `with_logging_disabled` has no changelog, gets no
//! data records or markers, and the last *logged* store decides.
//!
//! # Why compaction cannot break this
//!
//! Compaction keeps the newest record per key, and restore ignores unconfirmed records; so an
//! unconfirmed record (the leftover of a commit that died, or a zombie's write) must not be the
//! newest record of its key for long, or compaction would delete the confirmed value below it.
//! Two things make sure it is not:
//! - the first restore that reads it repairs its key: the next commit writes the confirmed value
//!   again, after it, under a marker. Every owner restores before processing, and restores read
//!   every record after the last commit they know, so the leftovers of a crashed commit are
//!   repaired by the next owner's first commit;
//! - changelog topics are created with `min.compaction.lag.ms` (see `changelog.min.compaction.lag.ms`):
//!   the cleaner does not compact a record younger than that, so a confirmed value stays readable
//!   until its shadowing leftover is that old. An application that stays down longer than that
//!   right after crashing in the middle of a commit is the one case left.
//!
//! Claims and bases have keys of their own per lineage, so compaction never removes what orders
//! lineages or what a new lineage continues from. A marker's key is per (range, lineage): a
//! zombie's marker written after the next owner's claim can shadow the zombie lineage's last
//! legitimate marker, which is why the next owner writes its base: the base names that commit
//! by the range it was written under and confirms its data, whatever compaction removed. (A base
//! that named only the restorer's current ranges confirmed nothing of a commit made at another
//! factor: the model test found a key lost that way.)
//!
//! A zombie cannot make its own lineage win: it has no claim after the new owner's, and its
//! generation is older. What a zombie writes before it learns that it lost the partition is
//! ignored by every restore, and repaired like a leftover by the next restore that reads it.
//! In the deciding (last) store that holds even below its range's local checkpoint: a restore
//! reads that store from its oldest range checkpoint, and a range's checkpoint can pass a
//! zombie's write of a key through a commit of other keys (after a factor change, for one).
//! The other stores skip data below each range's checkpoint, as they cannot tell a zombie's
//! attempt there from a confirmed one.
//!
//! **The residual case**, closed only by transactions (`processing.guarantee=exactly_once_v2`):
//! a zombie's data record that no restore reads (every later restore starts from local
//! checkpoints past it; in a store other than the last, its own range's) stays unrepaired; once it is older than `min.compaction.lag.ms`, the
//! cleaner may drop the confirmed value it shadows, and a later restore from scratch would miss
//! that key. It takes a member paused past its session timeout in the middle of a commit, and
//! then no restore from scratch of that partition for longer than the lag. (A fix short of
//! transactions: the owner tracks the offsets it wrote since its claim and reads back, then
//! repairs, any offset in between that it did not write.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use rill_state::{Progress, StoreWrite};
use rill_topology::{Headers, KeyRange, RawRecord};

use super::{EngineError, TopicPartition};

/// Header that marks a range marker record.
pub const MARKER_HEADER: &str = "rill.marker";
/// Header that marks a claim record.
pub const CLAIM_HEADER: &str = "rill.claim";
/// Header that marks a base record.
pub const BASE_HEADER: &str = "rill.base";
/// Header of a data record: its [`CommitId`].
pub const COMMIT_HEADER: &str = "rill.c";

/// The changelog topic of `store`.
pub fn changelog_topic(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// Which commit wrote a data record: the range, the writer's lineage and the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitId {
    /// The key range whose commit wrote the record.
    pub range: KeyRange,
    /// The writer's lineage.
    pub lineage: u64,
    /// The commit attempt within the lineage.
    pub attempt: u64,
}

impl CommitId {
    /// Fixed 32-byte big-endian encoding: range start, range end, lineage, attempt.
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.range.start.to_be_bytes());
        b[8..16].copy_from_slice(&self.range.end.to_be_bytes());
        b[16..24].copy_from_slice(&self.lineage.to_be_bytes());
        b[24..].copy_from_slice(&self.attempt.to_be_bytes());
        b
    }

    /// Decodes [`CommitId::encode`]'s output; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<CommitId> {
        let b: &[u8; 32] = b.try_into().ok()?;
        let at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let range = KeyRange {
            start: at(0),
            end: at(8),
        };
        (range.start <= range.end).then_some(CommitId {
            range,
            lineage: at(16),
            attempt: at(24),
        })
    }
}

/// A member's claim on a task, written before it restores (see the module docs).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Claim {
    /// The new lineage.
    #[prost(fixed64, tag = "1")]
    pub lineage: u64,
    /// The consumer-group generation the member was assigned the task in.
    #[prost(int32, tag = "2")]
    pub generation: i32,
    /// The lineage whose committed state it continues (0: none known).
    #[prost(fixed64, tag = "3")]
    pub parent: u64,
}

/// The [`Base`] format that confirms data by [`Base::confirms`] (0: by [`Base::ranges`]).
pub const BASE_VERSION: u32 = 1;

/// What a new lineage continues from: per range, the progress of the newest complete commit its
/// restore found, and exactly which commits that state holds (written right after the restore,
/// before the lineage processes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Base {
    /// The new lineage.
    #[prost(fixed64, tag = "1")]
    pub lineage: u64,
    /// Per current range with any commit: its progress (composed from the commits that cover
    /// it when the factor changed, so its writer fields name one of them only).
    #[prost(message, repeated, tag = "2")]
    pub ranges: Vec<Progress>,
    /// Per (commit range, lineage) the restore confirmed since the last base it read: the
    /// highest complete attempt. Their markers may be compacted away by a zombie's later marker
    /// of the same key; these entries confirm their data instead.
    #[prost(message, repeated, tag = "3")]
    pub confirms: Vec<Confirmed>,
    /// [`BASE_VERSION`] when written by this format; 0 for a base without `confirms`.
    #[prost(uint32, tag = "4")]
    pub version: u32,
}

/// A complete commit of one range by one lineage, up to an attempt (an entry of [`Base`]).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Confirmed {
    /// First hash of the range the commits were written under.
    #[prost(fixed64, tag = "1")]
    pub range_start: u64,
    /// Last hash (inclusive) of that range.
    #[prost(fixed64, tag = "2")]
    pub range_end: u64,
    /// The lineage that wrote them.
    #[prost(fixed64, tag = "3")]
    pub lineage: u64,
    /// Every attempt of that lineage and range up to this one is complete.
    #[prost(uint64, tag = "4")]
    pub attempt: u64,
}

impl Confirmed {
    /// The range the commits were written under.
    pub fn range(&self) -> KeyRange {
        KeyRange {
            start: self.range_start,
            end: self.range_end,
        }
    }
}

/// The base record of `base`.
pub fn base_record(base: &Base) -> RawRecord {
    lineage_record(
        BASE_HEADER,
        base.lineage,
        prost::Message::encode_to_vec(base),
    )
}

/// The data record of one store write made by commit `id`: header `rill.c` = the commit id,
/// then the write's routing hash (8 bytes, big-endian).
pub fn data_record(id: &CommitId, write: StoreWrite) -> RawRecord {
    let mut header = Vec::with_capacity(40);
    header.extend_from_slice(&id.encode());
    header.extend_from_slice(&write.hash.to_be_bytes());
    let mut headers = Headers::with_capacity(1);
    headers.add(COMMIT_HEADER, header);
    RawRecord {
        key: Some(write.key),
        value: write.value,
        timestamp: 0,
        headers,
    }
}

/// The range marker of a commit with `progress`.
pub fn marker_record(progress: &Progress) -> RawRecord {
    let mut headers = Headers::new();
    headers.add(MARKER_HEADER, "1");
    RawRecord {
        key: Some(
            format!(
                "rill.marker/{:016x}-{:016x}/{:016x}",
                progress.range_start, progress.range_end, progress.lineage
            )
            .into_bytes(),
        ),
        value: Some(progress.to_bytes()),
        timestamp: 0,
        headers,
    }
}

/// The claim record of `claim`.
pub fn claim_record(claim: &Claim) -> RawRecord {
    lineage_record(
        CLAIM_HEADER,
        claim.lineage,
        prost::Message::encode_to_vec(claim),
    )
}

/// A record of kind `header` (claim or base) keyed by kind and lineage, so compaction never
/// removes it.
fn lineage_record(header: &str, lineage: u64, value: Vec<u8>) -> RawRecord {
    let mut headers = Headers::new();
    headers.add(header, "1");
    let kind = header.trim_start_matches("rill.");
    RawRecord {
        key: Some(format!("rill.{kind}/{lineage:016x}").into_bytes()),
        value: Some(value),
        timestamp: 0,
        headers,
    }
}

/// Reads changelog partitions (Kafka in the runtime; tests use memory).
pub trait ChangelogReader: Send + Sync {
    /// Calls `visit` with every record of `topic`/`partition` from offset `from` up to the end
    /// as of the call, in order; returns how many it visited. Stops with an error soon after
    /// `cancel` is set, also while waiting for the broker.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        cancel: &AtomicBool,
        visit: &mut dyn FnMut(u64, RawRecord) -> Result<(), EngineError>,
    ) -> Result<u64, EngineError>;
}

/// The error of a restore stopped by its cancel flag.
pub fn cancelled(topic: &str, partition: u32) -> EngineError {
    EngineError::Restore {
        topic: topic.to_string(),
        partition,
        message: "cancelled (the partition was revoked)".into(),
    }
}

/// A changelog record, by kind.
pub(super) enum Entry {
    Claim(Claim),
    Base(Base),
    Data { id: CommitId, write: StoreWrite },
    Marker(Progress),
}

pub(super) fn classify(
    topic: &str,
    partition: u32,
    offset: u64,
    record: RawRecord,
) -> Result<Entry, EngineError> {
    let headers = &record.headers;
    if headers.last(MARKER_HEADER).is_some() {
        let progress = Progress::from_bytes(record.value.as_deref().unwrap_or_default())
            .map_err(|e| corrupt(topic, partition, offset, e))?;
        return Ok(Entry::Marker(progress));
    }
    if headers.last(CLAIM_HEADER).is_some() {
        let claim = <Claim as prost::Message>::decode(record.value.as_deref().unwrap_or_default())
            .map_err(|e| corrupt(topic, partition, offset, format!("undecodable claim: {e}")))?;
        return Ok(Entry::Claim(claim));
    }
    if headers.last(BASE_HEADER).is_some() {
        let base = <Base as prost::Message>::decode(record.value.as_deref().unwrap_or_default())
            .map_err(|e| corrupt(topic, partition, offset, format!("undecodable base: {e}")))?;
        for p in &base.ranges {
            // The same checks as a marker's progress.
            Progress::from_bytes(&p.to_bytes())
                .map_err(|e| corrupt(topic, partition, offset, e))?;
        }
        if base.confirms.iter().any(|c| c.range_start > c.range_end) {
            return Err(corrupt(
                topic,
                partition,
                offset,
                "a base confirming an empty range".into(),
            ));
        }
        return Ok(Entry::Base(base));
    }
    let header = headers.last(COMMIT_HEADER).flatten().unwrap_or_default();
    let (id, hash) = header
        .split_first_chunk::<32>()
        .and_then(|(id, hash)| {
            Some((
                CommitId::decode(id)?,
                u64::from_be_bytes(hash.try_into().ok()?),
            ))
        })
        .ok_or_else(|| {
            corrupt(
                topic,
                partition,
                offset,
                "a data record without its commit id".into(),
            )
        })?;
    let Some(key) = record.key else {
        return Err(corrupt(
            topic,
            partition,
            offset,
            "a data record without a key".into(),
        ));
    };
    Ok(Entry::Data {
        id,
        write: StoreWrite {
            key,
            value: record.value,
            hash,
        },
    })
}

fn corrupt(topic: &str, partition: u32, offset: u64, detail: String) -> EngineError {
    EngineError::Config {
        key: "changelog",
        message: format!(
            "changelog `{topic}` partition {partition} offset {offset}: {detail}; \
             the changelog was written by something other than this rill version"
        ),
    }
}

/// Changelog records kept in memory, per (topic, partition), for tests; offsets survive
/// [`MemoryChangelog::compact`] as they do on a broker.
#[derive(Default)]
pub struct MemoryChangelog {
    /// Invariant: appends under the lock keep each partition in write order.
    logs: parking_lot::Mutex<HashMap<TopicPartition, Log>>,
}

/// One partition: its records with their offsets, and the next offset.
#[derive(Default)]
struct Log {
    next: u64,
    records: Vec<(u64, RawRecord)>,
}

impl MemoryChangelog {
    /// Appends `record` to `topic`/`partition`; returns its offset.
    pub fn append(&self, topic: &str, partition: u32, record: RawRecord) -> u64 {
        let mut logs = self.logs.lock();
        let log = logs
            .entry(TopicPartition::new(topic, partition))
            .or_default();
        let offset = log.next;
        log.next += 1;
        log.records.push((offset, record));
        offset
    }

    /// A copy of the records of `topic`/`partition` with their offsets, in order.
    pub fn records(&self, topic: &str, partition: u32) -> Vec<(u64, RawRecord)> {
        self.logs
            .lock()
            .get(&TopicPartition::new(topic, partition))
            .map(|l| l.records.clone())
            .unwrap_or_default()
    }

    /// Removes the records of `topic`/`partition` for which `drop` holds (tests simulate lost
    /// writes with it); offsets stay as they were.
    pub fn remove(
        &self,
        topic: &str,
        partition: u32,
        mut drop: impl FnMut(u64, &RawRecord) -> bool,
    ) {
        if let Some(log) = self
            .logs
            .lock()
            .get_mut(&TopicPartition::new(topic, partition))
        {
            log.records.retain(|(o, r)| !drop(*o, r));
        }
    }

    /// Log compaction as a broker does it: among the records below offset `below` (the cleaner's
    /// reach), keeps only the newest record of each key, and removes tombstones there too when
    /// `drop_tombstones` (after `delete.retention.ms`).
    pub fn compact(&self, topic: &str, partition: u32, below: u64, drop_tombstones: bool) {
        let mut logs = self.logs.lock();
        let Some(log) = logs.get_mut(&TopicPartition::new(topic, partition)) else {
            return;
        };
        // The cleaner's offset map covers only the cleanable part: a record at or above `below`
        // (younger than min.compaction.lag.ms) shadows nothing yet.
        let mut newest: HashMap<Vec<u8>, u64> = HashMap::new();
        for (o, r) in log.records.iter().filter(|(o, _)| *o < below) {
            if let Some(k) = &r.key {
                newest.insert(k.clone(), *o);
            }
        }
        log.records.retain(|(o, r)| {
            if *o >= below {
                return true;
            }
            let Some(k) = &r.key else { return true };
            newest.get(k) == Some(o) && !(drop_tombstones && r.value.is_none())
        });
    }
}

impl crate::sink::RecordSink for MemoryChangelog {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: crate::sink::Ticket,
    ) -> Result<(), crate::sink::SinkError> {
        let offset = self.append(topic, partition.unwrap_or(0), record);
        ticket.delivered(Ok(offset));
        Ok(())
    }
}

impl ChangelogReader for MemoryChangelog {
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        cancel: &AtomicBool,
        visit: &mut dyn FnMut(u64, RawRecord) -> Result<(), EngineError>,
    ) -> Result<u64, EngineError> {
        let records: Vec<(u64, RawRecord)> = self
            .logs
            .lock()
            .get(&TopicPartition::new(topic, partition))
            .map(|l| {
                l.records
                    .iter()
                    .filter(|(o, _)| *o >= from)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let n = records.len() as u64;
        for (offset, r) in records {
            if cancel.load(Ordering::Relaxed) {
                return Err(cancelled(topic, partition));
            }
            visit(offset, r)?;
        }
        Ok(n)
    }
}
