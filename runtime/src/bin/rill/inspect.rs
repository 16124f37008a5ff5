//! `rill state inspect DIR`: a state directory read-only (see `rill_state::inspect`), and with
//! `--bootstrap` each range's progress against the group's committed offsets.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use rill_runtime::kafka::metadata::{self, RangeOffsets};
use rill_state::inspect::{inspect, InspectOptions, Inspection, ProgressRecord};
use rill_state::Progress;
use rill_topology::keyrange::KeyRange;
use serde_json::{json, Value};

use super::{group_reader, raw_metadata, Failure, InspectArgs};

/// What the group committed for one topic partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Committed {
    /// The partition's committed offset.
    pub offset: i64,
    /// rill's per-range next offsets from the commit metadata, when it has them.
    pub ranges: Option<RangeOffsets>,
}

/// The group's commits by (topic, partition); a partition without a commit is absent.
pub(crate) type Commits = BTreeMap<(String, i32), Committed>;

/// How a local range's next offset compares with the group's commit for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The group has no committed offset for the partition.
    NoCommit,
    /// Equal to what was committed.
    At(u64),
    /// Below what was committed (the committed offset, or the lowest of several ranges').
    Behind(u64),
    /// Above what was committed.
    Ahead(u64),
    /// The range spans committed ranges that are partly below and partly above it.
    Mixed { low: u64, high: u64 },
}

impl Standing {
    fn label(&self) -> &'static str {
        match self {
            Standing::NoCommit => "no-commit",
            Standing::At(_) => "at",
            Standing::Behind(_) => "behind",
            Standing::Ahead(_) => "ahead",
            Standing::Mixed { .. } => "mixed",
        }
    }

    fn text(&self) -> String {
        match self {
            Standing::NoCommit => "the group committed nothing for this partition".into(),
            Standing::At(c) => format!("at the committed {c}"),
            Standing::Behind(c) => format!("behind the committed {c}"),
            Standing::Ahead(c) => format!("ahead of the committed {c}"),
            Standing::Mixed { low, high } => {
                format!("between the committed ranges' {low} and {high}")
            }
        }
    }

    fn json(&self) -> Value {
        let committed = match self {
            Standing::NoCommit => Value::Null,
            Standing::At(c) | Standing::Behind(c) | Standing::Ahead(c) => json!(c),
            Standing::Mixed { low, high } => json!([low, high]),
        };
        json!({ "status": self.label(), "committed": committed })
    }
}

/// How local next offset `next` of `range` stands against `committed`: against the next
/// offsets of the committed ranges that overlap it, or the partition's committed offset when
/// the metadata has no ranges (or none overlapping).
pub(crate) fn standing(range: KeyRange, next: u64, committed: Option<&Committed>) -> Standing {
    let Some(committed) = committed else {
        return Standing::NoCommit;
    };
    let mut nexts: Vec<u64> = committed
        .ranges
        .iter()
        .flat_map(|r| r.ranges.iter())
        .filter(|(r, _)| r.overlaps(&range))
        .map(|(_, n)| *n)
        .collect();
    if nexts.is_empty() {
        nexts.push(u64::try_from(committed.offset).unwrap_or(0));
    }
    let (low, high) = (
        nexts.iter().copied().min().unwrap_or(0),
        nexts.iter().copied().max().unwrap_or(0),
    );
    if next == low && next == high {
        Standing::At(next)
    } else if next <= low {
        Standing::Behind(high)
    } else if next >= high {
        Standing::Ahead(low)
    } else {
        Standing::Mixed { low, high }
    }
}

/// `rill state inspect`.
pub(crate) fn run(args: &InspectArgs) -> Result<(), Failure> {
    let found = inspect(
        &args.dir,
        InspectOptions {
            count_entries: args.count_entries,
        },
    )
    .map_err(|e| Failure(e.to_string()))?;
    let commits = match &args.bootstrap {
        None => None,
        Some(bootstrap) => {
            let group = args
                .application_id
                .clone()
                .or_else(|| found.application.clone())
                .ok_or_else(|| {
                    Failure(format!(
                        "{} has no APPLICATION file: name the group with --application-id",
                        args.dir.display()
                    ))
                })?;
            let timeout = Duration::from_millis(args.timeout_ms);
            Some((
                group.clone(),
                fetch_commits(bootstrap, &group, &found, timeout)?,
            ))
        }
    };
    let commits = commits.as_ref().map(|(g, c)| (g.as_str(), c));
    if args.json {
        let text = serde_json::to_string_pretty(&to_json(&found, commits))
            .map_err(|e| Failure(format!("cannot write JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", to_text(&found, commits));
    }
    Ok(())
}

/// The input topic partitions the ranges' progress records name.
fn input_partitions(found: &Inspection) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = found
        .column_families
        .iter()
        .filter_map(|cf| Some((cf.progress.valid()?, cf.id.partition)))
        .flat_map(|(p, partition)| {
            p.offsets
                .iter()
                .map(move |o| (o.topic.clone(), partition as i32))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The group's committed offsets (with range metadata) of the partitions the state names.
fn fetch_commits(
    bootstrap: &str,
    group: &str,
    found: &Inspection,
    timeout: Duration,
) -> Result<Commits, Failure> {
    let partitions = input_partitions(found);
    let mut commits = Commits::new();
    if partitions.is_empty() {
        return Ok(commits);
    }
    let consumer = group_reader(bootstrap, group);
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (topic, partition) in &partitions {
        tpl.add_partition(topic, *partition);
    }
    let committed = consumer.committed_offsets(tpl, timeout).map_err(|e| {
        Failure(format!(
            "cannot fetch the committed offsets of group {group} from {bootstrap}: {e}"
        ))
    })?;
    for (index, elem) in committed.elements().iter().enumerate() {
        let (topic, partition) = (elem.topic(), elem.partition());
        if let Err(e) = elem.error() {
            return Err(Failure(format!(
                "cannot read the committed offset of {topic}/{partition}: {e}"
            )));
        }
        let Offset::Offset(offset) = elem.offset() else {
            continue;
        };
        let base = u64::try_from(offset).unwrap_or(0);
        let ranges = std::str::from_utf8(raw_metadata(&committed, index))
            .ok()
            .and_then(|text| metadata::decode(text, base).ok());
        commits.insert((topic.to_string(), partition), Committed { offset, ranges });
    }
    Ok(commits)
}

/// Bytes for people: `512 B`, `1.5 KiB`, `3.2 MiB`, ...
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The text report.
pub(crate) fn to_text(found: &Inspection, commits: Option<(&str, &Commits)>) -> String {
    let mut out = format!("state dir {}\n", found.dir.display());
    let format = found
        .format
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(out, "  format: {format}");
    let _ = writeln!(
        out,
        "  application.id: {}",
        found
            .application
            .as_deref()
            .unwrap_or("(no APPLICATION file)")
    );
    let _ = writeln!(
        out,
        "  cluster: {}",
        found.cluster.as_deref().unwrap_or("(no CLUSTER file)")
    );
    let _ = writeln!(out, "  rocksdb/ on disk: {}", bytes(found.disk_bytes));
    let mut stores: Vec<&str> = found
        .column_families
        .iter()
        .map(|cf| cf.id.store.as_str())
        .collect();
    stores.dedup();
    let _ = writeln!(
        out,
        "  {} column families of stores [{}]",
        found.column_families.len(),
        stores.join(", ")
    );
    if !found.other_column_families.is_empty() {
        let _ = writeln!(
            out,
            "  column families not rill's: {}",
            found.other_column_families.join(", ")
        );
    }
    if let Some((group, _)) = commits {
        let _ = writeln!(
            out,
            "  compared with the offsets committed by group {group}"
        );
    }
    for cf in &found.column_families {
        let _ = writeln!(
            out,
            "\n{} partition {} range {}",
            cf.id.store, cf.id.partition, cf.id.range
        );
        let _ = writeln!(
            out,
            "  entries {}{}, sst files {}, memtables {}",
            if cf.entries_exact { "" } else { "~" },
            cf.entries,
            bytes(cf.sst_bytes),
            bytes(cf.memtable_bytes)
        );
        match &cf.progress {
            ProgressRecord::Missing => out.push_str("  no progress record: never committed\n"),
            ProgressRecord::Invalid(why) => {
                let _ = writeln!(out, "  unreadable progress record: {why}");
            }
            ProgressRecord::Valid(p) => {
                progress_text(&mut out, p, cf.id.partition, cf.id.range, commits)
            }
        }
    }
    out
}

fn progress_text(
    out: &mut String,
    p: &Progress,
    partition: u32,
    range: KeyRange,
    commits: Option<(&str, &Commits)>,
) {
    let _ = writeln!(
        out,
        "  commit attempt {}, lineage {:016x} (from {:016x}), generation {}, owner {:016x}{}",
        p.attempt,
        p.lineage,
        p.parent_lineage,
        p.generation,
        p.owner,
        if p.cluster_id.is_empty() {
            String::new()
        } else {
            format!(", cluster {}", p.cluster_id)
        }
    );
    let _ = writeln!(
        out,
        "  stream time {}",
        p.stream_time
            .map_or_else(|| "none".to_string(), |t| t.to_string())
    );
    for o in &p.offsets {
        let _ = write!(out, "  input {} next {}", o.topic, o.next_offset);
        let above: Vec<String> = o.applied_above().map(|a| a.to_string()).collect();
        if !above.is_empty() {
            let _ = write!(out, " (also applied {})", above.join(", "));
        }
        if let Some((_, commits)) = commits {
            let committed = commits.get(&(o.topic.clone(), partition as i32));
            let _ = write!(
                out,
                ": {}",
                standing(range, o.next_offset, committed).text()
            );
        }
        out.push('\n');
    }
    for c in &p.changelogs {
        let _ = writeln!(out, "  changelog {} checkpoint {}", c.topic, c.next_offset);
    }
    for c in &p.carried {
        let _ = writeln!(
            out,
            "  carried {} range {} next {}",
            c.topic,
            c.range(),
            c.next_offset
        );
    }
    for s in &p.store_times {
        let _ = writeln!(out, "  store {} time {}", s.store, s.time);
    }
    if !p.origins.is_empty() {
        let _ = writeln!(out, "  {} repartition origins", p.origins.len());
    }
}

/// The JSON report.
pub(crate) fn to_json(found: &Inspection, commits: Option<(&str, &Commits)>) -> Value {
    let column_families: Vec<Value> = found
        .column_families
        .iter()
        .map(|cf| {
            let progress = match &cf.progress {
                ProgressRecord::Missing => Value::Null,
                ProgressRecord::Invalid(why) => json!({ "error": why }),
                ProgressRecord::Valid(p) => {
                    let offsets: Vec<Value> = p
                        .offsets
                        .iter()
                        .map(|o| {
                            let mut v = json!({
                                "topic": o.topic,
                                "next_offset": o.next_offset,
                                "applied_above": o.applied_above().collect::<Vec<u64>>(),
                            });
                            if let Some((_, commits)) = commits {
                                let committed =
                                    commits.get(&(o.topic.clone(), cf.id.partition as i32));
                                v["committed"] =
                                    standing(cf.id.range, o.next_offset, committed).json();
                            }
                            v
                        })
                        .collect();
                    json!({
                        "offsets": offsets,
                        "changelogs": p.changelogs.iter().map(|c| json!({
                            "topic": c.topic, "checkpoint": c.next_offset,
                        })).collect::<Vec<_>>(),
                        "carried": p.carried.iter().map(|c| json!({
                            "topic": c.topic, "range": c.range().to_string(),
                            "next_offset": c.next_offset, "stream_time": c.stream_time,
                        })).collect::<Vec<_>>(),
                        "store_times": p.store_times.iter().map(|s| json!({
                            "store": s.store, "time": s.time,
                        })).collect::<Vec<_>>(),
                        "origins": p.origins.len(),
                        "stream_time": p.stream_time,
                        "attempt": p.attempt,
                        "lineage": format!("{:016x}", p.lineage),
                        "parent_lineage": format!("{:016x}", p.parent_lineage),
                        "owner": format!("{:016x}", p.owner),
                        "owner_parent": format!("{:016x}", p.owner_parent),
                        "generation": p.generation,
                        "cluster_id": p.cluster_id,
                    })
                }
            };
            json!({
                "name": cf.id.name(),
                "store": cf.id.store,
                "partition": cf.id.partition,
                "range": cf.id.range.to_string(),
                "entries": cf.entries,
                "entries_exact": cf.entries_exact,
                "sst_bytes": cf.sst_bytes,
                "memtable_bytes": cf.memtable_bytes,
                "progress": progress,
            })
        })
        .collect();
    json!({
        "dir": found.dir.display().to_string(),
        "format": found.format,
        "application_id": found.application,
        "cluster_id": found.cluster,
        "disk_bytes": found.disk_bytes,
        "group": commits.map(|(g, _)| g),
        "column_families": column_families,
        "other_column_families": found.other_column_families,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(offset: i64, ranges: &[(KeyRange, u64)]) -> Committed {
        Committed {
            offset,
            ranges: (!ranges.is_empty()).then(|| RangeOffsets {
                hash_id: rill_topology::keyrange::HASH_ID,
                ranges: ranges.to_vec(),
                lineage: None,
                applied: Vec::new(),
                handed_over: false,
            }),
        }
    }

    #[test]
    fn ranges_stand_against_the_committed_ranges_that_overlap_them() {
        let half = |i| KeyRange::nth(i, 2);
        let quarter = |i| KeyRange::nth(i, 4);
        assert_eq!(standing(half(0), 5, None), Standing::NoCommit);
        // No range metadata: the partition's offset.
        let plain = committed(7, &[]);
        assert_eq!(standing(half(0), 7, Some(&plain)), Standing::At(7));
        assert_eq!(standing(half(0), 3, Some(&plain)), Standing::Behind(7));
        assert_eq!(standing(half(0), 9, Some(&plain)), Standing::Ahead(7));
        // Same ranges.
        let same = committed(4, &[(half(0), 10), (half(1), 4)]);
        assert_eq!(standing(half(0), 10, Some(&same)), Standing::At(10));
        assert_eq!(standing(half(1), 10, Some(&same)), Standing::Ahead(4));
        // A local half over two committed quarters.
        let split = committed(4, &[(quarter(0), 4), (quarter(1), 8), (half(1), 6)]);
        assert_eq!(standing(half(0), 4, Some(&split)), Standing::Behind(8));
        assert_eq!(standing(half(0), 8, Some(&split)), Standing::Ahead(4));
        assert_eq!(
            standing(half(0), 6, Some(&split)),
            Standing::Mixed { low: 4, high: 8 }
        );
        assert_eq!(standing(quarter(1), 8, Some(&split)), Standing::At(8));
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 20), "5.0 MiB");
    }
}
