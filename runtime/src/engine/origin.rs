//! Origins of repartitioned records, for de-duplication across a repartition topic.
//!
//! A replayed upstream range re-sends records into the repartition topic. Each record it sends
//! carries its origin in the `rill.origin` header: the upstream input topic (by [`topic_id`]),
//! partition and key range, the routing hash of the upstream input record, the input offset and
//! a sequence number within that offset. (offset, seq) is the **position**: the same input
//! record yields the same positions whichever range processes it.
//!
//! One upstream sub-task processes one input topic's records in offset order and sends in order,
//! so per **origin source** (upstream input topic, partition, range) the positions arriving on one
//! repartition topic only increase. A downstream range keeps, per (repartition topic read, input
//! topic, partition), entries of (upstream range, downstream hashes covered, highest position
//! applied) inside its progress record, and skips a record whose position is at or below that of
//! an entry whose upstream range holds the record's upstream hash and whose downstream interval
//! holds its own routing hash. Two input topics of one sub-topology have unrelated offsets (a
//! merge), and one upstream record may write to two repartition topics that one downstream range
//! reads (their origins interleave): hence the topic and repartition topic in the key.
//!
//! When the factor changes, upstream ranges change (an entry of an old upstream range still
//! covers the records of the new ranges inside it: positions are the same) and downstream ranges
//! change (entries keep their downstream interval, clipped; see `rill_state::carry`).
//!
//! This requires deterministic upstream processing: the same input yields the same outputs in the
//! same order. Outputs of wall-clock punctuations depend on time, not on input, so they carry no
//! origin and are applied at least once. So do the outputs of a sub-topology with an async
//! stage, which completes records out of offset order; it also de-duplicates none of its
//! repartition inputs, since it applies them out of position order: behind or inside it, a
//! replay under `at_least_once` is applied at least once.

use rill_topology::{key_hash, Headers, KeyRange};

/// Header that carries a record's origin.
pub const ORIGIN_HEADER: &str = "rill.origin";

/// Length of an encoded origin.
const ENCODED_LEN: usize = 48;

/// The stable id of a resolved topic name in origins and progress records (XXH3-64 of the name;
/// changing it breaks the de-duplication state of running applications).
pub fn topic_id(name: &str) -> u64 {
    key_hash(name.as_bytes())
}

/// Where a repartitioned record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// Upstream input topic ([`topic_id`] of its resolved name).
    pub topic: u64,
    /// Upstream input partition.
    pub partition: u32,
    /// Upstream key range.
    pub range: KeyRange,
    /// Routing hash of the upstream input record.
    pub hash: u64,
    /// Upstream input offset.
    pub offset: u64,
    /// Position among the records that input offset produced.
    pub seq: u32,
}

impl Origin {
    /// The position within its source, compared to decide duplicates.
    pub fn position(&self) -> (u64, u32) {
        (self.offset, self.seq)
    }

    /// Fixed 48-byte big-endian encoding: topic, partition, range start, range end, hash,
    /// offset, seq.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ENCODED_LEN);
        b.extend_from_slice(&self.topic.to_be_bytes());
        b.extend_from_slice(&self.partition.to_be_bytes());
        b.extend_from_slice(&self.range.start.to_be_bytes());
        b.extend_from_slice(&self.range.end.to_be_bytes());
        b.extend_from_slice(&self.hash.to_be_bytes());
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
            hash: u64_at(28),
            offset: u64_at(36),
            seq: u32_at(44),
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

/// What a downstream range keeps origins per: (repartition source index, upstream topic id,
/// upstream partition).
pub type OriginKey = (usize, u64, u32);

/// The highest position a downstream range applied from one upstream range, for the
/// downstream hashes it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginEntry {
    /// The upstream range whose positions these are.
    pub upstream: KeyRange,
    /// The downstream routing hashes the entry speaks for.
    pub covers: KeyRange,
    /// The highest (offset, seq) applied.
    pub position: (u64, u32),
}

/// Whether a record with origin `o`, routed to downstream hash `hash`, was applied already.
pub fn is_duplicate(entries: &[OriginEntry], o: &Origin, hash: u64) -> bool {
    entries.iter().any(|e| {
        e.upstream.contains(o.hash) && e.covers.contains(hash) && o.position() <= e.position
    })
}

/// Records that a record with origin `o`, routed to downstream hash `hash` of `range`, was
/// applied. Once a position is above every entry of its upstream range, those entries fold into
/// one that covers the whole downstream range (positions only grow per upstream range).
pub fn record_applied(entries: &mut Vec<OriginEntry>, o: &Origin, hash: u64, range: KeyRange) {
    let same = |e: &OriginEntry| e.upstream == o.range;
    if entries
        .iter()
        .filter(|e| same(e))
        .all(|e| e.position < o.position())
    {
        entries.retain(|e| !same(e));
        entries.push(OriginEntry {
            upstream: o.range,
            covers: range,
            position: o.position(),
        });
        return;
    }
    match entries
        .iter_mut()
        .find(|e| same(e) && e.covers.contains(hash))
    {
        Some(e) => e.position = e.position.max(o.position()),
        None => entries.push(OriginEntry {
            upstream: o.range,
            covers: KeyRange {
                start: hash,
                end: hash,
            },
            position: o.position(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rill_topology::ranges;

    proptest! {
        #[test]
        fn origin_round_trips(topic in any::<u64>(), partition in any::<u32>(), s in any::<u64>(), e in any::<u64>(), hash in any::<u64>(), offset in any::<u64>(), seq in any::<u32>()) {
            let o = Origin { topic, partition, range: KeyRange { start: s, end: e }, hash, offset, seq };
            prop_assert_eq!(Origin::decode(&o.encode()), Some(o));
        }

        /// Records of one upstream source arrive in position order at one downstream range:
        /// each is applied once, whatever the upstream and downstream ranges were when it was
        /// first applied (replays after factor changes).
        #[test]
        fn a_replay_under_other_ranges_is_recognised_record_by_record(
            up_before in 1usize..5,
            up_after in 1usize..5,
            hashes in proptest::collection::vec((any::<u64>(), any::<u64>()), 1..40),
            applied_before in 0usize..40,
        ) {
            let down = KeyRange::FULL;
            let record = |i: usize, up_p: usize| {
                let (uh, _) = hashes[i];
                Origin {
                    topic: 1,
                    partition: 0,
                    range: ranges(up_p)[rill_topology::range_of(uh, up_p)],
                    hash: uh,
                    offset: i as u64,
                    seq: 0,
                }
            };
            let mut entries = Vec::new();
            let applied_before = applied_before.min(hashes.len());
            for (i, &(_, dh)) in hashes.iter().enumerate().take(applied_before) {
                let o = record(i, up_before);
                prop_assert!(!is_duplicate(&entries, &o, dh));
                record_applied(&mut entries, &o, dh, down);
            }
            // The upstream factor changed; it replays from the start.
            for (i, &(_, dh)) in hashes.iter().enumerate() {
                let o = record(i, up_after);
                let dup = is_duplicate(&entries, &o, dh);
                prop_assert_eq!(dup, i < applied_before, "record {}", i);
                if !dup {
                    record_applied(&mut entries, &o, dh, down);
                }
            }
        }
    }

    #[test]
    fn malformed_origin_is_ignored() {
        assert_eq!(Origin::decode(&[1, 2, 3]), None);
        assert_eq!(
            Origin::decode(&[0; 40]),
            None,
            "the layout without the hash"
        );
    }

    #[test]
    fn topic_ids_are_pinned() {
        // Stored in progress records: a change here must be a deliberate format change.
        assert_eq!(topic_id("orders"), key_hash(b"orders"));
        assert_ne!(topic_id("a"), topic_id("c"));
    }
}
