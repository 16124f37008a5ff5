//! Store changelogs: how a range commit is written to Kafka, and how a task restores from it.
//!
//! # Format
//!
//! Each store has a compacted topic `<application.id>-<store>-changelog`; partition = the input
//! partition. A range commit writes, to each store's changelog partition:
//! - one **data record** per key the commit changed: key = the store key, value = the new value,
//!   or null for a delete (a tombstone, which compaction honours);
//! - then one **range marker**: header `rill.marker`, key `rill.marker/<start>-<end>` (so
//!   compaction keeps the latest marker of each range), value = the range's prost [`Progress`]
//!   (offsets, origins, `commit_seq`).
//!
//! # Write order (the range commit protocol with changelogs)
//!
//! 1. The commit seals its writes and sends their data records, in the range's delivery epoch.
//! 2. Once the sink acknowledged every output and data record of that epoch, the marker goes to
//!    the first store's changelog; once acknowledged, to the next store's, and so on. The last
//!    store's marker therefore proves that every store has its marker.
//! 3. Then the state, the progress and each changelog position (the offset after the marker) are
//!    written in one WriteBatch, and the range reports its progress.
//!
//! # Restore
//!
//! Data records of a range count only once a later marker of that range confirms them; those
//! after the range's last marker belong to a commit that did not finish and are ignored. The
//! last store's changelog is read first and decides, per range, the newest complete commit
//! (`commit_seq`); every other store is applied up to the marker of that same commit. Each range
//! resumes from the changelog position in its local progress, so an intact state dir restores
//! only the tail, and a missing one restores from the start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use rill_state::{Progress, SubTaskState, TopicOffset};
use rill_topology::{key_hash, range_of, Headers, KeyRange, RawRecord};

use super::EngineError;

/// Header that marks a range marker record.
pub const MARKER_HEADER: &str = "rill.marker";

/// The changelog topic of `store`.
pub fn changelog_topic(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// The data record of one store entry.
pub fn data_record(key: Vec<u8>, value: Option<Vec<u8>>) -> RawRecord {
    RawRecord {
        key: Some(key),
        value,
        timestamp: 0,
        headers: Headers::new(),
    }
}

/// The range marker of a commit with `progress`.
pub fn marker_record(progress: &Progress) -> RawRecord {
    let mut headers = Headers::new();
    headers.add(MARKER_HEADER, "1");
    RawRecord {
        key: Some(
            format!(
                "rill.marker/{:016x}-{:016x}",
                progress.range_start, progress.range_end
            )
            .into_bytes(),
        ),
        value: Some(progress.to_bytes()),
        timestamp: 0,
        headers,
    }
}

/// Reads changelog partitions (Kafka in the runtime; tests use memory).
pub trait ChangelogReader: Send + Sync {
    /// Calls `visit` with every record of `topic`/`partition` from offset `from` up to the end
    /// as of the call, in order; returns how many it visited.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        visit: &mut dyn FnMut(u64, RawRecord) -> Result<(), EngineError>,
    ) -> Result<u64, EngineError>;
}

/// What a restore did, for logs and metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Changelog records read, per store.
    pub records: Vec<(String, u64)>,
    /// Ranges whose progress moved past their local state.
    pub ranges_restored: usize,
}

/// Per range of one store's changelog: entries since the last marker, and what was applied.
#[derive(Default)]
struct RangeRestore {
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Newest complete commit applied from this changelog, with the position after its marker.
    applied: Option<(Progress, u64)>,
    /// Stop applying after the commit with this sequence number (set for all but the last store).
    target: Option<u64>,
}

/// Restores the sub-task states of one task (partition `partition`, ranges in order) from the
/// changelogs of `stores`, then writes each advanced range's progress. Returns what it did;
/// stops with an error soon after `cancel` is set.
pub fn restore(
    reader: &dyn ChangelogReader,
    application_id: &str,
    stores: &[String],
    partition: u32,
    states: &mut [SubTaskState],
    cancel: &AtomicBool,
) -> Result<RestoreSummary, EngineError> {
    let mut summary = RestoreSummary::default();
    let Some((last, others)) = stores.split_last() else {
        return Ok(summary);
    };
    let ranges: Vec<KeyRange> = states.iter().map(SubTaskState::range).collect();
    let mut targets: Vec<Option<u64>> = vec![None; states.len()];
    let mut finals: Vec<Option<Progress>> = vec![None; states.len()];
    let mut positions: Vec<Vec<TopicOffset>> = vec![Vec::new(); states.len()];
    // The last store decides which commits are complete; the others follow it.
    for (i, store) in std::iter::once(last).chain(others).enumerate() {
        let topic = changelog_topic(application_id, store);
        let deciding = i == 0;
        let mut per_range: Vec<RangeRestore> = (0..states.len())
            .map(|r| RangeRestore {
                target: if deciding { None } else { targets[r] },
                ..RangeRestore::default()
            })
            .collect();
        let checkpoints: Vec<Option<u64>> = states
            .iter()
            .map(|s| {
                s.committed_progress()
                    .and_then(|p| p.changelog_position(&topic))
            })
            .collect();
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        let local_seq: Vec<u64> = states
            .iter()
            .map(|s| s.committed_progress().map_or(0, |p| p.commit_seq))
            .collect();
        let n = reader.read(&topic, partition, from, &mut |offset, record| {
            if cancel.load(Ordering::Relaxed) {
                return Err(EngineError::Restore {
                    topic: topic.clone(),
                    partition,
                    message: "cancelled (the partition was revoked)".into(),
                });
            }
            let is_marker = record.headers.last(MARKER_HEADER).is_some();
            if is_marker {
                let progress = Progress::from_bytes(record.value.as_deref().unwrap_or_default())
                    .map_err(|e| corrupt(&topic, partition, offset, e))?;
                let r = ranges
                    .iter()
                    .position(|k| *k == progress.range())
                    .ok_or_else(|| EngineError::Config {
                        key: "parallelising.factor",
                        message: format!(
                            "changelog `{topic}` partition {partition} has a commit of key range {} \
                             that this factor does not have; run with the factor the application \
                             was written with",
                            progress.range()
                        ),
                    })?;
                let rr = &mut per_range[r];
                if checkpoints[r].is_some_and(|c| offset < c) || progress.commit_seq <= local_seq[r]
                {
                    rr.pending.clear();
                    return Ok(());
                }
                if rr.target.is_some_and(|t| progress.commit_seq > t) || (!deciding && rr.target.is_none()) {
                    rr.pending.clear();
                    return Ok(());
                }
                let entries = std::mem::take(&mut rr.pending);
                states[r]
                    .apply_restored(store, &entries, None)
                    .map_err(EngineError::from)?;
                rr.applied = Some((progress, offset + 1));
            } else {
                let Some(key) = record.key else {
                    return Err(corrupt(&topic, partition, offset, "a data record without a key".into()));
                };
                let r = range_of(key_hash(&key), ranges.len());
                if checkpoints[r].is_some_and(|c| offset < c) {
                    return Ok(());
                }
                per_range[r].pending.push((key, record.value));
            }
            Ok(())
        })?;
        summary.records.push((store.clone(), n));
        for (r, rr) in per_range.into_iter().enumerate() {
            if let Some((progress, position)) = rr.applied {
                if deciding {
                    targets[r] = Some(progress.commit_seq);
                    finals[r] = Some(progress);
                }
                positions[r].push(TopicOffset {
                    topic: topic.clone(),
                    next_offset: position,
                });
            }
        }
    }
    for (r, progress) in finals.into_iter().enumerate() {
        let Some(mut progress) = progress else {
            continue;
        };
        progress.changelogs = std::mem::take(&mut positions[r]);
        states[r]
            .apply_restored(last, &[], Some(progress))
            .map_err(EngineError::from)?;
        summary.ranges_restored += 1;
    }
    Ok(summary)
}

fn corrupt(topic: &str, partition: u32, offset: u64, detail: String) -> EngineError {
    EngineError::Config {
        key: "changelog",
        message: format!(
            "changelog `{topic}` partition {partition} offset {offset}: {detail}; \
             the changelog was written by something other than this rill application"
        ),
    }
}

/// Changelog records kept in memory, per (topic, partition), for tests.
#[derive(Default)]
pub struct MemoryChangelog {
    /// Invariant: appends under the lock keep each partition in write order.
    logs: parking_lot::Mutex<HashMap<(String, u32), Vec<RawRecord>>>,
}

impl MemoryChangelog {
    /// Appends `record` to `topic`/`partition`; returns its offset.
    pub fn append(&self, topic: &str, partition: u32, record: RawRecord) -> u64 {
        let mut logs = self.logs.lock();
        let log = logs.entry((topic.to_string(), partition)).or_default();
        log.push(record);
        log.len() as u64 - 1
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
        visit: &mut dyn FnMut(u64, RawRecord) -> Result<(), EngineError>,
    ) -> Result<u64, EngineError> {
        let records: Vec<RawRecord> = self
            .logs
            .lock()
            .get(&(topic.to_string(), partition))
            .map(|l| l.iter().skip(from as usize).cloned().collect())
            .unwrap_or_default();
        let n = records.len() as u64;
        for (i, r) in records.into_iter().enumerate() {
            visit(from + i as u64, r)?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rill_state::{StateConfig, StateDb};
    use rill_topology::prelude::*;

    use super::*;
    use crate::engine::{Engine, EngineConfig};

    /// An engine over `dir` writing to and restoring from `log`, assigned partition 0 of `in`
    /// and restored.
    fn restored_engine(
        topology: Arc<rill_topology::Topology>,
        p: usize,
        dir: &std::path::Path,
        log: &Arc<MemoryChangelog>,
    ) -> Engine {
        let db = StateDb::open(&StateConfig {
            dir: dir.to_path_buf(),
            memory_bytes: 16 << 20,
        })
        .unwrap();
        let config = EngineConfig {
            application_id: "app".into(),
            parallelising_factor: p,
            worker_threads: 2,
            changelogs: true,
            ..EngineConfig::default()
        };
        let no_internal = std::collections::HashMap::new();
        let mut e = Engine::new(topology, config, Some(db), log.clone(), no_internal).unwrap();
        e.restore_from(log.clone());
        e.assign("in", 0, &std::collections::HashMap::new())
            .unwrap();
        assert!(e.wait_restored(Duration::from_secs(20)).unwrap());
        e
    }

    /// Count by key into store `counts` at P = 4.
    fn counting_engine(dir: &std::path::Path, log: &Arc<MemoryChangelog>) -> Engine {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .group_by_key()
            .count("counts")
            .to_stream()
            .to("out");
        restored_engine(Arc::new(b.build().unwrap()), 4, dir, log)
    }

    fn record(key: &str) -> RawRecord {
        RawRecord {
            key: Some(key.as_bytes().to_vec()),
            value: Some(b"v".to_vec()),
            timestamp: 0,
            headers: Headers::new(),
        }
    }

    fn count(e: &Engine, key: &str) -> Option<i64> {
        e.store_get("counts", key.as_bytes())
            .unwrap()
            .map(|v| I64Serde.deserialize(&v).unwrap())
    }

    /// Feeds `keys` from `offset` on and commits durably.
    fn feed(e: &mut Engine, offset: u64, keys: &[&str]) {
        for (i, k) in keys.iter().enumerate() {
            e.dispatch("in", 0, offset + i as u64, record(k)).unwrap();
        }
        e.commit_durable();
        assert!(e.wait_idle(Duration::from_secs(20)));
    }

    #[test]
    fn a_lost_state_dir_is_rebuilt_exactly_from_the_changelog() {
        let log = Arc::new(MemoryChangelog::default());
        let first = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..40).map(|i| format!("k{}", i % 13)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        {
            let mut e = counting_engine(first.path(), &log);
            feed(&mut e, 0, &keys[..25]);
            feed(&mut e, 25, &keys[25..]);
            assert_eq!(count(&e, "k0"), Some(4));
        }
        // A commit that did not finish: data records with no marker after them.
        log.append(
            "app-counts-changelog",
            0,
            data_record(b"k0".to_vec(), Some(I64Serde.serialize(&99).unwrap())),
        );
        let fresh = tempfile::tempdir().unwrap();
        let mut e = counting_engine(fresh.path(), &log);
        assert!(e.stats().restored() > 0);
        for i in 0..13 {
            let k = format!("k{i}");
            let expected = keys.iter().filter(|x| **x == k).count() as i64;
            assert_eq!(count(&e, &k), Some(expected), "{k}");
        }
        // Replayed input is skipped by every range (restored progress), new input counts.
        feed(&mut e, 0, &keys);
        assert_eq!(count(&e, "k0"), Some(4));
        feed(&mut e, 40, &["k0"]);
        assert_eq!(count(&e, "k0"), Some(5));
    }

    #[test]
    fn an_intact_state_dir_reads_only_the_changelog_tail() {
        let log = Arc::new(MemoryChangelog::default());
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..200).map(|i| format!("k{}", i % 50)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        {
            let mut e = counting_engine(dir.path(), &log);
            for round in 0..4 {
                feed(&mut e, round * 50, &keys[round as usize * 50..][..50]);
            }
        }
        let written = log.logs.lock()[&("app-counts-changelog".to_string(), 0)].len() as u64;
        let e = counting_engine(dir.path(), &log);
        // Only records after the oldest range's last marker: part of the last commit round.
        assert!(
            e.stats().restored() < written / 4,
            "re-read {} of {written}",
            e.stats().restored()
        );
        assert_eq!(count(&e, "k7"), Some(4));
    }

    /// A crash between the markers of a two-store commit: the first store's changelog has the
    /// newer marker, the last store's does not. Restore applies the older commit to both.
    #[test]
    fn a_commit_without_its_last_stores_marker_is_applied_to_no_store() {
        let b = StreamsBuilder::new();
        let grouped = b.stream("in", StringSerde, StringSerde).group_by_key();
        grouped.count("first");
        grouped.count("second");
        let topology = Arc::new(b.build().unwrap());
        let stores = topology.sub_topologies()[0].stores.clone();
        assert_eq!(stores.len(), 2);
        let engine = |dir: &std::path::Path, log: &Arc<MemoryChangelog>| {
            restored_engine(topology.clone(), 1, dir, log)
        };
        let get = |e: &Engine, store: &str| {
            e.store_get(store, b"k")
                .unwrap()
                .map(|v| I64Serde.deserialize(&v).unwrap())
        };
        let log = Arc::new(MemoryChangelog::default());
        let dir = tempfile::tempdir().unwrap();
        {
            let mut e = engine(dir.path(), &log);
            feed(&mut e, 0, &["k", "k"]);
            feed(&mut e, 2, &["k"]);
            assert_eq!((get(&e, "first"), get(&e, "second")), (Some(3), Some(3)));
        }
        // Drop the last store's newest marker, as if the process died before sending it.
        let last = changelog_topic("app", &stores[1]);
        {
            let mut logs = log.logs.lock();
            let l = logs.get_mut(&(last, 0)).unwrap();
            let newest = l
                .iter()
                .rposition(|r| r.headers.last(MARKER_HEADER).is_some())
                .unwrap();
            l.remove(newest);
        }
        let fresh = tempfile::tempdir().unwrap();
        let mut e = engine(fresh.path(), &log);
        assert_eq!(
            (get(&e, "first"), get(&e, "second")),
            (Some(2), Some(2)),
            "both stores at the last commit every store confirmed"
        );
        // The input of the unconfirmed commit is processed again, once.
        feed(&mut e, 0, &["k", "k", "k"]);
        assert_eq!((get(&e, "first"), get(&e, "second")), (Some(3), Some(3)));
    }
}
