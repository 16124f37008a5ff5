//! Key hashing and key ranges: how records of one partition are split into sub-tasks.
//!
//! Every serialized key is hashed to a 64-bit value with [`key_hash`] (XXH3-64, seed 0). For a
//! parallelising factor `P`, the hash space `[0, 2^64)` is cut into `P` equal contiguous
//! [`KeyRange`]s, and a hash belongs to range `range_of(h, P) = (h * P) >> 64`. All records of a key
//! therefore reach the same range, in offset order, which is what keeps per-key order.
//!
//! State on disk and commit metadata depend on this function: it is identified by [`HASH_ID`],
//! which is recorded in every format that stores ranges. **Changing the hash breaks existing
//! state**; a new hash must get a new id.

use std::fmt;

/// Identifier of the key-hash function, stored with every persisted range (1 = XXH3-64, seed 0).
pub const HASH_ID: u32 = 1;

/// Identifier of routing by offset alone ([`null_key_hash`] of every record's offset, keyed or
/// not), which unordered sub-topologies without state use; their commit metadata records it so
/// that a run with the other routing does not read their range offsets as its own.
pub const OFFSET_HASH_ID: u32 = 2;

/// The stable 64-bit hash of serialized key bytes (XXH3-64 with seed 0).
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// A pseudo-hash for a record without a key, derived from its offset (SplitMix64 finaliser).
///
/// Null-keyed records have no per-key order to keep, so they are spread over all ranges by
/// offset; being a pure function of the offset, a replay routes them exactly as before.
pub fn null_key_hash(offset: u64) -> u64 {
    let mut z = offset.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A closed interval `[start, end]` of the 64-bit key-hash space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRange {
    /// First hash in the range.
    pub start: u64,
    /// Last hash in the range (inclusive).
    pub end: u64,
}

impl KeyRange {
    /// The whole hash space, the single range of `P = 1`.
    pub const FULL: KeyRange = KeyRange {
        start: 0,
        end: u64::MAX,
    };

    /// The `index`-th of `p` equal contiguous ranges.
    ///
    /// # Panics
    /// If `p == 0` or `index >= p`; callers validate the factor first.
    pub fn nth(index: usize, p: usize) -> KeyRange {
        assert!(p > 0 && index < p, "range {index} of {p} does not exist");
        // Range i holds every h with i * 2^64 <= h * p < (i + 1) * 2^64.
        let bound = |i: u128| -> u128 { (i << 64).div_ceil(p as u128) };
        let start = bound(index as u128);
        let end = bound(index as u128 + 1) - 1;
        KeyRange {
            start: start as u64,
            end: end as u64,
        }
    }

    /// Whether `hash` lies in this range.
    pub fn contains(&self, hash: u64) -> bool {
        self.start <= hash && hash <= self.end
    }

    /// Whether the two ranges share at least one hash.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl fmt::Debug for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:016x}..={:016x}]", self.start, self.end)
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:016x}", self.start, self.end)
    }
}

/// The partition Kafka's default partitioner (the Java producer's, librdkafka's
/// `murmur2_random`) gives a keyed record among `partitions`: `toPositive(murmur2(key)) % n`.
/// Repartition topics read beside user topics use it, so a re-keyed stream meets a table whose
/// topic a Kafka producer wrote.
pub fn kafka_partition(key: &[u8], partitions: u32) -> u32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// Kafka's `Utils.murmur2` (seed 0x9747b28c).
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() == 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The `p` equal contiguous ranges of the hash space, in hash order.
pub fn ranges(p: usize) -> Vec<KeyRange> {
    (0..p).map(|i| KeyRange::nth(i, p)).collect()
}

/// The index of the range of `p` that holds `hash`.
pub fn range_of(hash: u64, p: usize) -> usize {
    ((hash as u128 * p as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    #[test]
    fn murmur2_is_kafkas() {
        // Kafka's UtilsTest.testMurmur2 cases.
        for (key, java) in [
            (&b"21"[..], -973932308i32),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ] {
            assert_eq!(
                super::murmur2(key) as i32,
                java,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
        assert_eq!(
            kafka_partition(b"21", 7),
            ((-973932308i32 & 0x7fff_ffff) % 7) as u32
        );
    }

    use super::*;
    use proptest::prelude::*;

    /// Pins the hash: a dependency bump that changes it must fail here, not corrupt state.
    #[test]
    fn key_hash_is_pinned_by_golden_values() {
        assert_eq!(key_hash(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(key_hash(b"a"), 0xe6c6_32b6_1e96_4e1f);
        assert_eq!(key_hash(b"hello"), 0x9555_e855_5c62_dcfd);
        assert_eq!(key_hash(b"rill"), 0x7eea_c07a_3eb2_7cdc);
    }

    #[test]
    fn one_range_is_the_full_space() {
        assert_eq!(ranges(1), vec![KeyRange::FULL]);
    }

    #[test]
    fn ranges_of_two_split_at_the_middle() {
        let r = ranges(2);
        assert_eq!(r[0].end, (1u64 << 63) - 1);
        assert_eq!(r[1].start, 1u64 << 63);
    }

    proptest! {
        #[test]
        fn ranges_cover_the_space_contiguously(p in 1usize..5000) {
            let r = ranges(p);
            prop_assert_eq!(r.len(), p);
            prop_assert_eq!(r[0].start, 0);
            prop_assert_eq!(r[p - 1].end, u64::MAX);
            for w in r.windows(2) {
                prop_assert!(w[0].start <= w[0].end);
                prop_assert_eq!(w[0].end.wrapping_add(1), w[1].start);
                prop_assert!(!w[0].overlaps(&w[1]));
            }
        }

        #[test]
        fn every_hash_is_in_exactly_the_range_of_range_of(h in any::<u64>(), p in 1usize..5000) {
            let r = ranges(p);
            let i = range_of(h, p);
            prop_assert!(i < p);
            prop_assert!(r[i].contains(h));
            prop_assert_eq!(r.iter().filter(|x| x.contains(h)).count(), 1);
        }

        #[test]
        fn range_bounds_map_to_their_own_range(p in 1usize..5000, i in 0usize..5000) {
            let i = i % p;
            let r = KeyRange::nth(i, p);
            prop_assert_eq!(range_of(r.start, p), i);
            prop_assert_eq!(range_of(r.end, p), i);
        }

        #[test]
        fn a_key_always_maps_to_one_range(key in proptest::collection::vec(any::<u8>(), 0..64), p in 1usize..64) {
            prop_assert_eq!(range_of(key_hash(&key), p), range_of(key_hash(&key.clone()), p));
        }
    }
}
