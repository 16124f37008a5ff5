//! Range commits under `processing.guarantee=exactly_once_v2`: one Kafka transaction per commit
//! interval for the whole instance, as Kafka Streams' v2 does with one producer per thread.
//!
//! **Why one transaction for every range.** A partition's consumed offset carries every range's
//! offset in one commit-metadata value (see `crate::kafka::metadata`). Two transactions that each
//! committed their own range's progress of one partition would race on that value: the one that
//! commits last would move the other range's offset back, and a restart would replay (and
//! re-emit) records whose outputs were already committed. Kafka has no compare-and-set on
//! offsets, so the commits of a partition's ranges must meet in one transaction; one producer for
//! the instance also keeps the broker's cost flat whatever the number of ranges.
//!
//! **A transaction commit**, driven by the source loop (`crate::kafka::transaction`):
//! 1. **Seal** ([`Engine::seal_for_transaction`]): a `Work::Seal` goes to the *front* of every
//!    running sub-task's mailbox. The sub-task seals what it processed (write cache, progress,
//!    its record cache flushed, the changelog data sent) and **parks**: it takes no more work, so
//!    nothing it does later can land in this transaction. A slow range holds the transaction
//!    back by at most the batch it is running, not by its queue; the others wait parked for at
//!    most that long plus the broker's acknowledgements.
//! 2. **Ready** ([`Engine::transaction_ready`]): once a sealed range's records are acknowledged
//!    it sends its range markers, and once those are acknowledged it is ready. Nothing is
//!    written to RocksDB yet.
//! 3. **Offsets** ([`Engine::prepare_transaction`]): the ready ranges' offsets go to the
//!    trackers; every partition's low watermark with its range offsets goes into the transaction
//!    (`send_offsets_to_transaction` with the group metadata, so a zombie's is refused: KIP-447).
//! 4. `commit_transaction`; then **write** ([`Engine::finish_transaction`]): each ready range
//!    writes its WriteBatch (state, progress, changelog positions) and goes on.
//!
//! **Async stages.** A parked sub-task takes no answers either, and a record's offset closes in
//! the same step that runs its stateful part and writes its outputs: a transaction holds both
//! for the records whose calls completed before the seal and neither for a call still open
//! (its offset stays open; the ranges list the completed offsets above it). What a sub-topology
//! writes before its stage (at the record's start) would break that, so `Engine::new` refuses
//! it under `exactly_once_v2` ([`rill_topology::Topology::outputs_before_async`]).
//!
//! **Rollback.** An aborted or failed transaction is rolled back by closing every task without
//! committing anything (the runtime rejoins the group with a new consumer): RocksDB holds only
//! commits whose transaction committed, because a WriteBatch is written after its commit, and
//! the write caches and record caches of the aborted work are dropped. The tasks reopen from
//! local state, the committed changelog tail (restore reads `read_committed`) and the committed
//! offsets. A crash between a commit and its WriteBatches leaves RocksDB one commit behind the
//! offsets; the next restore replays that commit from the changelog, where its data and markers
//! committed with it.

use std::sync::atomic::Ordering;

use super::{Engine, EngineError, PartitionProgress};

impl Engine {
    /// Step 1: asks every running sub-task to seal and park (see the module doc).
    pub fn seal_for_transaction(&mut self) {
        // Queued behind the records (the seal goes in front): the next transaction takes them.
        self.tick_quiet_ranges();
        for task in self.tasks.values().filter(|t| t.is_running()) {
            // One still parked (kept so by a revoke) has nothing new to seal.
            for s in task
                .subtasks
                .iter()
                .filter(|s| !s.parked.load(Ordering::SeqCst))
            {
                s.push_seal(&self.shared);
            }
        }
    }

    /// Step 2: moves sealed commits along as their acknowledgements arrive; true once every
    /// running sub-task is parked with its commit ready (or nothing to commit). An error when
    /// processing failed or a task was fenced: the transaction must be aborted.
    pub fn transaction_ready(&self) -> Result<bool, EngineError> {
        if let Some(e) = self.failure() {
            return Err(EngineError::Stopped(e));
        }
        let mut ready = true;
        for task in self.tasks.values().filter(|t| t.is_running()) {
            if task.fence.is_fenced() {
                return Err(EngineError::Fenced);
            }
            for s in &task.subtasks {
                if !s.parked.load(Ordering::SeqCst) {
                    ready = false;
                    continue;
                }
                // A parked sub-task runs no job but the one that parked it, which is ending.
                let Some(mut core) = s.core.try_lock() else {
                    ready = false;
                    continue;
                };
                if core.sealed.as_ref().is_some_and(|c| !c.ready) {
                    core.advance_sealed(&s.id, false, &self.shared)?;
                    ready &= core.sealed.as_ref().is_none_or(|c| c.ready);
                }
            }
        }
        Ok(ready)
    }

    /// Step 3: every running task's progress as it stands once the ready commits are durable,
    /// for the transaction's offsets.
    pub fn prepare_transaction(&mut self) -> Vec<PartitionProgress> {
        for task in self.tasks.values().filter(|t| t.is_running()) {
            for s in &task.subtasks {
                if let Some(report) = s.core.lock().ready_report(&s.id) {
                    self.shared.report(report);
                }
            }
        }
        self.collect_progress()
    }

    /// Step 4, after the transaction committed: writes every ready commit to RocksDB. The
    /// sub-tasks stay parked until [`Engine::resume_after_transaction`] (a shutdown or a revoke
    /// closes some of them first).
    pub fn finish_transaction(&mut self) -> Result<(), EngineError> {
        for task in self.tasks.values().filter(|t| t.is_running()) {
            for s in &task.subtasks {
                s.core.lock().write_ready(&self.shared)?;
            }
        }
        Ok(())
    }

    /// Before an abort: fences every task and waits (up to `timeout`) until no sub-task job
    /// runs, so that nothing of the rolled-back work is sent after the abort, into the next
    /// transaction. True when no job runs any more.
    pub fn halt(&self, timeout: std::time::Duration) -> bool {
        self.fence_all();
        let deadline = std::time::Instant::now() + timeout;
        while self.shared.jobs.load(Ordering::SeqCst) > 0 {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// Forgets the error that stopped processing, once every task was closed without
    /// committing (a rollback): the tasks that open next start from committed state.
    pub fn clear_failure(&mut self) {
        debug_assert!(self.tasks.is_empty(), "clear_failure with tasks open");
        self.shared.failure.lock().take();
    }

    /// Lets every parked sub-task go on (into the next transaction).
    pub fn resume_after_transaction(&mut self) {
        for task in self.tasks.values() {
            for s in &task.subtasks {
                s.unpark(&self.shared);
            }
        }
    }
}
