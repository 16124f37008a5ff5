//! Origins of repartitioned records, for de-duplication across a repartition topic.
//!
//! A replayed upstream range re-sends records into the repartition topic. Each record it sends
//! carries its origin in the `rill.origin` header: upstream partition, upstream range, input offset
//! and a sequence number within that offset. One upstream sub-task sends in offset order, so per
//! (upstream partition, upstream range) the origins reaching a downstream range only increase;
//! the downstream range keeps the highest one it applied (inside its progress record) and skips
//! anything at or below it. This requires deterministic upstream processing.

use rill_topology::{Headers, KeyRange};

/// Header that carries a record's origin.
pub const ORIGIN_HEADER: &str = "rill.origin";

/// Where a repartitioned record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
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
    /// The (partition, range) whose origins are ordered.
    pub fn source(&self) -> (u32, u64, u64) {
        (self.partition, self.range.start, self.range.end)
    }

    /// The position within its source, compared to decide duplicates.
    pub fn position(&self) -> (u64, u32) {
        (self.offset, self.seq)
    }

    /// Fixed 32-byte big-endian encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(&self.partition.to_be_bytes());
        b.extend_from_slice(&self.range.start.to_be_bytes());
        b.extend_from_slice(&self.range.end.to_be_bytes());
        b.extend_from_slice(&self.offset.to_be_bytes());
        b.extend_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// Decodes [`Origin::encode`]'s output; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Origin> {
        if b.len() != 32 {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Origin {
            partition: u32_at(0),
            range: KeyRange {
                start: u64_at(4),
                end: u64_at(12),
            },
            offset: u64_at(20),
            seq: u32_at(28),
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
        fn origin_round_trips(partition in any::<u32>(), s in any::<u64>(), e in any::<u64>(), offset in any::<u64>(), seq in any::<u32>()) {
            let o = Origin { partition, range: KeyRange { start: s, end: e }, offset, seq };
            prop_assert_eq!(Origin::decode(&o.encode()), Some(o));
        }
    }

    #[test]
    fn malformed_origin_is_ignored() {
        assert_eq!(Origin::decode(&[1, 2, 3]), None);
    }
}
