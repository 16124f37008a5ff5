//! Liveness and readiness, shared by the runtime (which sets them) and the HTTP endpoint (which
//! serves them as `/health` and `/ready`).
//!
//! - **live** (`/health`): the processing loop has not stopped on an error.
//! - **ready** (`/ready`): live, the consumer has received its assignment, no store is restoring,
//!   the consumer reaches at least one broker, and no shutdown has begun. A load balancer or an
//!   orchestrator's rolling update waits for it; a monitor sees a broker outage on it.
//!
//! The changelog restore calls [`Health::restore_started`] / [`Health::restore_finished`] around
//! each store partition it rebuilds, so `/ready` holds back until every assigned task is restored.
//! The consumer's librdkafka statistics (every second) call [`Health::set_brokers_reachable`]:
//! while no broker connection is up, `/ready` answers 503 (processing resumes by itself when a
//! broker is back; `/health` stays 200, as the process needs no restart).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The state of a runtime, with Kafka Streams' names (`KafkaStreams.State`), as a state
/// listener sees it change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamsState {
    /// Built, not started.
    Created,
    /// Started, and waiting for its assignment, in a rebalance, or restoring a store.
    Rebalancing,
    /// Every assigned task processes.
    Running,
    /// Shutdown began: draining and committing.
    PendingShutdown,
    /// Stopped after a shutdown.
    NotRunning,
    /// Processing stopped on an error.
    Error,
}

/// Told each change of a runtime's state: `(new, old)`, as Kafka Streams' `StateListener`.
pub type StateListener = Arc<dyn Fn(StreamsState, StreamsState) + Send + Sync>;

/// Liveness and readiness flags of one runtime.
///
/// Invariant: each flag is written by one kind of event only (the loop's end, an assignment,
/// a restore, a shutdown) and read independently; no decision needs two flags consistent with
/// each other at one instant, so plain atomics with SeqCst suffice.
#[derive(Debug, Default)]
pub struct Health {
    /// Set when the processing loop stopped on an error.
    failed: AtomicBool,
    /// Set once the consumer group gave this member its (possibly empty) assignment.
    assigned: AtomicBool,
    /// Store partitions being restored right now.
    restoring: AtomicUsize,
    /// Set when shutdown begins (a signal or `RunningRuntime::shutdown`).
    stopping: AtomicBool,
    /// Set while the consumer has no broker connection up (from librdkafka's statistics).
    brokers_unreachable: AtomicBool,
    /// Set while a rebalance callback runs.
    rebalancing: AtomicBool,
    /// Set once the runtime has stopped.
    stopped: AtomicBool,
    /// The state last told, and whom to tell. Invariant: every flag change re-derives the
    /// state under this lock, so the listener hears each change once and in order.
    told: Mutex<Told>,
}

#[derive(Default)]
struct Told {
    state: Option<StreamsState>,
    listener: Option<StateListener>,
}

impl std::fmt::Debug for Told {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Told").field("state", &self.state).finish()
    }
}

impl Health {
    /// A runtime that is live and not yet ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`Health::new`] that tells `listener` each state change, starting with the move from
    /// `Created` to `Rebalancing`.
    pub fn with_listener(listener: Option<StateListener>) -> Self {
        let h = Self::default();
        *h.told.lock() = Told {
            state: Some(StreamsState::Created),
            listener,
        };
        h.changed();
        h
    }

    /// The runtime's state, derived from the flags.
    pub fn state(&self) -> StreamsState {
        if self.failed.load(Ordering::SeqCst) {
            StreamsState::Error
        } else if self.stopped.load(Ordering::SeqCst) {
            StreamsState::NotRunning
        } else if self.stopping.load(Ordering::SeqCst) {
            StreamsState::PendingShutdown
        } else if !self.assigned.load(Ordering::SeqCst)
            || self.rebalancing.load(Ordering::SeqCst)
            || self.restoring.load(Ordering::SeqCst) > 0
        {
            StreamsState::Rebalancing
        } else {
            StreamsState::Running
        }
    }

    /// Tells the listener when the state differs from the one last told.
    fn changed(&self) {
        let mut told = self.told.lock();
        let now = self.state();
        let old = told.state.replace(now);
        if let (Some(old), Some(listener)) = (old, &told.listener) {
            if old != now {
                listener(now, old);
            }
        }
    }

    /// Marks a rebalance callback as running (`true`) or done.
    pub fn set_rebalancing(&self, rebalancing: bool) {
        self.rebalancing.store(rebalancing, Ordering::SeqCst);
        self.changed();
    }

    /// Marks the runtime as stopped (after its loop ended and its tasks closed).
    pub fn set_stopped(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.changed();
    }

    /// Whether the process is live (the loop has not failed).
    pub fn is_live(&self) -> bool {
        !self.failed.load(Ordering::SeqCst)
    }

    /// Whether every assigned task is ready (assigned, restored) and no shutdown has begun.
    pub fn is_ready(&self) -> bool {
        self.is_live()
            && self.assigned.load(Ordering::SeqCst)
            && self.restoring.load(Ordering::SeqCst) == 0
            && !self.stopping.load(Ordering::SeqCst)
            && !self.brokers_unreachable.load(Ordering::SeqCst)
    }

    /// Records whether any broker connection is up; returns whether that changed.
    pub fn set_brokers_reachable(&self, reachable: bool) -> bool {
        self.brokers_unreachable.swap(!reachable, Ordering::SeqCst) == reachable
    }

    /// Whether some broker connection was up at the last statistics.
    pub fn brokers_reachable(&self) -> bool {
        !self.brokers_unreachable.load(Ordering::SeqCst)
    }

    /// Marks the loop as stopped on an error.
    pub fn set_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.changed();
    }

    /// Marks that the group assigned this member its partitions.
    pub fn set_assigned(&self) {
        self.assigned.store(true, Ordering::SeqCst);
        self.changed();
    }

    /// Marks that shutdown began: not ready any more.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.changed();
    }

    /// A store partition starts restoring: not ready until it finishes.
    pub fn restore_started(&self) {
        self.restoring.fetch_add(1, Ordering::SeqCst);
        self.changed();
    }

    /// A store partition finished restoring (call once per `restore_started`).
    pub fn restore_finished(&self) {
        // Saturating, so an unpaired call cannot wrap the count and block readiness for good.
        let _ = self
            .restoring
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        self.changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_assignment_and_no_restore_and_no_shutdown() {
        let h = Health::new();
        assert!(h.is_live());
        assert!(!h.is_ready(), "not ready before the assignment");
        h.set_assigned();
        assert!(h.is_ready());
        h.restore_started();
        h.restore_started();
        h.restore_finished();
        assert!(!h.is_ready(), "one store still restoring");
        h.restore_finished();
        h.restore_finished();
        assert!(h.is_ready(), "an extra finish does not wrap the count");
        assert!(!h.set_brokers_reachable(true), "reachable from the start");
        assert!(h.set_brokers_reachable(false));
        assert!(!h.is_ready(), "no broker reachable");
        assert!(h.is_live(), "a broker outage needs no restart");
        assert!(h.set_brokers_reachable(true));
        assert!(h.is_ready());
        h.set_stopping();
        assert!(!h.is_ready());
        assert!(h.is_live());
        h.set_failed();
        assert!(!h.is_live());
    }

    /// Issue 42, item 6: a state listener hears Kafka Streams' states in order, each change
    /// once: rebalancing until assigned and restored, running, rebalancing again during a
    /// rebalance, then pending shutdown and not running.
    #[test]
    fn a_state_listener_hears_each_change_once_in_order() {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h2 = heard.clone();
        let h = Health::with_listener(Some(Arc::new(move |new, old| {
            h2.lock().push((old, new));
        })));
        assert_eq!(h.state(), StreamsState::Rebalancing);
        h.restore_started();
        h.set_assigned();
        h.restore_finished();
        assert_eq!(h.state(), StreamsState::Running);
        h.set_rebalancing(true);
        h.set_rebalancing(false);
        h.set_stopping();
        h.set_stopped();
        use StreamsState::*;
        assert_eq!(
            *heard.lock(),
            [
                (Created, Rebalancing),
                (Rebalancing, Running),
                (Running, Rebalancing),
                (Rebalancing, Running),
                (Running, PendingShutdown),
                (PendingShutdown, NotRunning),
            ]
        );
        let errored = Health::with_listener(None);
        errored.set_failed();
        assert_eq!(errored.state(), Error);
    }
}
