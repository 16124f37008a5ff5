//! Re-splitting a partition's state into the key ranges of another parallelising factor.
//!
//! Every entry knows the routing hash of the record that wrote it, so moving entries to new
//! ranges is a scan of the old column families; the progress of each new range is composed from
//! the old ranges' (see [`crate::carry`]), so nothing is applied twice and nothing is skipped.
//!
//! # Crash safety
//!
//! 1. The new ranges' column families are cleared (a crashed earlier attempt may have left a
//!    partial copy), then the entries are copied in batches, without progress.
//! 2. ONE WriteBatch writes every new range's progress and deletes every old range's progress.
//! 3. The old column families are dropped.
//!
//! A crash before step 2 leaves the old progress in place: the next attempt starts over from the
//! old ranges. After step 2, old column families without progress are leftovers, dropped by the
//! next attempt. Old ranges that never committed (no progress) hold nothing to move.

use std::collections::BTreeSet;
use std::sync::Arc;

use rill_topology::keyrange::KeyRange;

use crate::carry::compose;
use crate::db::StateDb;
use crate::error::StateError;
use crate::progress::Progress;
use crate::subtask::{swap_progress, StoreEntries, SubTaskState};

/// Entries copied per WriteBatch.
const COPY_BATCH: usize = 16 * 1024;

/// What a re-split did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resplit {
    /// The old ranges whose state moved.
    pub from: Vec<KeyRange>,
    /// Entries copied, over all stores.
    pub entries: u64,
}

/// Moves the state of `stores` for `partition` into the ranges `target` (the ranges of the new
/// factor, in hash order) when it is held in other ranges; `None` when there was nothing to move.
pub fn resplit(
    db: &Arc<StateDb>,
    stores: &[String],
    partition: u32,
    target: &[KeyRange],
) -> Result<Option<Resplit>, StateError> {
    let existing: BTreeSet<KeyRange> = db
        .column_families()
        .into_iter()
        .filter(|cf| cf.partition == partition && stores.contains(&cf.store))
        .map(|cf| cf.range)
        .collect();
    let old: Vec<KeyRange> = existing
        .into_iter()
        .filter(|r| !target.contains(r))
        .collect();
    if old.is_empty() {
        return Ok(None);
    }
    let old_states = old
        .iter()
        .map(|r| SubTaskState::open(db.clone(), stores, partition, *r))
        .collect::<Result<Vec<_>, _>>()?;
    let moved: Vec<&SubTaskState> = old_states
        .iter()
        .filter(|s| s.committed_progress().is_some())
        .collect();
    if moved.is_empty() {
        drop(old_states);
        drop_ranges(db, stores, partition, &old)?;
        return Ok(None);
    }
    let mut new_states = target
        .iter()
        .map(|r| SubTaskState::open(db.clone(), stores, partition, *r))
        .collect::<Result<Vec<_>, _>>()?;
    for s in &mut new_states {
        s.clear()?;
    }
    let mut entries = 0u64;
    for store in stores {
        let mut batches: Vec<StoreEntries> = vec![Vec::new(); target.len()];
        for from in &moved {
            for write in from.committed_entries(store)? {
                let r = target.partition_point(|t| t.end < write.hash);
                let Some(batch) = batches.get_mut(r) else {
                    continue;
                };
                batch.push(write);
                entries += 1;
                if batch.len() >= COPY_BATCH {
                    new_states[r].apply_restored(store, &std::mem::take(batch), None)?;
                }
            }
        }
        for (r, batch) in batches.into_iter().enumerate() {
            if !batch.is_empty() {
                new_states[r].apply_restored(store, &batch, None)?;
            }
        }
    }
    let parts: Vec<(KeyRange, &Progress)> = moved
        .iter()
        .filter_map(|s| s.committed_progress().map(|p| (s.range(), p)))
        .collect();
    // A new range no committed part overlaps was committed by nobody: it gets no progress, as
    // it had none. (A progress composed of nothing names no owner, and a restart would then
    // distrust the whole local state and restore it from the changelogs.)
    let progress: Vec<Option<_>> = target
        .iter()
        .map(|r| {
            parts
                .iter()
                .any(|(part, _)| part.overlaps(r))
                .then(|| compose(*r, &parts))
        })
        .collect();
    let from: Vec<KeyRange> = moved.iter().map(|s| s.range()).collect();
    let lost: BTreeSet<String> = moved
        .iter()
        .flat_map(|s| s.lost_in_memory().iter().cloned())
        .collect();
    let mut old_states = old_states;
    swap_progress(&mut new_states, progress, &mut old_states, &lost)?;
    drop(old_states);
    drop(new_states);
    drop_ranges(db, stores, partition, &old)?;
    Ok(Some(Resplit { from, entries }))
}

/// Drops the column families of `stores` for `partition` in `ranges`.
fn drop_ranges(
    db: &StateDb,
    stores: &[String],
    partition: u32,
    ranges: &[KeyRange],
) -> Result<(), StateError> {
    for store in stores {
        for range in ranges {
            db.drop_range(store, partition, *range)?;
        }
    }
    Ok(())
}
