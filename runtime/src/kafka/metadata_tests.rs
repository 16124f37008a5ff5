use super::*;
use proptest::prelude::*;
use rill_topology::{range_of, ranges};

/// `p` equal ranges with next offsets `base + deltas[i]`.
fn offsets(p: usize, base: u64, delta: impl Fn(usize) -> u64) -> RangeOffsets {
    RangeOffsets {
        hash_id: HASH_ID,
        lineage: None,
        applied: Vec::new(),
        ranges: ranges(p)
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r, base + delta(i)))
            .collect(),
        handed_over: false,
    }
}

/// Builds text from a raw message, bypassing the encoder's checks.
fn raw(message: &CommitMetadataV1) -> String {
    format!("{PREFIX}{}", STANDARD.encode(message.encode_to_vec()))
}

/// Ranges that always fit, whatever their offsets (deltas below 2^63, 9-byte varints).
const MAX_P_WORST_CASE: usize = 179;

fn valid_message() -> CommitMetadataV1 {
    CommitMetadataV1 {
        version: VERSION,
        hash_id: HASH_ID,
        range_starts: vec![0, 1 << 63],
        next_offset_deltas: vec![0, 5],
        lineage: 0,
        applied: vec![],
        handed_over: false,
    }
}

proptest! {
    #[test]
    fn round_trips(
        p in 1usize..=300,
        base in 0u64..(1 << 62),
        seeds in proptest::collection::vec(any::<u64>(), 300),
        shift in 0u32..64,
    ) {
        // Deltas of every magnitude, from 1-byte varints to ones close to 2^62.
        let o = offsets(p, base, |i| (seeds[i] >> shift) & ((1 << 62) - 1));
        match encode(&o, base) {
            Ok(text) => {
                prop_assert!(text.len() <= MAX_METADATA_BYTES);
                prop_assert!(text.starts_with(PREFIX));
                prop_assert_eq!(decode(&text, base).unwrap(), o);
            }
            // Only many ranges with large deltas can exceed the limit.
            Err(MetadataError::TooLarge { bytes, limit }) => {
                prop_assert!(p > MAX_P_WORST_CASE && bytes > limit, "p {} bytes {}", p, bytes);
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    #[test]
    fn round_trips_unequal_ranges(
        cuts in proptest::collection::btree_set(1u64.., 0..200),
        base in any::<u64>(),
    ) {
        // Arbitrary contiguous ranges (not an equal split), offsets at base and up to u64::MAX.
        let mut starts = vec![0];
        starts.extend(cuts);
        let ranges: Vec<_> = starts
            .iter()
            .enumerate()
            .map(|(i, &start)| {
                let end = starts.get(i + 1).map_or(u64::MAX, |s| s - 1);
                let next = if i % 2 == 0 { base } else { u64::MAX };
                (KeyRange { start, end }, next)
            })
            .collect();
        let o = RangeOffsets { hash_id: HASH_ID, ranges, lineage: Some(7), applied: Vec::new(), handed_over: false };
        let text = encode(&o, base).unwrap();
        prop_assert_eq!(decode(&text, base).unwrap(), o);
    }

    #[test]
    fn next_for_finds_the_range_of_every_hash(p in 1usize..=300, h in any::<u64>()) {
        let o = offsets(p, 1000, |i| i as u64);
        prop_assert_eq!(o.next_for(h), Some(1000 + range_of(h, p) as u64));
    }
}

#[test]
fn encodes_text_in_the_documented_format() {
    // Pins the wire format: P = 2, base 100, next = [100, 105].
    let o = offsets(2, 100, |i| 5 * i as u64);
    let text = encode(&o, 100).unwrap();
    // 08 01 | 10 01 | 1a 10 <0 as fixed64 LE> <2^63 as fixed64 LE> | 22 02 00 05
    let expected = [
        &[0x08, 0x01, 0x10, 0x01, 0x1a, 0x10][..],
        &0u64.to_le_bytes(),
        &(1u64 << 63).to_le_bytes(),
        &[0x22, 0x02, 0x00, 0x05],
    ]
    .concat();
    assert_eq!(text, format!("rill:{}", STANDARD.encode(&expected)));
    assert_eq!(text, "rill:CAEQARoQAAAAAAAAAAAAAAAAAAAAgCICAAU=");
}

/// The largest factor whose metadata fits, for next offsets `base + delta(i)`.
fn max_p_that_fits(delta: impl Fn(usize) -> u64 + Copy) -> usize {
    let mut p = 1;
    while encode(&offsets(p + 1, 7, delta), 7).is_ok() {
        p += 1;
    }
    p
}

#[test]
fn max_ranges_that_fit() {
    // Every range caught up with the watermark, or behind it by < 128 (1-byte deltas).
    let p = max_p_that_fits(|i| (i % 128) as u64);
    assert_eq!(p, 339);
    assert!(encode(&offsets(p, 7, |_| 127), 7).unwrap().len() <= MAX_METADATA_BYTES);
    match encode(&offsets(p + 1, 7, |_| 0), 7) {
        Err(MetadataError::TooLarge { bytes, limit }) => {
            assert!(bytes > MAX_METADATA_BYTES);
            assert_eq!(limit, MAX_METADATA_BYTES);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Deltas below 16384 (2-byte varints), below 2^63 (any Kafka offset: 9-byte varints)
    // and of u64::MAX (10-byte varints).
    assert_eq!(max_p_that_fits(|_| 16383), 305);
    assert_eq!(max_p_that_fits(|_| i64::MAX as u64 - 7), MAX_P_WORST_CASE);
    assert_eq!(max_p_that_fits(|_| u64::MAX - 7), 169);
}

#[test]
fn too_many_ranges_are_too_large() {
    let err = encode(&offsets(1000, 0, |_| 0), 0).unwrap_err();
    assert!(
        matches!(err, MetadataError::TooLarge { limit: 4096, .. }),
        "{err:?}"
    );
}

#[test]
fn decodes_after_a_factor_change() {
    // Written with P = 4; the new factor is 6 (or 3) and looks up by hash.
    let before = offsets(4, 500, |i| [3, 0, 42, 7][i]);
    let text = encode(&before, 500).unwrap();
    let decoded = decode(&text, 500).unwrap();
    assert_eq!(decoded, before);
    let old = ranges(4);
    for new_p in [1, 3, 6, 64] {
        for new_range in ranges(new_p) {
            for h in [
                new_range.start,
                new_range.end,
                new_range.start / 2 + new_range.end / 2,
            ] {
                let expected = 500 + [3, 0, 42, 7][range_of(h, 4)];
                assert!(old[range_of(h, 4)].contains(h));
                assert_eq!(decoded.next_for(h), Some(expected), "hash {h:016x}");
            }
        }
    }
    assert_eq!(decoded.next_for(0), Some(503));
    assert_eq!(decoded.next_for(u64::MAX / 4), Some(503));
    assert_eq!(decoded.next_for(u64::MAX / 4 + 1), Some(500));
    assert_eq!(decoded.next_for(u64::MAX), Some(507));
}

#[test]
fn next_for_outside_any_range_is_none() {
    let o = RangeOffsets {
        hash_id: HASH_ID,
        ranges: vec![(KeyRange { start: 10, end: 20 }, 1)],
        lineage: None,
        applied: Vec::new(),
        handed_over: false,
    };
    assert_eq!(o.next_for(9), None);
    assert_eq!(o.next_for(10), Some(1));
    assert_eq!(o.next_for(20), Some(1));
    assert_eq!(o.next_for(21), None);
    let empty = RangeOffsets {
        hash_id: HASH_ID,
        ranges: vec![],
        lineage: None,
        applied: Vec::new(),
        handed_over: false,
    };
    assert_eq!(empty.next_for(0), None);
}

#[test]
fn foreign_metadata_is_not_rill() {
    for text in [
        "",
        "rill",
        "RILL:CAE=",
        "{\"app\":\"x\"}",
        " rill:CAE=",
        "CAEQAQ==",
    ] {
        assert_eq!(decode(text, 0), Err(MetadataError::NotRill), "{text:?}");
    }
}

#[test]
fn malformed_text_is_rejected() {
    let good = encode(&offsets(3, 0, |_| 0), 0).unwrap();
    let cases = [
        "rill:".to_string(),                // no message at all
        "rill:EAE=".to_string(),            // hash id alone, no version
        "rill:!!!!".to_string(),            // not base64
        "rill:CAE".to_string(),             // missing padding
        format!("{good} "),                 // trailing whitespace
        format!("{good}\n"),                // trailing newline
        "rill:CAEQARoD".to_string(),        // truncated packed field
        good[..good.len() - 4].to_string(), // truncated
    ];
    for text in &cases {
        let err = decode(text, 0).unwrap_err();
        assert!(
            matches!(err, MetadataError::Malformed(_)),
            "{text:?}: {err:?}"
        );
    }
}

#[test]
fn invalid_ranges_are_rejected_on_decode() {
    let bad = |f: fn(&mut CommitMetadataV1)| {
        let mut m = valid_message();
        f(&mut m);
        decode(&raw(&m), 0)
    };
    assert!(decode(&raw(&valid_message()), 0).is_ok());
    let malformed = [
        bad(|m| m.range_starts = vec![]),
        bad(|m| {
            m.range_starts = vec![];
            m.next_offset_deltas = vec![];
        }),
        bad(|m| m.range_starts = vec![1, 1 << 63]), // does not start at 0
        bad(|m| m.range_starts = vec![1 << 63, 0]), // unsorted
        bad(|m| m.range_starts = vec![0, 0]),       // duplicate start: an empty range
        bad(|m| m.next_offset_deltas = vec![0]),    // fewer offsets than ranges
        bad(|m| m.next_offset_deltas = vec![0, 1, 2]),
    ];
    for (i, result) in malformed.iter().enumerate() {
        assert!(
            matches!(result, Err(MetadataError::Malformed(_))),
            "case {i}: {result:?}"
        );
    }
    // base + delta must not overflow (the valid message's largest delta is 5).
    assert!(decode(&raw(&valid_message()), u64::MAX - 5).is_ok());
    assert!(matches!(
        decode(&raw(&valid_message()), u64::MAX - 4),
        Err(MetadataError::Malformed(_))
    ));
}

#[test]
fn unknown_versions_and_hash_ids_are_rejected() {
    let mut m = valid_message();
    m.version = 2;
    assert_eq!(decode(&raw(&m), 0), Err(MetadataError::UnknownVersion(2)));
    // A later version may change the other fields' types: still reported as its version.
    let v2 = [0x08, 0x02, 0x12, 0x03, b'a', b'b', b'c'];
    assert_eq!(
        decode(&format!("rill:{}", STANDARD.encode(v2)), 0),
        Err(MetadataError::UnknownVersion(2))
    );
    let mut m = valid_message();
    m.hash_id = 3;
    assert_eq!(decode(&raw(&m), 0), Err(MetadataError::UnknownHashId(3)));
    // The encoder writes the hash id it is given; the decoder checks it is one it knows and
    // hands it on (routing by offset is the other one).
    let mut o = offsets(2, 0, |_| 0);
    o.hash_id = 9;
    assert_eq!(
        decode(&encode(&o, 0).unwrap(), 0),
        Err(MetadataError::UnknownHashId(9))
    );
    o.hash_id = rill_topology::OFFSET_HASH_ID;
    assert_eq!(decode(&encode(&o, 0).unwrap(), 0), Ok(o));
}

#[test]
fn unknown_fields_are_ignored() {
    // A v1 writer of the future may add fields; this reader skips them.
    let mut bytes = valid_message().encode_to_vec();
    bytes.extend([0x48, 0x07]); // field 9, varint 7
    let text = format!("rill:{}", STANDARD.encode(bytes));
    assert_eq!(decode(&text, 0), decode(&raw(&valid_message()), 0));
}

#[test]
fn encode_rejects_offsets_below_base() {
    let o = offsets(4, 100, |i| if i == 2 { 0 } else { 5 });
    assert!(encode(&o, 100).is_ok());
    let err = encode(&o, 101).unwrap_err();
    assert_eq!(
        err,
        MetadataError::OffsetBelowBase {
            range: ranges(4)[2],
            next: 100,
            base: 101
        }
    );
}

#[test]
fn encode_rejects_ranges_that_do_not_cover_the_space() {
    let full = |p| offsets(p, 0, |_| 0);
    let cases: Vec<(&str, RangeOffsets)> = vec![
        (
            "empty",
            RangeOffsets {
                hash_id: HASH_ID,
                ranges: vec![],
                lineage: None,
                applied: Vec::new(),
                handed_over: false,
            },
        ),
        ("gap", {
            let mut o = full(3);
            o.ranges.remove(1);
            o
        }),
        ("unsorted", {
            let mut o = full(3);
            o.ranges.swap(0, 1);
            o
        }),
        ("overlap", {
            let mut o = full(2);
            o.ranges[1].0.start -= 1;
            o
        }),
        ("short start", {
            let mut o = full(2);
            o.ranges.remove(0);
            o
        }),
        ("short end", {
            let mut o = full(2);
            o.ranges.pop();
            o
        }),
        ("empty range", {
            // Contiguous bounds, but the middle range is empty: [0,4] [5,3] [4,MAX].
            let mut o = full(3);
            o.ranges[0].0 = KeyRange { start: 0, end: 4 };
            o.ranges[1].0 = KeyRange { start: 5, end: 3 };
            o.ranges[2].0 = KeyRange {
                start: 4,
                end: u64::MAX,
            };
            o
        }),
    ];
    for (name, o) in cases {
        assert!(
            matches!(encode(&o, 0), Err(MetadataError::InvalidRanges(_))),
            "{name}: {:?}",
            encode(&o, 0)
        );
    }
}

#[test]
fn applied_offsets_round_trip_and_bad_ones_are_refused() {
    let mut o = offsets(3, 100, |i| i as u64 * 10);
    o.applied = vec![vec![101, 102, 250], Vec::new(), vec![1 << 40]];
    let text = encode(&o, 100).unwrap();
    assert_eq!(decode(&text, 100).unwrap(), o);
    // Not above the range's next offset.
    let mut bad = o.clone();
    bad.applied[1] = vec![110];
    assert!(matches!(
        encode(&bad, 100),
        Err(MetadataError::InvalidRanges(_))
    ));
    // More lists than ranges.
    let mut bad = o.clone();
    bad.applied.push(vec![500]);
    assert!(matches!(
        encode(&bad, 100),
        Err(MetadataError::InvalidRanges(_))
    ));
    // Without applied offsets, nothing changes on the wire.
    let plain = offsets(3, 100, |i| i as u64);
    let mut with_empty = plain.clone();
    with_empty.applied = vec![Vec::new(); 3];
    assert_eq!(
        encode(&plain, 100).unwrap(),
        encode(&with_empty, 100).unwrap()
    );
}

/// The form an encoded entry took, and its payload bytes.
fn form_of(text: &str) -> (&'static str, usize) {
    let bytes = STANDARD.decode(text.strip_prefix(PREFIX).unwrap()).unwrap();
    let m = CommitMetadataV1::decode(bytes.as_slice()).unwrap();
    let a = &m.applied[0];
    if !a.gaps.is_empty() {
        ("gaps", varints_len(&a.gaps))
    } else if !a.runs.is_empty() {
        ("runs", varints_len(&a.runs))
    } else {
        ("bitmap", a.bitmap.len())
    }
}

#[test]
fn applied_offsets_take_their_shortest_form() {
    let mut o = offsets(1, 1000, |_| 0);
    // Sparse (the records of one range of many): gaps.
    o.applied = vec![(1..200).map(|i| 1000 + i * 16).collect()];
    let text = encode(&o, 1000).unwrap();
    assert_eq!(form_of(&text), ("gaps", 199));
    assert_eq!(decode(&text, 1000).unwrap(), o);
    // One stuck record below 100,000 completed ones, and one more stuck in the middle: runs.
    o.applied = vec![(1001..=100_000).filter(|&x| x != 50_000).collect()];
    let text = encode(&o, 1000).unwrap();
    assert_eq!(form_of(&text).0, "runs");
    assert!(text.len() < 60, "{}", text.len());
    assert_eq!(decode(&text, 1000).unwrap(), o);
    // A dense window of 20,000 with every 7th still open: a bitmap of 2,500 bytes, where gaps
    // would take ~17,000 and runs ~5,700.
    o.applied = vec![(1001..=21_000).filter(|x| x % 7 != 0).collect()];
    let text = encode(&o, 1000).unwrap();
    assert_eq!(form_of(&text), ("bitmap", 2500));
    assert!(text.len() <= MAX_METADATA_BYTES);
    assert_eq!(decode(&text, 1000).unwrap(), o);
}

proptest! {
    #[test]
    fn applied_offsets_round_trip_in_every_form(
        base in 0u64..(1 << 50),
        picks in proptest::collection::vec((1u64..40, any::<bool>()), 0..3000),
    ) {
        // Runs and holes of random lengths above a range's next offset.
        let mut applied = Vec::new();
        let mut o = base + 4;
        for (len, keep) in picks {
            if keep {
                applied.extend(o..o + len);
            }
            o += len;
        }
        let mut offsets = offsets(2, base, |i| i as u64 * 3);
        if !applied.is_empty() {
            offsets.applied = vec![Vec::new(), applied.clone()];
        }
        match encode(&offsets, base) {
            Ok(text) => {
                prop_assert_eq!(decode(&text, base).unwrap(), offsets);
                prop_assert!(applied_bytes(base + 3, &applied) <= text.len());
            }
            Err(MetadataError::TooLarge { .. }) => {
                prop_assert!(applied_bytes(base + 3, &applied) > 2900);
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }
}

#[test]
fn malformed_applied_forms_are_refused() {
    let entry = |gaps: Vec<u64>, runs: Vec<u64>, bitmap: Vec<u8>| {
        let mut m = valid_message();
        m.applied = vec![AppliedV1 {
            range: 1,
            gaps,
            runs,
            bitmap,
        }];
        decode(&raw(&m), 10)
    };
    // Range 1's next offset is 15: run (2, 3) is 17, 18, 19; bitmap 0b101 is 16 and 18.
    assert_eq!(
        entry(vec![], vec![2, 3], vec![]).unwrap().applied[1],
        vec![17, 18, 19]
    );
    assert_eq!(
        entry(vec![], vec![], vec![0b101]).unwrap().applied[1],
        vec![16, 18]
    );
    for (gaps, runs, bitmap) in [
        (vec![1], vec![1, 1], vec![]),
        (vec![], vec![1, 1], vec![1]),
        (vec![], vec![0, 1], vec![]),
        (vec![], vec![1, 0], vec![]),
        (vec![], vec![1], vec![]),
        (vec![], vec![1, u64::MAX], vec![]),
    ] {
        let r = entry(gaps.clone(), runs.clone(), bitmap.clone());
        assert!(
            matches!(r, Err(MetadataError::Malformed(_))),
            "{gaps:?} {runs:?} {bitmap:?}: {r:?}"
        );
    }
}

/// A hand-over commit says so to the next owner; any other commit does not, and a reader of
/// metadata written before the field existed reads "not handed over".
#[test]
fn the_hand_over_mark_round_trips_and_defaults_to_unset() {
    let mut o = offsets(4, 100, |i| i as u64);
    o.lineage = Some(9);
    let plain = encode(&o, 100).unwrap();
    assert!(!decode(&plain, 100).unwrap().handed_over);
    o.handed_over = true;
    let handed = encode(&o, 100).unwrap();
    let back = decode(&handed, 100).unwrap();
    assert!(back.handed_over);
    assert_eq!(back.ranges, o.ranges);
    assert_eq!(back.lineage, Some(9));
    // Written without field 7 (an older writer): not handed over.
    let mut m = valid_message();
    m.handed_over = false;
    assert!(!decode(&raw(&m), 0).unwrap().handed_over);
}
