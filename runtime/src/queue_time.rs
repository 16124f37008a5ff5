//! Queue time per key range (`rill_range_queue_time_seconds`): how long a record that arrives
//! now waits before its range handles it.
//!
//! Once a second the source loop samples every open sub-task: records queued (`depth`) and
//! records handled since the last sample. By Little's law the queue time is `depth / rate`. A
//! range with records queued that handled none since the last sample reports how long it has
//! handled none (a lower bound: its true queue time is unbounded). `parallelising.auto`
//! ([`crate::auto_factor`]) splits on the same estimate.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::engine::{Engine, RangeLoad, TaskId};

/// How often the load is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Seconds a record waits behind `depth` queued records handled at `rate` records per second:
/// 0 with nothing queued, infinite when records are queued and none are handled.
pub(crate) fn estimate(depth: usize, rate: f64) -> f64 {
    match (depth, rate > 0.0) {
        (0, _) => 0.0,
        (_, false) => f64::INFINITY,
        (depth, true) => depth as f64 / rate,
    }
}

/// The queue time of one range at one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RangeQueueTime {
    /// The range's task.
    pub task: TaskId,
    /// Index of the range.
    pub range: usize,
    /// Seconds (finite: a stalled range reports how long it has been stalled).
    pub seconds: f64,
}

/// Per-range samples between two turns of the source loop.
#[derive(Default)]
pub(crate) struct QueueTimes {
    last: Option<Instant>,
    /// Per (task, range, factor): records handled at the last sample and when the range last
    /// handled one. The factor is part of the key: a re-split range starts afresh.
    previous: HashMap<(TaskId, usize, usize), (u64, Instant)>,
}

impl QueueTimes {
    /// Whether a sample is due.
    pub fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= SAMPLE_EVERY)
    }

    /// Samples `engine` and sets its ranges' queue-time gauges.
    pub fn publish(&mut self, engine: &Engine) {
        let times = self.sample(Instant::now(), &engine.range_load());
        engine.publish_queue_times(&times);
    }

    /// The queue time of every range in `loads` that was also in the previous sample.
    fn sample(&mut self, now: Instant, loads: &[RangeLoad]) -> Vec<RangeQueueTime> {
        let elapsed = self
            .last
            .map(|t| now.duration_since(t).as_secs_f64().max(1e-3));
        self.last = Some(now);
        let mut seen = HashMap::with_capacity(loads.len());
        let mut out = Vec::with_capacity(loads.len());
        for l in loads {
            let key = (l.task, l.range, l.factor);
            let mut progressed = now;
            if let (Some(&(before, last_progress)), Some(elapsed)) =
                (self.previous.get(&key), elapsed)
            {
                let handled = l.done.saturating_sub(before);
                if handled == 0 {
                    progressed = last_progress;
                }
                let seconds = estimate(l.depth, handled as f64 / elapsed);
                out.push(RangeQueueTime {
                    task: l.task,
                    range: l.range,
                    seconds: if seconds.is_finite() {
                        seconds
                    } else {
                        now.duration_since(progressed).as_secs_f64()
                    },
                });
            }
            seen.insert(key, (l.done, progressed));
        }
        self.previous = seen;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(range: usize, depth: usize, done: u64) -> RangeLoad {
        RangeLoad {
            task: TaskId {
                sub_topology: 0,
                partition: 0,
            },
            range,
            factor: 2,
            depth,
            done,
        }
    }

    #[test]
    fn queue_time_is_depth_over_rate_and_a_stall_counts_its_duration() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut q = QueueTimes::default();
        assert!(q.sample(at(0), &[load(0, 10, 0), load(1, 0, 0)]).is_empty());
        // Range 0: 1000 queued, 100 handled in the second: 10 s. Range 1: nothing queued.
        let s = q.sample(at(1), &[load(0, 1000, 100), load(1, 0, 50)]);
        assert_eq!(
            s.iter().map(|t| t.seconds).collect::<Vec<_>>(),
            vec![10.0, 0.0]
        );
        // Range 0 stalls with records queued: 1 s, then 2 s since it last handled one.
        assert_eq!(q.sample(at(2), &[load(0, 1000, 100)])[0].seconds, 1.0);
        assert_eq!(q.sample(at(3), &[load(0, 1000, 100)])[0].seconds, 2.0);
        // A range of another factor (re-split) starts afresh.
        let mut resplit = load(0, 5, 100);
        resplit.factor = 4;
        assert!(q.sample(at(4), &[resplit]).is_empty());
    }
}
