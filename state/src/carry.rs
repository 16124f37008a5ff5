//! Progress across a change of the parallelising factor: the progress of a new key range composed
//! from the progress of the old ranges that held its hashes.
//!
//! Every hash `h` of a range has, per source topic, a next offset `next(h)`: every record routed
//! to `h` below it was applied. A range stores the smallest of them as its offset and the parts
//! that are further as [`CarriedOffset`]s. Repartition origins are kept per downstream hash
//! interval the same way (an entry's `lo..=hi`). Composition preserves `next(h)` and the origin
//! positions of every hash exactly, so skipping applied records and de-duplicating replayed ones
//! work across splits, merges and factors that do not divide each other; nothing is applied twice.
//!
//! The stream time of a composed range is the largest of its parts' (a merged range has seen all
//! their records); changelog positions the smallest (a restore from the composed checkpoint must
//! read everything any part has not).

use std::collections::{BTreeMap, BTreeSet};

use rill_topology::keyrange::KeyRange;

use crate::progress::{CarriedOffset, Origin, Progress, StoreTime, TopicOffset};

/// The intersection of two ranges, if they share a hash.
pub fn intersection(a: KeyRange, b: KeyRange) -> Option<KeyRange> {
    let start = a.start.max(b.start);
    let end = a.end.min(b.end);
    (start <= end).then_some(KeyRange { start, end })
}

/// A hash interval with the next offset it has applied to and the stream time of the range that
/// applied it that far (`None`: unknown, or already handed over).
type Piece = (KeyRange, u64, Option<i64>);

/// Per topic, the pieces of `p` clipped to `part` (its carried parts, with their own times, and
/// its own offset and time elsewhere): the exact `next(h)` of every hash of `part`.
fn next_offsets(p: &Progress, part: KeyRange) -> BTreeMap<&str, Vec<Piece>> {
    let mut out: BTreeMap<&str, Vec<Piece>> = BTreeMap::new();
    // A topic may have carried parts without an offset of the whole range (composed from parts
    // that did not cover it): the rest of the range has applied nothing of it.
    let topics = p
        .offsets
        .iter()
        .map(|o| o.topic.as_str())
        .chain(p.carried.iter().map(|c| c.topic.as_str()));
    for topic in topics {
        if out.contains_key(topic) {
            continue;
        }
        let own = p.next_offset(topic).unwrap_or(0);
        let mut pieces = vec![(part, own, p.stream_time)];
        for c in p.carried.iter().filter(|c| c.topic == topic) {
            if let Some(inside) = intersection(c.range(), part) {
                pieces = cut(pieces, inside, c.next_offset, c.stream_time);
            }
        }
        out.insert(topic, pieces);
    }
    out
}

/// `pieces` (a cover of a range) with `inside` taking offset `next` where that is further on,
/// with `time` (the time of the part that applied it that far).
fn cut(pieces: Vec<Piece>, inside: KeyRange, next: u64, time: Option<i64>) -> Vec<Piece> {
    let mut out = Vec::new();
    for (r, n, t) in pieces {
        let Some(common) = intersection(r, inside) else {
            out.push((r, n, t));
            continue;
        };
        if r.start < common.start {
            out.push((
                KeyRange {
                    start: r.start,
                    end: common.start - 1,
                },
                n,
                t,
            ));
        }
        out.push(if next > n {
            (common, next, time)
        } else {
            (common, n, t)
        });
        if common.end < r.end {
            out.push((
                KeyRange {
                    start: common.end + 1,
                    end: r.end,
                },
                n,
                t,
            ));
        }
    }
    out
}

/// The progress of `range`, composed of `parts`: each the progress that holds for the hashes of
/// its range clipped to `range`. The parts must cover `range` without overlapping (the newest
/// known progress of every hash); a hash no part covers has applied nothing.
pub fn compose(range: KeyRange, parts: &[(KeyRange, &Progress)]) -> Progress {
    let parts: Vec<(KeyRange, &Progress)> = parts
        .iter()
        .filter_map(|(r, p)| intersection(*r, range).map(|r| (r, *p)))
        .collect();
    let covered: u128 = parts
        .iter()
        .map(|(r, _)| (r.end - r.start) as u128 + 1)
        .sum();
    let whole = covered == (range.end - range.start) as u128 + 1;
    // The writer fields of the part whose checkpoint is oldest: a restore from the composed
    // checkpoint starts where that part's did.
    let oldest = parts
        .iter()
        .min_by_key(|(_, p)| p.changelogs.iter().map(|o| o.next_offset).min())
        .map(|(_, p)| *p);
    let mut out = match oldest {
        Some(p) => Progress {
            offsets: Vec::new(),
            origins: Vec::new(),
            changelogs: Vec::new(),
            carried: Vec::new(),
            stream_time: None,
            store_times: Vec::new(),
            ..p.clone()
        },
        None => Progress::new(range, "", 0),
    };
    out.range_start = range.start;
    out.range_end = range.end;
    out.offsets.clear();
    // Offsets: a topic every part has (and the parts cover the range) gets the smallest; the
    // parts further on are carried.
    let per_part: Vec<BTreeMap<&str, Vec<Piece>>> =
        parts.iter().map(|(r, p)| next_offsets(p, *r)).collect();
    let mut topics: Vec<&str> = per_part.iter().flat_map(|m| m.keys().copied()).collect();
    topics.sort_unstable();
    topics.dedup();
    for topic in topics {
        let everywhere = whole && per_part.iter().all(|m| m.contains_key(topic));
        let pieces: Vec<Piece> = per_part
            .iter()
            .filter_map(|m| m.get(topic))
            .flatten()
            .copied()
            .collect();
        // Records applied above a part's offset (async stages): each is one record of one
        // hash, so it stays applied in whichever range now holds that hash.
        let mut applied: Vec<u64> = parts
            .iter()
            .flat_map(|(_, p)| p.offsets.iter().filter(|o| o.topic == topic))
            .flat_map(TopicOffset::applied_above)
            .collect();
        applied.sort_unstable();
        applied.dedup();
        let floor = if everywhere {
            pieces.iter().map(|(_, n, _)| *n).min().unwrap_or(0)
        } else {
            0
        };
        if everywhere || !applied.is_empty() {
            out.offsets
                .push(TopicOffset::with_applied(topic.to_string(), floor, applied));
        }
        for (r, n, stream_time) in pieces {
            if n > floor {
                out.carried.push(CarriedOffset {
                    topic: topic.to_string(),
                    range_start: r.start,
                    range_end: r.end,
                    next_offset: n,
                    stream_time,
                });
            }
        }
    }
    for (r, p) in &parts {
        for o in &p.origins {
            if let Some(covers) = intersection(o.covers(), *r) {
                out.origins.push(Origin {
                    lo: covers.start,
                    hi: covers.end,
                    ..o.clone()
                });
            }
        }
    }
    let times = TimeSource::of(&per_part, whole);
    out.stream_time = times.pick(parts.iter().map(|(_, p)| p.stream_time));
    // A store's observed time, as the stream time (each child of a split keeps it).
    let stores: BTreeSet<&str> = parts
        .iter()
        .flat_map(|(_, p)| p.store_times.iter().map(|s| s.store.as_str()))
        .collect();
    out.store_times = stores
        .into_iter()
        .filter_map(|store| {
            let of = |p: &Progress| {
                p.store_times
                    .iter()
                    .find(|s| s.store == store)
                    .map(|s| s.time)
            };
            times
                .pick(parts.iter().map(|(_, p)| of(p)))
                .map(|time| StoreTime {
                    store: store.to_string(),
                    time,
                })
        })
        .collect();
    // Changelog positions: the smallest over the parts, for topics every part has.
    let mut positions: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for (_, p) in &parts {
        for o in &p.changelogs {
            let e = positions.entry(&o.topic).or_insert((0, u64::MAX));
            e.0 += 1;
            e.1 = e.1.min(o.next_offset);
        }
    }
    out.changelogs = positions
        .into_iter()
        .filter(|(_, (n, _))| whole && *n == parts.len())
        .map(|(topic, (_, next_offset))| {
            TopicOffset::with_applied(topic.to_string(), next_offset, [])
        })
        .collect();
    out
}

/// Which of `parts` (with their next offsets `per_part`) a composed range takes its times
/// (stream time, stores' observed times) from: those furthest behind in every topic, where it
/// resumes, the largest of theirs. A part further on has seen records the composed range reads
/// again; its times would close their windows (expire their versions) before they count. Hashes
/// no part covers (unless `whole`) are a part at offset 0 without times: it is behind every
/// part. When no part is behind in every topic, every part, the smallest: late by less is safe,
/// early not.
struct TimeSource {
    behind: Vec<bool>,
    largest: bool,
}

impl TimeSource {
    fn of(per_part: &[BTreeMap<&str, Vec<Piece>>], whole: bool) -> Self {
        let position = |m: &BTreeMap<&str, Vec<Piece>>, topic: &str| {
            m.get(topic)
                .and_then(|pieces| pieces.iter().map(|(_, n, _)| *n).min())
                .unwrap_or(0)
        };
        let topics: BTreeSet<&str> = per_part.iter().flat_map(|m| m.keys().copied()).collect();
        let behind: Vec<bool> = per_part
            .iter()
            .map(|own| {
                topics.iter().all(|t| {
                    let at = position(own, t);
                    (whole || at == 0) && per_part.iter().all(|m| at <= position(m, t))
                })
            })
            .collect();
        let largest = !whole || behind.iter().any(|&b| b);
        TimeSource { behind, largest }
    }

    /// The composed time of the parts' `times` (by part; `None`: none).
    fn pick(&self, times: impl Iterator<Item = Option<i64>>) -> Option<i64> {
        let taken = times
            .zip(&self.behind)
            .filter(|(_, &b)| b || !self.largest)
            .filter_map(|(t, _)| t);
        if self.largest {
            taken.max()
        } else {
            taken.min()
        }
    }
}

/// The next offset of `topic` for hash `hash` under `p` (0 when the range never applied it).
pub fn next_for(p: &Progress, topic: &str, hash: u64) -> u64 {
    let own = p.next_offset(topic).unwrap_or(0);
    p.carried
        .iter()
        .filter(|c| c.topic == topic && c.range().contains(hash))
        .map(|c| c.next_offset)
        .max()
        .map_or(own, |c| c.max(own))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rill_topology::ranges;

    use super::*;

    /// A progress record for `range` with per-hash offsets from `next` (sampled at the bounds
    /// of the given cuts) and one origin.
    fn progress(range: KeyRange, offsets: &[(KeyRange, u64)], stream_time: i64) -> Progress {
        let mut p = Progress::new(
            range,
            "t",
            offsets.iter().map(|(_, n)| *n).min().unwrap_or(0),
        );
        for (r, n) in offsets {
            if let Some(inside) = intersection(*r, range) {
                p.carried.push(CarriedOffset {
                    topic: "t".into(),
                    range_start: inside.start,
                    range_end: inside.end,
                    next_offset: *n,
                    stream_time: None,
                });
            }
        }
        p.stream_time = Some(stream_time);
        p.store_times.push(StoreTime {
            store: "versions".into(),
            time: 10 * stream_time,
        });
        p.origins.push(Origin {
            partition: 0,
            range_start: 0,
            range_end: u64::MAX,
            offset: stream_time as u64,
            seq: 0,
            source_topic: 1,
            via_topic: 2,
            lo: range.start,
            hi: range.end,
        });
        p
    }

    /// A merge resumes where its part furthest behind is: a part further on has stream time from
    /// records the merged range reads again, which would close their windows before they count.
    #[test]
    fn a_merge_takes_the_stream_time_of_the_parts_furthest_behind() {
        let (lower, upper) = (
            KeyRange {
                start: 0,
                end: u64::MAX / 2,
            },
            KeyRange {
                start: u64::MAX / 2 + 1,
                end: u64::MAX,
            },
        );
        let whole = KeyRange {
            start: 0,
            end: u64::MAX,
        };
        let at = |range, next, time| {
            let mut p = Progress::new(range, "t", next);
            p.stream_time = Some(time);
            p
        };
        let (a, b) = (at(lower, 10, 30), at(upper, 10, 20));
        let same = compose(whole, &[(lower, &a), (upper, &b)]);
        assert_eq!(same.stream_time, Some(30), "at one position: the larger");
        let (a, b) = (at(lower, 12, 30), at(upper, 10, 20));
        let merged = compose(whole, &[(lower, &a), (upper, &b)]);
        assert_eq!(merged.stream_time, Some(20), "the part behind");
        assert_eq!(next_for(&merged, "t", 1), 12);
        let ahead: Vec<_> = merged
            .carried
            .iter()
            .map(|c| (c.range(), c.next_offset, c.stream_time))
            .collect();
        assert_eq!(
            ahead,
            vec![(lower, 12, Some(30))],
            "the part ahead's time, taken at 12"
        );
    }

    /// Hashes no part covers applied nothing: the composed range reads their records from the
    /// start, so it takes no part's time (the one part's 30 made the records of the uncovered
    /// half late after a merge of a committed range with one that never committed).
    #[test]
    fn a_merge_with_an_uncommitted_part_takes_no_time_until_it_passes_the_committed_one() {
        let lower = KeyRange {
            start: 0,
            end: u64::MAX / 2,
        };
        let whole = KeyRange {
            start: 0,
            end: u64::MAX,
        };
        let mut a = Progress::new(lower, "t", 9);
        a.stream_time = Some(30);
        let merged = compose(whole, &[(lower, &a)]);
        assert_eq!(merged.stream_time, None, "the uncovered half's: none");
        let carried: Vec<_> = merged
            .carried
            .iter()
            .map(|c| (c.range(), c.next_offset, c.stream_time))
            .collect();
        assert_eq!(carried, vec![(lower, 9, Some(30))], "taken at 9");
    }

    /// Composing again (a split of a merged range, a restore) keeps each carried part's own
    /// time: the part furthest on had the largest, which would close the other's windows early.
    #[test]
    fn each_carried_part_keeps_its_own_time() {
        let whole = KeyRange {
            start: 0,
            end: u64::MAX,
        };
        let third = u64::MAX / 3;
        let mut p = Progress::new(whole, "t", 10);
        p.stream_time = Some(20);
        for (start, end, next, time) in [(0, third, 12, 30), (third + 1, 2 * third, 15, 50)] {
            p.carried.push(CarriedOffset {
                topic: "t".into(),
                range_start: start,
                range_end: end,
                next_offset: next,
                stream_time: Some(time),
            });
        }
        let again = compose(whole, &[(whole, &p)]);
        let times: Vec<_> = again
            .carried
            .iter()
            .map(|c| (c.next_offset, c.stream_time))
            .collect();
        assert_eq!(times, vec![(12, Some(30)), (15, Some(50))]);
        assert_eq!(again.stream_time, Some(20));
    }

    /// A range composed of parts that do not cover it has carried offsets but no offset of its
    /// own; composing it again (a restore that reads its base, a second re-split) keeps them.
    #[test]
    fn a_composition_of_a_partial_composition_keeps_the_carried_offsets() {
        let whole = KeyRange {
            start: 0,
            end: u64::MAX,
        };
        let part = KeyRange {
            start: 0,
            end: u64::MAX / 3,
        };
        let applied = Progress::new(part, "t", 1);
        let first = compose(whole, &[(part, &applied)]);
        assert_eq!(first.next_offset("t"), None, "no offset of the whole range");
        assert_eq!(next_for(&first, "t", 5), 1);
        let again = compose(whole, &[(whole, &first)]);
        assert_eq!(next_for(&again, "t", 5), 1, "the carried offset survives");
        assert_eq!(next_for(&again, "t", u64::MAX), 0);
    }

    proptest! {
        /// Splitting, merging and re-splitting under factors that do not divide each other keeps
        /// `next(h)` and every origin position of every hash.
        #[test]
        fn composition_keeps_every_hashs_offset_and_origin(
            old_p in 1usize..7,
            new_p in 1usize..7,
            nexts in proptest::collection::vec(0u64..1000, 8),
            probes in proptest::collection::vec(any::<u64>(), 16),
        ) {
            let old = ranges(old_p);
            // Per old range: two halves with their own offsets (as after an earlier change).
            let olds: Vec<Progress> = old.iter().enumerate().map(|(i, r)| {
                let mid = r.start + (r.end - r.start) / 2;
                let halves = [
                    (KeyRange { start: r.start, end: mid }, nexts[(2 * i) % 8]),
                    (KeyRange { start: mid.saturating_add(1).min(r.end), end: r.end }, nexts[(2 * i + 1) % 8]),
                ];
                progress(*r, &halves, i as i64)
            }).collect();
            let parts: Vec<(KeyRange, &Progress)> = old.iter().copied().zip(&olds).collect();
            for new in ranges(new_p) {
                let c = compose(new, &parts);
                prop_assert_eq!(c.range(), new);
                for h in probes.iter().copied().chain([new.start, new.end]) {
                    if !new.contains(h) { continue; }
                    let src = &olds[rill_topology::range_of(h, old_p)];
                    prop_assert_eq!(next_for(&c, "t", h), next_for(src, "t", h), "hash {:016x}", h);
                    let origin = c.origins.iter().find(|o| o.covers().contains(h));
                    prop_assert_eq!(origin.map(|o| o.offset), Some(src.stream_time.unwrap_or(0) as u64));
                }
                let times: Vec<i64> = parts.iter().filter(|(r, _)| intersection(*r, new).is_some()).filter_map(|(_, p)| p.stream_time).collect();
                prop_assert!(c.stream_time.is_some_and(|t| times.contains(&t)), "the time of one of the parts");
                let store_time = c.store_times.iter().find(|s| s.store == "versions").map(|s| s.time);
                prop_assert_eq!(store_time, c.stream_time.map(|t| 10 * t), "a store's time is taken as the stream time");
            }
        }
    }

    #[test]
    fn an_uncovered_part_makes_the_offset_unknown_but_keeps_the_covered_ones() {
        let full = KeyRange::FULL;
        let half = ranges(2);
        let p = Progress::new(half[0], "t", 40);
        let c = compose(full, &[(half[0], &p)]);
        assert_eq!(c.next_offset("t"), None, "the other half applied nothing");
        assert_eq!(next_for(&c, "t", half[0].start), 40);
        assert_eq!(next_for(&c, "t", half[1].start), 0);
    }
}
