//! The commit metadata codec: every key range's next offset, carried in a Kafka offset commit.
//!
//! When rill commits a partition's low watermark `base` to Kafka, the commit's metadata string
//! carries, for every key range `r` of the partition, `next[r]`: every record of range `r` below
//! `next[r]` has been processed (see "The range commit protocol" in DESIGN.md). On assignment a
//! task resumes at `base` and skips the records whose range already processed them.
//!
//! # Wire format, version 1 (the on-the-wire contract)
//!
//! The metadata string is ASCII text:
//!
//! ```text
//! rill:<base64>
//! ```
//!
//! - `rill:` is a literal prefix ([`PREFIX`]); text without it (including the empty string) is
//!   somebody else's metadata and decodes to [`MetadataError::NotRill`].
//! - `<base64>` is the standard alphabet of RFC 4648 (`A–Z a–z 0–9 + /`) with `=` padding, no
//!   line breaks, no whitespace. Decoding is strict (non-canonical padding is rejected).
//! - The whole text, prefix included, is at most [`MAX_METADATA_BYTES`] (4096) bytes, the broker
//!   default of `offset.metadata.max.bytes`; a broker rejects longer metadata with
//!   `OFFSET_METADATA_TOO_LARGE`.
//!
//! The base64 decodes to one protobuf (proto3) message, written here without a `.proto` file:
//!
//! ```text
//! message CommitMetadata {
//!   uint32 version = 1;                      // 1
//!   uint32 hash_id = 2;                      // how records were routed to ranges (1, 2)
//!   repeated fixed64 range_starts = 3;       // packed; start of each key range, in hash order
//!   repeated uint64 next_offset_deltas = 4;  // packed varints; next[r] - base, same order
//!   fixed64 lineage = 5;                     // the task's lineage (stateful tasks), else absent
//!   repeated Applied applied = 6;            // records applied above a range's next offset
//!   bool handed_over = 7;                    // the owner processed nothing past this commit
//! }
//! message Applied {
//!   uint32 range = 1;                        // index into range_starts
//!   // Exactly one of these three forms (the encoder writes the shortest):
//!   repeated uint64 gaps = 2;                // packed; first offset - next[range], then each
//!                                            // offset - the one before (all >= 1)
//!   repeated uint64 runs = 3;                // packed pairs (skip, length), both >= 1: a run of
//!                                            // `length` consecutive offsets starting `skip`
//!                                            // after the end of the run before (the first:
//!                                            // after next[range])
//!   bytes bitmap = 4;                        // bit i (least significant bit first in each
//!                                            // byte) set: offset next[range] + 1 + i applied
//! }
//! ```
//!
//! - **Version.** A decoder first reads field 1 alone (ignoring every other field) and rejects any
//!   version other than 1 with [`MetadataError::UnknownVersion`]; a missing (or zero) version is
//!   [`MetadataError::Malformed`].
//!   A later version keeps field 1 as `uint32 version` and may change everything else.
//! - **Hash id.** How records were assigned to ranges: [`HASH_ID`] (1, the XXH3-64 key hash) or
//!   [`OFFSET_HASH_ID`] (2, a hash of the offset alone: unordered sub-topologies without state).
//!   A decoder rejects any other id with [`MetadataError::UnknownHashId`]; the reader compares
//!   the id with its own routing before it trusts the range offsets.
//! - **Ranges.** There is one range per entry of `range_starts` (at least one). The ranges are the
//!   closed intervals `[start_i, start_{i+1} - 1]`, the last one ending at `u64::MAX`: they are
//!   contiguous and cover the whole 64-bit hash space, so the starts alone give explicit bounds
//!   that do not depend on the parallelising factor. `range_starts[0]` must be 0 and the starts
//!   must be strictly increasing; anything else is [`MetadataError::Malformed`].
//! - **Next offsets.** `next_offset_deltas` has exactly one entry per range:
//!   `next[r] = base + next_offset_deltas[r]`, where `base` is the offset committed in the same
//!   commit (the partition's low watermark, which is never above any `next[r]`). A sum that
//!   overflows `u64` is malformed.
//! - **Lineage.** The lineage that owns the task when it commits (see
//!   `rill_runtime::engine::changelog`): the group coordinator fences offset commits, so the
//!   next owner learns from it which member's local state may still be trusted. Absent (0) for
//!   stateless tasks.
//! - **Applied.** Records of a range above its next offset that were applied too (an async
//!   stage completes records out of offset order): a resuming range skips them as well. At most
//!   one entry per range; a range without one applied nothing above its next offset. Gaps suit
//!   sparse offsets (a range of many: its records are a fraction of the partition's), runs a few
//!   stuck records below many completed ones, the bitmap a dense window with many holes. Version-1
//!   readers that predate the field ignore it and process those records again (at least once);
//!   readers that predate `runs` and `bitmap` (rill before 2026-12-04) read such an entry as
//!   empty, with the same effect.
//! - **Handed over.** Set by a commit that ends an ownership cleanly (a revoke that drained, a
//!   clean stop): the committing owner processed nothing past it. The next owner's stores then
//!   answer queries as soon as they run; after any other last commit they wait until the task
//!   has taken the input up to its end at assignment (the owner may have answered past its
//!   commit). Readers that predate the field ignore it.
//! - **Other fields** are ignored, as protobuf decoding does, so a writer may add fields without a
//!   new version as long as version-1 readers may ignore them. [`encode`] writes fields 1–7 in
//!   order (field 6 once per range that lists offsets, the others at most once), the repeated
//!   scalars packed (proto3 encoding: a field holding 0 is omitted).
//!
//! Size: each range costs 8 bytes for its start plus 1–10 bytes for its delta (1 byte below 128,
//! 2 below 16384, 9 for any delta below 2^63), then base64 adds a third. At most 339 ranges fit
//! in 4096 bytes (all deltas below 128), 305 with deltas below 16384, and 179 for any Kafka
//! offsets (see the `max_ranges_that_fit` test). When the ranges of a partition do not fit,
//! [`encode`] returns [`MetadataError::TooLarge`] and the committer commits the low watermark
//! alone.
//!
//! Because the bounds are explicit, metadata written under one parallelising factor is still
//! usable after the factor changes: [`RangeOffsets::next_for`] looks up a hash in the old ranges.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use prost::Message as _;
use rill_topology::{KeyRange, HASH_ID, OFFSET_HASH_ID};

/// The largest metadata text a broker accepts by default (`offset.metadata.max.bytes`).
pub const MAX_METADATA_BYTES: usize = 4096;

/// The text prefix that marks rill commit metadata.
pub const PREFIX: &str = "rill:";

/// The format version written by [`encode`] and the only one [`decode`] accepts.
pub const VERSION: u32 = 1;

/// The next offset of every key range of one partition, as carried in commit metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeOffsets {
    /// Id of the key-hash function the ranges refer to ([`HASH_ID`]).
    pub hash_id: u32,
    /// Each key range, in hash order, with its next offset (`next[r]`).
    pub ranges: Vec<(KeyRange, u64)>,
    /// The lineage that owned the task when it committed (stateful tasks).
    pub lineage: Option<u64>,
    /// Per range (same order as `ranges`, or empty): offsets above its next offset that were
    /// applied too, in increasing order.
    pub applied: Vec<Vec<u64>>,
    /// The committing owner handed the partition over (a revoke that drained, a clean stop): it
    /// had processed nothing past this commit.
    pub handed_over: bool,
}

impl RangeOffsets {
    /// The next offset of the range containing `hash`, or `None` if no range contains it.
    ///
    /// Expects `ranges` in hash order, as [`decode`] returns them and [`encode`] requires.
    #[must_use]
    pub fn next_for(&self, hash: u64) -> Option<u64> {
        let after = self.ranges.partition_point(|(r, _)| r.start <= hash);
        let (range, next) = self.ranges.get(after.checked_sub(1)?)?;
        range.contains(hash).then_some(*next)
    }
}

/// Why commit metadata could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The text is empty or is not rill metadata (no `rill:` prefix).
    #[error("not rill commit metadata")]
    NotRill,
    /// The text has the rill prefix but does not decode to valid metadata.
    #[error("malformed rill commit metadata: {0}")]
    Malformed(String),
    /// The metadata was written in a format version this build does not read.
    #[error("unknown rill commit metadata version {0} (this build reads version {VERSION})")]
    UnknownVersion(u32),
    /// The ranges refer to a routing this build does not know.
    #[error("commit metadata routes records by hash id {0}; this build knows {HASH_ID} (key) and {OFFSET_HASH_ID} (offset)")]
    UnknownHashId(u32),
    /// The encoded text would exceed what the broker accepts.
    #[error("commit metadata of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Length of the encoded text.
        bytes: usize,
        /// The limit ([`MAX_METADATA_BYTES`]).
        limit: usize,
    },
    /// A range's next offset is below the committed offset, which the protocol never produces.
    #[error("next offset {next} of range {range} is below the committed offset {base}")]
    OffsetBelowBase {
        /// The offending range.
        range: KeyRange,
        /// Its next offset.
        next: u64,
        /// The committed offset.
        base: u64,
    },
    /// The ranges to encode are empty, unsorted, or not a contiguous cover of the hash space.
    #[error("ranges cannot be encoded: {0}")]
    InvalidRanges(String),
}

/// Field 1 alone: read first, so that a later version is reported as such.
#[derive(Clone, PartialEq, prost::Message)]
struct VersionProbe {
    #[prost(uint32, tag = "1")]
    version: u32,
}

/// Version 1 of the message (see the module documentation).
#[derive(Clone, PartialEq, prost::Message)]
struct CommitMetadataV1 {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(uint32, tag = "2")]
    hash_id: u32,
    #[prost(fixed64, repeated, packed = "true", tag = "3")]
    range_starts: Vec<u64>,
    #[prost(uint64, repeated, packed = "true", tag = "4")]
    next_offset_deltas: Vec<u64>,
    #[prost(fixed64, tag = "5")]
    lineage: u64,
    #[prost(message, repeated, tag = "6")]
    applied: Vec<AppliedV1>,
    #[prost(bool, tag = "7")]
    handed_over: bool,
}

/// Field 6 of version 1: one range's offsets applied above its next offset.
#[derive(Clone, PartialEq, prost::Message)]
struct AppliedV1 {
    #[prost(uint32, tag = "1")]
    range: u32,
    #[prost(uint64, repeated, packed = "true", tag = "2")]
    gaps: Vec<u64>,
    #[prost(uint64, repeated, packed = "true", tag = "3")]
    runs: Vec<u64>,
    #[prost(bytes = "vec", tag = "4")]
    bitmap: Vec<u8>,
}

impl AppliedV1 {
    /// The shortest of the three forms of `offsets` (increasing, all above `next`).
    fn shortest(range: u32, next: u64, offsets: &[u64]) -> AppliedV1 {
        let mut gaps = Vec::with_capacity(offsets.len());
        let mut runs = Vec::new();
        let mut prev = next;
        let mut run_end = next;
        for &o in offsets {
            gaps.push(o - prev);
            if o == run_end + 1 && !runs.is_empty() {
                if let Some(len) = runs.last_mut() {
                    *len += 1;
                }
            } else {
                runs.push(o - run_end);
                runs.push(1);
            }
            run_end = o;
            prev = o;
        }
        let last = offsets.last().copied().unwrap_or(next);
        let bits = usize::try_from(last - next).unwrap_or(usize::MAX);
        let (gaps_len, runs_len) = (varints_len(&gaps), varints_len(&runs));
        let entry = |gaps, runs, bitmap| AppliedV1 {
            range,
            gaps,
            runs,
            bitmap,
        };
        if bits.div_ceil(8) < gaps_len.min(runs_len) {
            let mut bitmap = vec![0u8; bits.div_ceil(8)];
            for &o in offsets {
                let i = (o - next - 1) as usize;
                bitmap[i / 8] |= 1 << (i % 8);
            }
            entry(Vec::new(), Vec::new(), bitmap)
        } else if runs_len < gaps_len {
            entry(Vec::new(), runs, Vec::new())
        } else {
            entry(gaps, Vec::new(), Vec::new())
        }
    }

    /// The offsets of this entry, for a range whose next offset is `next`.
    fn offsets(&self, next: u64) -> Result<Vec<u64>, String> {
        let forms = [
            !self.gaps.is_empty(),
            !self.runs.is_empty(),
            !self.bitmap.is_empty(),
        ];
        if forms.iter().filter(|f| **f).count() > 1 {
            return Err("more than one form".into());
        }
        let mut out = Vec::new();
        let mut o: u64 = next;
        for &gap in &self.gaps {
            o = o
                .checked_add(gap)
                .filter(|_| gap > 0)
                .ok_or_else(|| format!("gap {gap} after offset {o}"))?;
            out.push(o);
        }
        if self.runs.len() % 2 == 1 {
            return Err("a run without its length".into());
        }
        for pair in self.runs.chunks_exact(2) {
            let (skip, len) = (pair[0], pair[1]);
            let start = o
                .checked_add(skip)
                .filter(|_| skip > 0 && len > 0)
                .ok_or_else(|| format!("run of {len} skipping {skip} after offset {o}"))?;
            o = start
                .checked_add(len - 1)
                .ok_or_else(|| format!("run of {len} from offset {start}"))?;
            out.extend(start..=o);
        }
        for (i, byte) in self.bitmap.iter().enumerate() {
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    let o = next
                        .checked_add(1 + (i * 8 + bit) as u64)
                        .ok_or_else(|| format!("bit {} after offset {next}", i * 8 + bit))?;
                    out.push(o);
                }
            }
        }
        Ok(out)
    }
}

/// The payload bytes of the shortest form of `offsets` (increasing, all above `next`): what
/// admission control of an async stage bounds (`engine::applied`).
#[cfg(test)]
pub(crate) fn applied_bytes(next: u64, offsets: &[u64]) -> usize {
    let a = AppliedV1::shortest(0, next, offsets);
    varints_len(&a.gaps) + varints_len(&a.runs) + a.bitmap.len()
}

/// The bytes of `values` as packed varints.
fn varints_len(values: &[u64]) -> usize {
    values
        .iter()
        .map(|&x| prost::encoding::encoded_len_varint(x))
        .sum()
}

/// Encodes `offsets` as commit metadata text for a commit of offset `base`.
///
/// The ranges must be in hash order, contiguous and cover the whole hash space, and every next
/// offset must be at least `base`. `hash_id` is written as given.
///
/// # Errors
/// [`MetadataError::InvalidRanges`] when the ranges are not a sorted contiguous cover of the hash
/// space, [`MetadataError::OffsetBelowBase`] when a next offset is below `base`, and
/// [`MetadataError::TooLarge`] when the text would exceed [`MAX_METADATA_BYTES`] (commit `base`
/// without metadata then).
pub fn encode(offsets: &RangeOffsets, base: u64) -> Result<String, MetadataError> {
    let ranges = &offsets.ranges;
    let (Some((first, _)), Some((last, _))) = (ranges.first(), ranges.last()) else {
        return Err(MetadataError::InvalidRanges("no ranges".into()));
    };
    if first.start != 0 {
        return Err(MetadataError::InvalidRanges(format!(
            "the first range {first} does not start at 0"
        )));
    }
    if last.end != u64::MAX {
        return Err(MetadataError::InvalidRanges(format!(
            "the last range {last} does not end at ffffffffffffffff"
        )));
    }
    for (range, _) in ranges {
        if range.start > range.end {
            return Err(MetadataError::InvalidRanges(format!(
                "range {range} is empty"
            )));
        }
    }
    for pair in ranges.windows(2) {
        let (a, b) = (pair[0].0, pair[1].0);
        if a.end.checked_add(1) != Some(b.start) {
            return Err(MetadataError::InvalidRanges(format!(
                "range {b} does not follow range {a}"
            )));
        }
    }
    let mut deltas = Vec::with_capacity(ranges.len());
    for &(range, next) in ranges {
        match next.checked_sub(base) {
            Some(delta) => deltas.push(delta),
            None => return Err(MetadataError::OffsetBelowBase { range, next, base }),
        }
    }
    let mut applied = Vec::new();
    for (i, offsets) in offsets.applied.iter().enumerate() {
        let Some(&(range, next)) = ranges.get(i) else {
            return Err(MetadataError::InvalidRanges(format!(
                "applied offsets for range {i} of {}",
                ranges.len()
            )));
        };
        if offsets.is_empty() {
            continue;
        }
        let mut prev = next;
        for &o in offsets {
            if o <= prev {
                return Err(MetadataError::InvalidRanges(format!(
                    "applied offset {o} of range {range} is not above {prev}"
                )));
            }
            prev = o;
        }
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        applied.push(AppliedV1::shortest(index, next, offsets));
    }
    let message = CommitMetadataV1 {
        version: VERSION,
        hash_id: offsets.hash_id,
        range_starts: ranges.iter().map(|(r, _)| r.start).collect(),
        next_offset_deltas: deltas,
        lineage: offsets.lineage.unwrap_or(0),
        applied,
        handed_over: offsets.handed_over,
    };
    let bytes = message.encode_to_vec();
    let text_len = PREFIX.len() + bytes.len().div_ceil(3) * 4;
    if text_len > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLarge {
            bytes: text_len,
            limit: MAX_METADATA_BYTES,
        });
    }
    let mut text = String::with_capacity(text_len);
    text.push_str(PREFIX);
    STANDARD.encode_string(&bytes, &mut text);
    debug_assert_eq!(text.len(), text_len);
    Ok(text)
}

/// Decodes commit metadata text that was committed together with offset `base`.
///
/// # Errors
/// [`MetadataError::NotRill`] for empty or foreign metadata (no range has progress beyond
/// `base`), [`MetadataError::UnknownVersion`], [`MetadataError::UnknownHashId`], and
/// [`MetadataError::Malformed`] for anything else that is not valid version 1 metadata.
pub fn decode(text: &str, base: u64) -> Result<RangeOffsets, MetadataError> {
    let body = text.strip_prefix(PREFIX).ok_or(MetadataError::NotRill)?;
    let bytes = STANDARD
        .decode(body)
        .map_err(|e| MetadataError::Malformed(format!("base64: {e}")))?;
    let probe = VersionProbe::decode(bytes.as_slice())
        .map_err(|e| MetadataError::Malformed(format!("protobuf: {e}")))?;
    match probe.version {
        VERSION => {}
        0 => return Err(MetadataError::Malformed("no version".into())),
        other => return Err(MetadataError::UnknownVersion(other)),
    }
    let message = CommitMetadataV1::decode(bytes.as_slice())
        .map_err(|e| MetadataError::Malformed(format!("protobuf: {e}")))?;
    if ![HASH_ID, OFFSET_HASH_ID].contains(&message.hash_id) {
        return Err(MetadataError::UnknownHashId(message.hash_id));
    }
    let starts = &message.range_starts;
    let deltas = &message.next_offset_deltas;
    if starts.is_empty() {
        return Err(MetadataError::Malformed("no ranges".into()));
    }
    if starts.len() != deltas.len() {
        return Err(MetadataError::Malformed(format!(
            "{} range starts but {} next offsets",
            starts.len(),
            deltas.len()
        )));
    }
    if starts[0] != 0 {
        return Err(MetadataError::Malformed(format!(
            "the first range starts at {:016x}, not 0",
            starts[0]
        )));
    }
    if let Some(pair) = starts.windows(2).find(|pair| pair[0] >= pair[1]) {
        return Err(MetadataError::Malformed(format!(
            "range starts {:016x} and {:016x} are not strictly increasing",
            pair[0], pair[1]
        )));
    }
    let mut ranges = Vec::with_capacity(starts.len());
    for (i, (&start, &delta)) in starts.iter().zip(deltas).enumerate() {
        // Strictly increasing starts: the next start is >= 1, so `- 1` cannot underflow.
        let end = starts.get(i + 1).map_or(u64::MAX, |next| next - 1);
        let next = base.checked_add(delta).ok_or_else(|| {
            MetadataError::Malformed(format!("next offset {base} + {delta} overflows"))
        })?;
        ranges.push((KeyRange { start, end }, next));
    }
    let mut applied = vec![
        Vec::new();
        if message.applied.is_empty() {
            0
        } else {
            ranges.len()
        }
    ];
    for a in &message.applied {
        let i = a.range as usize;
        let (Some(&(_, next)), Some(out)) = (ranges.get(i), applied.get_mut(i)) else {
            return Err(MetadataError::Malformed(format!(
                "applied offsets for range {i} of {}",
                ranges.len()
            )));
        };
        if !out.is_empty() {
            return Err(MetadataError::Malformed(format!(
                "two applied entries for range {i}"
            )));
        }
        *out = a
            .offsets(next)
            .map_err(|e| MetadataError::Malformed(format!("applied offsets of range {i}: {e}")))?;
    }
    Ok(RangeOffsets {
        applied,
        hash_id: message.hash_id,
        ranges,
        lineage: (message.lineage != 0).then_some(message.lineage),
        handed_over: message.handed_over,
    })
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
