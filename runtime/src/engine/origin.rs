//! Origins of repartitioned records, for de-duplication across a repartition topic.
//!
//! A replayed upstream range re-sends records into the repartition topic. Each record it sends
//! carries its origin in the `rill.origin` header: the upstream input topic (by [`topic_id`]),
//! partition and key range, the input offset and a sequence number within that offset.
//!
//! One upstream sub-task processes one input topic's records in offset order and sends in order,
//! so per **origin source** (upstream input topic, partition, range) the origins arriving on one
//! repartition topic only increase. A downstream range keeps the highest origin it applied per
//! (repartition topic read, origin source) inside its progress record and skips anything at or
//! below it. Both parts of that key matter: two input topics of one sub-topology have unrelated
//! offsets (a merge), and one upstream record may write to two repartition topics that one
//! downstream range reads (their origins interleave).
//!
//! This requires deterministic upstream processing: the same input yields the same outputs in the
//! same order. Outputs of wall-clock punctuations depend on time, not on input, so they carry no
//! origin and are applied at least once.

use rill_topology::{key_hash, Headers, KeyRange};

/// Header that carries a record's origin.
pub const ORIGIN_HEADER: &str = "rill.origin";

/// Length of an encoded origin.
const ENCODED_LEN: usize = 40;

/// The stable id of a resolved topic name in origins and progress records (XXH3-64 of the name;
/// changing it breaks the de-duplication state of running applications).
pub fn topic_id(name: &str) -> u64 {
    key_hash(name.as_bytes())
}

/// The origin source whose positions are ordered: (upstream topic id, partition, range start, end).
pub type OriginSource = (u64, u32, u64, u64);

/// Where a repartitioned record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// Upstream input topic ([`topic_id`] of its resolved name).
    pub topic: u64,
    /// Upstream input partition.
    pub partition: u32,
    /// Upstream key range.
    pub range: KeyRange,
    /// Upstream input offset.
    pub offset: u64,
    /// Position among the records that input offset produced.
    pub seq: u32,
}

impl Origin {
    /// The upstream (topic, partition, range) whose origins are ordered.
    pub fn source(&self) -> OriginSource {
        (self.topic, self.partition, self.range.start, self.range.end)
    }

    /// The position within its source, compared to decide duplicates.
    pub fn position(&self) -> (u64, u32) {
        (self.offset, self.seq)
    }

    /// Fixed 40-byte big-endian encoding: topic, partition, range start, range end, offset, seq.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ENCODED_LEN);
        b.extend_from_slice(&self.topic.to_be_bytes());
        b.extend_from_slice(&self.partition.to_be_bytes());
        b.extend_from_slice(&self.range.start.to_be_bytes());
        b.extend_from_slice(&self.range.end.to_be_bytes());
        b.extend_from_slice(&self.offset.to_be_bytes());
        b.extend_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// Decodes [`Origin::encode`]'s output; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Origin> {
        if b.len() != ENCODED_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Origin {
            topic: u64_at(0),
            partition: u32_at(8),
            range: KeyRange {
                start: u64_at(12),
                end: u64_at(20),
            },
            offset: u64_at(28),
            seq: u32_at(36),
        })
    }

    /// Reads the origin header of `headers`, if present and well-formed.
    pub fn from_headers(headers: &Headers) -> Option<Origin> {
        headers
            .last(ORIGIN_HEADER)
            .flatten()
            .and_then(Origin::decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn origin_round_trips(topic in any::<u64>(), partition in any::<u32>(), s in any::<u64>(), e in any::<u64>(), offset in any::<u64>(), seq in any::<u32>()) {
            let o = Origin { topic, partition, range: KeyRange { start: s, end: e }, offset, seq };
            prop_assert_eq!(Origin::decode(&o.encode()), Some(o));
        }
    }

    #[test]
    fn malformed_origin_is_ignored() {
        assert_eq!(Origin::decode(&[1, 2, 3]), None);
        assert_eq!(
            Origin::decode(&[0; 32]),
            None,
            "the 32-byte layout of rill 0.1"
        );
    }

    #[test]
    fn topic_ids_are_pinned() {
        // Stored in progress records: a change here must be a deliberate format change.
        assert_eq!(topic_id("orders"), key_hash(b"orders"));
        assert_ne!(topic_id("a"), topic_id("c"));
    }
}
