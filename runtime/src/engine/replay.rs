//! Replaying changelogs into a task's ranges: what [`restore`] reads, which commits it applies,
//! and which keys it leaves for the next commit to repair (the records are described in
//! [`super::changelog`], the restore protocol around it in [`super::restore`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;

use rill_state::{Progress, StoreWrite, SubTaskState, TopicOffset};
use rill_topology::KeyRange;

use super::changelog::{
    changelog_topic, classify, Base, ChangelogReader, Confirmed, Entry, BASE_VERSION,
};
use super::EngineError;

/// What a restore did, for logs, metrics and the first commit after it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Changelog records read, per store.
    pub records: Vec<(String, u64)>,
    /// Ranges whose progress moved past their local state.
    pub ranges_restored: usize,
    /// Per range (in order), per store: keys with unconfirmed records in the changelog, whose
    /// current value the range's next commit must write again.
    pub repairs: Vec<Vec<(String, BTreeSet<Vec<u8>>)>>,
    /// The commits the deciding store confirmed after the last base it read, by the range they
    /// were written under: what the new lineage's base must confirm.
    pub confirms: Vec<Confirmed>,
}

/// A data record waiting for confirmation: (lineage, attempt, changelog offset, write).
type Waiting = (u64, u64, u64, StoreWrite);

/// A data record and the changelog offset it was read at.
type Read = (u64, StoreWrite);

/// Per commit range of the deciding store: data waiting for its confirmation.
#[derive(Default)]
struct Pending {
    entries: Vec<Waiting>,
}

impl Pending {
    /// Takes out the entries of `lineage` up to `attempt` (confirmed); with `others`, every
    /// other lineage's entry is returned as dropped too.
    fn confirm(&mut self, lineage: u64, attempt: u64, others: bool) -> (Vec<Read>, Vec<Read>) {
        let mut confirmed = Vec::new();
        let mut dropped = Vec::new();
        let mut keep = Vec::new();
        for (l, a, at, write) in self.entries.drain(..) {
            if l == lineage && a <= attempt {
                confirmed.push((at, write));
            } else if others && l != lineage {
                dropped.push((at, write));
            } else {
                keep.push((l, a, at, write));
            }
        }
        self.entries = keep;
        (confirmed, dropped)
    }
}

/// The newest complete commit (or base entry) the deciding store showed for one commit range,
/// with the offset it was read at (later ones win, hash by hash).
struct Final {
    at: u64,
    progress: Progress,
}

/// Where restored records go: the task's current ranges, and what each already holds locally.
struct Targets<'s> {
    ranges: Vec<KeyRange>,
    states: &'s mut [SubTaskState],
    /// Per range: keys with an unconfirmed record, and the offset of the newest one. A key is
    /// repaired unless a confirmed record of it comes later in the log.
    orphans: Vec<BTreeMap<Vec<u8>, u64>>,
}

impl Targets<'_> {
    /// The index of the current range holding `hash`.
    fn of(&self, hash: u64) -> usize {
        self.ranges
            .partition_point(|r| r.end < hash)
            .min(self.ranges.len() - 1)
    }

    /// Applies confirmed writes of `store` to the ranges of their hashes.
    fn apply(&mut self, store: &str, writes: Vec<Read>) -> Result<(), EngineError> {
        let mut per_range: BTreeMap<usize, Vec<StoreWrite>> = BTreeMap::new();
        for (at, w) in writes {
            let r = self.of(w.hash);
            if self.orphans[r].get(&w.key).is_some_and(|&o| o < at) {
                self.orphans[r].remove(&w.key);
            }
            per_range.entry(r).or_default().push(w);
        }
        for (r, writes) in per_range {
            self.states[r]
                .apply_restored(store, &writes, None)
                .map_err(EngineError::from)?;
        }
        Ok(())
    }

    /// Marks the keys of `writes` for repair in the ranges of their hashes.
    fn orphan(&mut self, writes: impl IntoIterator<Item = Read>) {
        for (at, w) in writes {
            let r = self.of(w.hash);
            let newest = self.orphans[r].entry(w.key).or_insert(at);
            *newest = (*newest).max(at);
        }
    }

    /// The keys of `store` to repair per range, leaving none behind. A key goes to the ranges
    /// whose restored state holds it, else to the range of its record's hash: the hash of a
    /// repair of an absent key is its own hash or its writer's range start, which after a
    /// factor change need
    /// not be the range that holds the key, and a tombstone written there would shadow the
    /// holder's value under compaction.
    fn take_orphans(&mut self, store: &str) -> Result<Vec<BTreeSet<Vec<u8>>>, EngineError> {
        let n = self.ranges.len();
        let orphans = std::mem::replace(&mut self.orphans, vec![BTreeMap::new(); n]);
        let mut out = vec![BTreeSet::new(); n];
        for (r, keys) in orphans.into_iter().enumerate() {
            for key in keys.into_keys() {
                let mut held = false;
                for (h, state) in self.states.iter().enumerate() {
                    if state.holds_committed(store, &key)? {
                        out[h].insert(key.clone());
                        held = true;
                    }
                }
                if !held {
                    out[r].insert(key);
                }
            }
        }
        Ok(out)
    }
}

/// Restores the sub-task states of one task (partition `partition`, ranges in order) from the
/// changelogs of `stores`, then writes each advanced range's progress. Commits of other factors
/// (before a change of the parallelising factor) are applied entry by entry to the current range
/// of each entry's routing hash, and each range's progress is composed from the newest commits
/// covering its hashes (`rill_state::carry`). Returns what it did; stops with an error soon after
/// `cancel` is set.
pub fn restore(
    reader: &dyn ChangelogReader,
    application_id: &str,
    stores: &[String],
    partition: u32,
    states: &mut [SubTaskState],
    cancel: &AtomicBool,
) -> Result<RestoreSummary, EngineError> {
    let n = states.len();
    let mut summary = RestoreSummary {
        repairs: vec![Vec::new(); n],
        ..RestoreSummary::default()
    };
    let Some(last) = stores.last() else {
        return Ok(summary);
    };
    let ranges: Vec<KeyRange> = states.iter().map(SubTaskState::range).collect();
    let locals: Vec<Option<Progress>> = states
        .iter()
        .map(|s| s.committed_progress().cloned())
        .collect();
    // What the deciding store tells: per commit range, the highest confirmed attempt per lineage
    // and the newest complete commit.
    let mut confirmed: BTreeMap<KeyRange, HashMap<u64, u64>> = BTreeMap::new();
    let mut finals: BTreeMap<KeyRange, Final> = BTreeMap::new();
    let mut targets = Targets {
        ranges: ranges.clone(),
        states,
        orphans: vec![BTreeMap::new(); n],
    };
    // The last store decides which commits are complete.
    {
        let topic = changelog_topic(application_id, last);
        let checkpoints = checkpoints(&locals, &topic);
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        // The lineage accepted at `from`: the writer of the commit `from` follows (the range with
        // the oldest checkpoint); from the start, whoever claims first.
        let oldest = locals
            .iter()
            .zip(&checkpoints)
            .filter_map(|(p, c)| c.map(|c| (c, p.as_ref())))
            .min_by_key(|(c, _)| *c)
            .and_then(|(c, p)| (c == from).then_some(p).flatten());
        let mut accepted: Option<u64> = oldest.map(|p| p.lineage);
        let mut accepted_generation = oldest.map_or(i32::MIN, |p| p.generation);
        let mut pending: BTreeMap<KeyRange, Pending> = BTreeMap::new();
        // Per (commit range, lineage): the highest attempt confirmed since the last base read.
        let mut since_base: BTreeMap<(KeyRange, u64), u64> = BTreeMap::new();
        let count = reader.read(&topic, partition, from, cancel, &mut |offset, record| {
            match classify(&topic, partition, offset, record)? {
                Entry::Claim(claim) => {
                    // Older lineages' waiting data stay: the claimer's base confirms them.
                    if claim.generation >= accepted_generation {
                        accepted = Some(claim.lineage);
                        accepted_generation = claim.generation;
                    }
                }
                Entry::Base(base) => {
                    if accepted != Some(base.lineage) {
                        return Ok(());
                    }
                    let confirms = if base.version >= BASE_VERSION {
                        base.confirms.clone()
                    } else {
                        legacy_confirms(&base)
                    };
                    for c in &confirms {
                        let (ok, _) = pending
                            .entry(c.range())
                            .or_default()
                            .confirm(c.lineage, c.attempt, false);
                        targets.apply(last, ok)?;
                        let max = confirmed
                            .entry(c.range())
                            .or_default()
                            .entry(c.lineage)
                            .or_insert(0);
                        *max = (*max).max(c.attempt);
                    }
                    for p in &base.ranges {
                        let range = p.range();
                        let newer = finals.get(&range).is_some_and(|f| {
                            f.progress.lineage == p.lineage && f.progress.attempt >= p.attempt
                        });
                        if !newer {
                            finals.insert(
                                range,
                                Final {
                                    at: offset,
                                    progress: p.clone(),
                                },
                            );
                        }
                    }
                    // Data of older lineages the base does not confirm never will be.
                    for waiting in pending.values_mut() {
                        let (_, dropped) = waiting.confirm(base.lineage, 0, true);
                        targets.orphan(dropped);
                    }
                    // A later reader that gets here has what came before resolved by this base.
                    since_base.clear();
                }
                Entry::Data { id, write } => {
                    let r = targets.of(write.hash);
                    if accepted.is_some_and(|l| l != id.lineage) {
                        // A zombie's write: repaired even below its range's checkpoint (the
                        // read passes it anyway), or it could shadow the confirmed value there
                        // once compacted.
                        targets.orphan([(offset, write)]);
                    } else if checkpoints[r].is_some_and(|c| offset < c) {
                        // Already in the local state.
                    } else {
                        pending
                            .entry(id.range)
                            .or_default()
                            .entries
                            .push((id.lineage, id.attempt, offset, write));
                    }
                }
                Entry::Marker(mut progress) => {
                    if accepted.is_some_and(|l| l != progress.lineage) {
                        return Ok(());
                    }
                    accepted = Some(progress.lineage);
                    accepted_generation = accepted_generation.max(progress.generation);
                    let range = progress.range();
                    let (ok, _) = pending.entry(range).or_default().confirm(
                        progress.lineage,
                        progress.attempt,
                        false,
                    );
                    targets.apply(last, ok)?;
                    let max = confirmed
                        .entry(range)
                        .or_default()
                        .entry(progress.lineage)
                        .or_insert(0);
                    *max = (*max).max(progress.attempt);
                    let since = since_base.entry((range, progress.lineage)).or_insert(0);
                    *since = (*since).max(progress.attempt);
                    // The marker itself is where this store's changelog continues.
                    set_changelog_position(&mut progress, &topic, offset + 1);
                    finals.insert(
                        range,
                        Final {
                            at: offset,
                            progress,
                        },
                    );
                }
            }
            Ok(())
        })?;
        summary.records.push((last.clone(), count));
        summary.confirms = since_base
            .into_iter()
            .map(|((range, lineage), attempt)| Confirmed {
                range_start: range.start,
                range_end: range.end,
                lineage,
                attempt,
            })
            .collect();
        for waiting in pending.into_values() {
            targets.orphan(waiting.entries.into_iter().map(|(_, _, at, w)| (at, w)));
        }
        for (r, o) in targets.take_orphans(last)?.into_iter().enumerate() {
            if !o.is_empty() {
                summary.repairs[r].push((last.clone(), o));
            }
        }
    }

    // Every other store applies exactly the data of the commits the last store confirmed.
    for store in &stores[..stores.len() - 1] {
        let topic = changelog_topic(application_id, store);
        let checkpoints = checkpoints(&locals, &topic);
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        let mut batch: Vec<Read> = Vec::new();
        let count = reader.read(&topic, partition, from, cancel, &mut |offset, record| {
            if let Entry::Data { id, write } = classify(&topic, partition, offset, record)? {
                let r = targets.of(write.hash);
                if checkpoints[r].is_some_and(|c| offset < c) {
                    return Ok(());
                }
                let ok = confirmed
                    .get(&id.range)
                    .and_then(|c| c.get(&id.lineage))
                    .is_some_and(|&max| id.attempt <= max);
                if ok {
                    batch.push((offset, write));
                    if batch.len() >= RESTORE_BATCH {
                        targets.apply(store, std::mem::take(&mut batch))?;
                    }
                } else {
                    targets.orphan([(offset, write)]);
                }
            }
            Ok(())
        })?;
        targets.apply(store, batch)?;
        summary.records.push((store.clone(), count));
        for (r, o) in targets.take_orphans(store)?.into_iter().enumerate() {
            if !o.is_empty() {
                summary.repairs[r].push((store.clone(), o));
            }
        }
    }

    // Each range's progress: per hash, the newest of its local progress and the commits read.
    let deciding = changelog_topic(application_id, last);
    for (r, range) in ranges.iter().enumerate() {
        let local_at = locals[r]
            .as_ref()
            .and_then(|p| p.changelog_position(&deciding));
        let newer: Vec<(KeyRange, u64, &Progress)> = finals
            .iter()
            .filter(|(k, f)| k.overlaps(range) && local_at.is_none_or(|c| f.at >= c))
            .map(|(k, f)| (*k, f.at, &f.progress))
            .collect();
        if newer.is_empty() {
            continue;
        }
        let mut candidates = newer;
        if let (Some(local), Some(at)) = (&locals[r], local_at) {
            // The local checkpoint is older than every candidate above it.
            candidates.push((*range, at.saturating_sub(1), local));
        }
        let parts = newest_per_hash(*range, &candidates);
        let progress = rill_state::carry::compose(*range, &parts);
        targets.states[r]
            .apply_restored(last, &[], Some(progress))
            .map_err(EngineError::from)?;
        summary.ranges_restored += 1;
    }
    Ok(summary)
}

/// A cover of `range` by the candidates' ranges, each hash taking the candidate read last.
fn newest_per_hash<'p>(
    range: KeyRange,
    candidates: &[(KeyRange, u64, &'p Progress)],
) -> Vec<(KeyRange, &'p Progress)> {
    let mut cuts: Vec<u64> = vec![range.start];
    for (k, _, _) in candidates {
        if let Some(i) = rill_state::carry::intersection(*k, range) {
            cuts.push(i.start);
            if i.end < range.end {
                cuts.push(i.end + 1);
            }
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut parts: Vec<(KeyRange, &Progress)> = Vec::new();
    for (i, &start) in cuts.iter().enumerate() {
        let end = cuts.get(i + 1).map_or(range.end, |next| next - 1);
        let piece = KeyRange { start, end };
        let newest = candidates
            .iter()
            .filter(|(k, _, _)| k.contains(start))
            .max_by_key(|(_, at, _)| *at);
        if let Some((_, _, p)) = newest {
            match parts.last_mut() {
                Some((prev, q)) if std::ptr::eq(*q, *p) && prev.end + 1 == start => prev.end = end,
                _ => parts.push((piece, p)),
            }
        }
    }
    parts
}

/// Sets the position of changelog `topic` in `progress` to `next_offset`.
fn set_changelog_position(progress: &mut Progress, topic: &str, next_offset: u64) {
    match progress.changelogs.iter_mut().find(|o| o.topic == topic) {
        Some(o) => o.next_offset = next_offset,
        None => progress.changelogs.push(TopicOffset::with_applied(
            topic.to_string(),
            next_offset,
            [],
        )),
    }
}

/// What a base of the first format (without `confirms`) confirms: per current range, the commit
/// its progress names, as if written under that range (exact unless the factor changed before).
fn legacy_confirms(base: &Base) -> Vec<Confirmed> {
    base.ranges
        .iter()
        .map(|p| Confirmed {
            range_start: p.range_start,
            range_end: p.range_end,
            lineage: p.lineage,
            attempt: p.attempt,
        })
        .collect()
}

/// Entries buffered before a restore writes them to RocksDB.
const RESTORE_BATCH: usize = 4096;

/// Each range's local position in changelog `topic`, if it has one.
fn checkpoints(locals: &[Option<Progress>], topic: &str) -> Vec<Option<u64>> {
    locals
        .iter()
        .map(|p| p.as_ref().and_then(|p| p.changelog_position(topic)))
        .collect()
}
