//! The progress record of a sub-task, written in the same WriteBatch as its state.
//!
//! prost-encoded from hand-written structs (no `.proto` file). Field tags are part of the on-disk
//! format: never reuse or renumber one; add new fields with new tags and bump
//! [`PROGRESS_VERSION`] only for changes an older reader must refuse.

use rill_topology::keyrange::{KeyRange, HASH_ID};

/// The version of the progress record this crate writes and reads (2: commit identity, lineage,
/// origins keyed by topic, stream time).
pub const PROGRESS_VERSION: u32 = 2;

/// A sub-task's durable progress: how far its range of one input partition has been applied.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Progress {
    /// Format version of this record ([`PROGRESS_VERSION`]).
    #[prost(uint32, tag = "1")]
    pub version: u32,
    /// Id of the key-hash function the range bounds refer to ([`HASH_ID`]).
    #[prost(uint32, tag = "2")]
    pub hash_id: u32,
    /// First hash of the sub-task's key range.
    #[prost(fixed64, tag = "3")]
    pub range_start: u64,
    /// Last hash (inclusive) of the sub-task's key range.
    #[prost(fixed64, tag = "4")]
    pub range_end: u64,
    /// Per source topic: every record of this range with an offset below `next_offset` has been
    /// applied (a sub-topology may read several topics of the same partition).
    #[prost(message, repeated, tag = "5")]
    pub offsets: Vec<TopicOffset>,
    /// Unused (an early single-changelog position; see `changelogs`). Never reuse the tag.
    #[prost(uint64, optional, tag = "6")]
    pub changelog_offset: Option<u64>,
    /// Highest origin applied per (repartition topic, upstream topic, partition, range), for
    /// repartition de-duplication.
    #[prost(message, repeated, tag = "7")]
    pub origins: Vec<Origin>,
    /// Per store changelog topic: the offset after this commit's range marker (restore resumes
    /// there). Empty when changelogs are off.
    #[prost(message, repeated, tag = "8")]
    pub changelogs: Vec<TopicOffset>,
    /// The commit attempt within its lineage (1 for the first); every changelog record of the
    /// commit carries it, so restore keeps exactly the data its marker confirms.
    #[prost(uint64, tag = "9")]
    pub attempt: u64,
    /// The lineage (one owner's claim on the task) that wrote this commit.
    #[prost(fixed64, tag = "10")]
    pub lineage: u64,
    /// The lineage the writer continued from when it claimed the task (0: none).
    #[prost(fixed64, tag = "11")]
    pub parent_lineage: u64,
    /// The consumer-group generation of the writer's claim.
    #[prost(int32, tag = "12")]
    pub generation: i32,
    /// The range's stream time (largest record timestamp applied), if any record was.
    #[prost(sint64, optional, tag = "13")]
    pub stream_time: Option<i64>,
    /// Id of the Kafka cluster the offsets refer to (empty: unknown, e.g. the TestDriver).
    #[prost(string, tag = "14")]
    pub cluster_id: String,
    /// The lineage that owns the local state now: the writer, or the member that restored it
    /// since (local records only; the next owner trusts the state only if it follows this one).
    #[prost(fixed64, tag = "15")]
    pub owner: u64,
    /// The lineage the owner continued from.
    #[prost(fixed64, tag = "16")]
    pub owner_parent: u64,
    /// Offsets this range carries over from the ranges it was split or merged from: parts of
    /// the range that had applied further than `offsets` says (see [`crate::carry`]).
    #[prost(message, repeated, tag = "17")]
    pub carried: Vec<CarriedOffset>,
    /// Per versioned store: the range's observed stream time (the largest timestamp put).
    #[prost(message, repeated, tag = "18")]
    pub store_times: Vec<StoreTime>,
}

/// The observed stream time of one store in a range.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct StoreTime {
    /// The store's name.
    #[prost(string, tag = "1")]
    pub store: String,
    /// The largest timestamp put into the store in this range.
    #[prost(sint64, tag = "2")]
    pub time: i64,
}

/// Part of a range that had applied a source topic further than the range as a whole.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct CarriedOffset {
    /// The source topic (resolved name).
    #[prost(string, tag = "1")]
    pub topic: String,
    /// First hash of the part.
    #[prost(fixed64, tag = "2")]
    pub range_start: u64,
    /// Last hash (inclusive) of the part.
    #[prost(fixed64, tag = "3")]
    pub range_end: u64,
    /// Every record of the part below this offset has been applied.
    #[prost(uint64, tag = "4")]
    pub next_offset: u64,
    /// The stream time of the range the part came from: the range takes it once it reaches
    /// `next_offset` (before, it re-reads records that range had seen, whose windows that time
    /// would close too early).
    #[prost(sint64, optional, tag = "5")]
    pub stream_time: Option<i64>,
}

/// How far a range has applied one source topic.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct TopicOffset {
    /// The source topic (resolved name).
    #[prost(string, tag = "1")]
    pub topic: String,
    /// Every record of the range below this offset has been applied.
    #[prost(uint64, tag = "2")]
    pub next_offset: u64,
    /// Records above `next_offset` that were applied too (async stages complete out of offset
    /// order), as gaps: the first is its offset minus `next_offset`, each next one the distance
    /// from the one before. Read them with [`TopicOffset::applied_above`].
    #[prost(uint64, repeated, tag = "3")]
    pub applied_gaps: Vec<u64>,
}

impl TopicOffset {
    /// How far a range applied `topic`: everything below `next_offset`, and `applied` above it
    /// (in increasing order; offsets at or below `next_offset` are left out).
    pub fn with_applied(
        topic: String,
        next_offset: u64,
        applied: impl IntoIterator<Item = u64>,
    ) -> Self {
        let mut prev = next_offset;
        let applied_gaps = applied
            .into_iter()
            .filter(|&o| o > next_offset)
            .map(|o| {
                let gap = o - prev;
                prev = o;
                gap
            })
            .collect();
        TopicOffset {
            topic,
            next_offset,
            applied_gaps,
        }
    }

    /// The offsets above `next_offset` that were applied, in increasing order.
    pub fn applied_above(&self) -> impl Iterator<Item = u64> + '_ {
        self.applied_gaps.iter().scan(self.next_offset, |o, gap| {
            *o = o.saturating_add(*gap);
            Some(*o)
        })
    }
}

/// The highest origin a downstream range applied from one upstream (topic, partition, range)
/// through one repartition topic.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Origin {
    /// Upstream input partition.
    #[prost(uint32, tag = "1")]
    pub partition: u32,
    /// First hash of the upstream range.
    #[prost(fixed64, tag = "2")]
    pub range_start: u64,
    /// Last hash (inclusive) of the upstream range.
    #[prost(fixed64, tag = "3")]
    pub range_end: u64,
    /// Upstream input offset of the highest record applied.
    #[prost(uint64, tag = "4")]
    pub offset: u64,
    /// Sequence number of that record within its upstream offset.
    #[prost(uint32, tag = "5")]
    pub seq: u32,
    /// Id of the upstream input topic (hash of its resolved name).
    #[prost(fixed64, tag = "6")]
    pub source_topic: u64,
    /// Id of the repartition topic the records arrived on (hash of its resolved name).
    #[prost(fixed64, tag = "7")]
    pub via_topic: u64,
    /// First downstream routing hash the entry covers (records routed to other hashes of the
    /// range have their own entry after a split or merge).
    #[prost(fixed64, tag = "8")]
    pub lo: u64,
    /// Last downstream routing hash (inclusive) the entry covers.
    #[prost(fixed64, tag = "9")]
    pub hi: u64,
}

impl Progress {
    /// A current-version progress record for `range` with one source topic's offset.
    pub fn new(range: KeyRange, topic: &str, next_offset: u64) -> Self {
        Progress {
            version: PROGRESS_VERSION,
            hash_id: HASH_ID,
            range_start: range.start,
            range_end: range.end,
            offsets: vec![TopicOffset::with_applied(
                topic.to_string(),
                next_offset,
                [],
            )],
            changelog_offset: None,
            origins: Vec::new(),
            changelogs: Vec::new(),
            attempt: 0,
            lineage: 0,
            parent_lineage: 0,
            generation: 0,
            stream_time: None,
            cluster_id: String::new(),
            owner: 0,
            owner_parent: 0,
            carried: Vec::new(),
            store_times: Vec::new(),
        }
    }

    /// The changelog position recorded for changelog topic `topic`.
    pub fn changelog_position(&self, topic: &str) -> Option<u64> {
        self.changelogs
            .iter()
            .find(|o| o.topic == topic)
            .map(|o| o.next_offset)
    }

    /// The next offset recorded for source topic `topic`.
    pub fn next_offset(&self, topic: &str) -> Option<u64> {
        self.offsets
            .iter()
            .find(|o| o.topic == topic)
            .map(|o| o.next_offset)
    }

    /// The key range this record is about.
    pub fn range(&self) -> KeyRange {
        KeyRange {
            start: self.range_start,
            end: self.range_end,
        }
    }

    /// The encoded record.
    pub fn to_bytes(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }

    /// Decodes a record and checks its version and hash id; the error says what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let p = <Progress as prost::Message>::decode(bytes)
            .map_err(|e| format!("undecodable progress record: {e}"))?;
        if p.version != PROGRESS_VERSION {
            return Err(format!(
                "progress record version {} (this rill reads version {PROGRESS_VERSION}); \
                 it was written by another rill version",
                p.version
            ));
        }
        if p.hash_id != HASH_ID {
            return Err(format!(
                "progress record uses key-hash id {} (this rill uses {HASH_ID})",
                p.hash_id
            ));
        }
        if p.range_start > p.range_end {
            return Err(format!(
                "progress record has an empty range {:016x}-{:016x}",
                p.range_start, p.range_end
            ));
        }
        Ok(p)
    }
}

impl CarriedOffset {
    /// The part of the range it covers.
    pub fn range(&self) -> KeyRange {
        KeyRange {
            start: self.range_start,
            end: self.range_end,
        }
    }
}

impl Origin {
    /// The downstream hashes the entry covers.
    pub fn covers(&self) -> KeyRange {
        KeyRange {
            start: self.lo,
            end: self.hi,
        }
    }

    /// The upstream key range.
    pub fn range(&self) -> KeyRange {
        KeyRange {
            start: self.range_start,
            end: self.range_end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Progress {
        let mut p = Progress::new(KeyRange::nth(3, 8), "t", 12_345);
        p.changelog_offset = Some(77);
        p.origins.push(Origin {
            partition: 2,
            range_start: 0,
            range_end: u64::MAX,
            offset: 9,
            seq: 4,
            source_topic: 11,
            via_topic: 12,
            lo: 0,
            hi: u64::MAX,
        });
        p.lineage = 0xfeed;
        p.stream_time = Some(-5);
        p
    }

    #[test]
    fn round_trips() {
        let p = sample();
        let q = Progress::from_bytes(&p.to_bytes()).unwrap();
        assert!(p == q);
        assert_eq!(q.range(), KeyRange::nth(3, 8));
        assert_eq!(q.origins[0].range(), KeyRange::FULL);
    }

    #[test]
    fn other_versions_and_hashes_are_refused() {
        let mut p = sample();
        p.version = 1;
        assert!(Progress::from_bytes(&p.to_bytes())
            .unwrap_err()
            .contains("version 1"));
        let mut p = sample();
        p.hash_id = 9;
        assert!(Progress::from_bytes(&p.to_bytes())
            .unwrap_err()
            .contains("key-hash id 9"));
        assert!(Progress::from_bytes(&[0xff, 0xff, 0xff]).is_err());
    }
}
