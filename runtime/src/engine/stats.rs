//! Counters of what the engine did, read by tests and exported as metrics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Counters of what the engine did (also exported as metrics by the service).
#[derive(Default, Debug)]
pub struct EngineStats {
    pub(super) processed: AtomicU64,
    pub(super) produced: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) restored: AtomicU64,
    /// Records windowed operations dropped as late.
    late: AtomicU64,
    /// Discarded records by reason.
    discarded: Mutex<BTreeMap<&'static str, u64>>,
}

impl EngineStats {
    pub(super) fn count_processed(&self) {
        self.processed.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_produced(&self) {
        self.produced.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_skipped_duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn count_discarded(&self, reason: &'static str) {
        *self.discarded.lock().entry(reason).or_default() += 1;
        crate::metrics::record_discarded(reason);
    }
    pub(super) fn count_late(&self, store: &str) {
        self.late.fetch_add(1, Ordering::Relaxed);
        crate::metrics::record_late(store);
    }
    /// Records windowed operations dropped because their windows had closed (counted once per
    /// window a record could not update).
    pub fn late_dropped(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }
    /// Changelog records read by restores.
    pub fn restored(&self) -> u64 {
        self.restored.load(Ordering::Relaxed)
    }
    /// Records run through the topology.
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }
    /// Records written to sinks and repartition topics.
    pub fn produced(&self) -> u64 {
        self.produced.load(Ordering::Relaxed)
    }
    /// Input records skipped because their range had already applied them.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
    /// Repartitioned records skipped as replays (their origin was already applied).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Records discarded for `reason` (`deserialization`, `null_key`, `invalid_timestamp`).
    pub fn discarded(&self, reason: &str) -> u64 {
        self.discarded.lock().get(reason).copied().unwrap_or(0)
    }
}
