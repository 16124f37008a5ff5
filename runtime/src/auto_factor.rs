//! `parallelising.auto`: the parallelising factor follows the load, through the same live
//! change as `POST /admin/parallelising-factor` ([`crate::elastic`]).
//!
//! Every second the source loop samples each open sub-task: records queued (`depth`) and
//! records handled since the last sample. A range's **queue time** is `depth / rate` (Little's
//! law, [`crate::queue_time`]; a range with records queued that handled none in the second
//! counts as infinitely slow). Per input partition, over all its tasks:
//! - **Split**: when the busiest range's queue time was above `parallelising.auto.queue.time.ms`
//!   at [`HOT_SAMPLES`] samples in a row, the partition's factor doubles, capped at
//!   `parallelising.factor.max`.
//! - **Merge**: when none of its ranges had a record queued at [`IDLE_SAMPLES`] samples in a
//!   row, the factor halves, never below `parallelising.factor`.
//!
//! One change runs at a time; sampling starts afresh after it (the ranges are new). Splitting
//! helps when the ranges wait (a slow call per record) or worker threads are idle; a single hot
//! key stays on one range whatever the factor, which is why the factor is bounded. Like a change
//! through the admin route, the factor lasts until the process restarts, which starts every
//! partition at `parallelising.factor` again.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::elastic::{FactorControl, FactorReport, DEFAULT_FACTOR_TIMEOUT};
use crate::engine::{Engine, RangeLoad, TaskId};
use crate::queue_time::SAMPLE_EVERY;

/// Samples in a row above the bound before a partition splits.
pub const HOT_SAMPLES: u32 = 5;
/// Samples in a row with nothing queued before a partition merges.
pub const IDLE_SAMPLES: u32 = 60;

/// The bounds the factor moves within, and the queue time that splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoPolicy {
    /// The configured factor: merges stop here.
    pub base: usize,
    /// `parallelising.factor.max`: splits stop here.
    pub max: usize,
    /// `parallelising.auto.queue.time.ms`.
    pub queue_time: Duration,
}

/// Samples in a row that were hot, and that were idle, for one partition.
#[derive(Clone, Copy, Debug, Default)]
struct Streak {
    hot: u32,
    idle: u32,
}

/// Decides factor changes from load samples (no I/O: [`AutoFactor`] does that).
#[derive(Debug)]
pub struct AutoDecider {
    policy: AutoPolicy,
    /// Records handled per sub-task (task, range, factor) at the previous sample.
    previous: HashMap<(TaskId, usize, usize), u64>,
    streaks: BTreeMap<u32, Streak>,
}

impl AutoDecider {
    /// A decider with no samples yet.
    pub fn new(policy: AutoPolicy) -> Self {
        AutoDecider {
            policy,
            previous: HashMap::new(),
            streaks: BTreeMap::new(),
        }
    }

    /// Takes a sample taken `elapsed` after the previous one; returns the partition to change
    /// and its new factor, if one is due. A sub-task without an earlier sample (new, or
    /// re-split) only starts its count.
    pub fn observe(&mut self, elapsed: Duration, loads: &[RangeLoad]) -> Option<(u32, usize)> {
        let secs = elapsed.as_secs_f64().max(1e-3);
        // Per partition: its factor, the busiest queue time known, whether anything was queued.
        let mut partitions: BTreeMap<u32, (usize, Option<f64>, bool)> = BTreeMap::new();
        let mut seen = HashMap::with_capacity(loads.len());
        for l in loads {
            let key = (l.task, l.range, l.factor);
            let entry = partitions
                .entry(l.task.partition)
                .or_insert((l.factor, None, false));
            entry.0 = entry.0.max(l.factor);
            entry.2 |= l.depth > 0;
            if let Some(before) = self.previous.get(&key) {
                let rate = l.done.saturating_sub(*before) as f64 / secs;
                let queue_time = crate::queue_time::estimate(l.depth, rate);
                entry.1 = Some(entry.1.map_or(queue_time, |q: f64| q.max(queue_time)));
            }
            seen.insert(key, l.done);
        }
        self.previous = seen;
        self.streaks.retain(|p, _| partitions.contains_key(p));
        let bound = self.policy.queue_time.as_secs_f64();
        let mut decision = None;
        for (&partition, &(factor, queue_time, queued)) in &partitions {
            let streak = self.streaks.entry(partition).or_default();
            let hot = queue_time.is_some_and(|q| q > bound);
            match queue_time {
                Some(_) if hot => streak.hot = streak.hot.saturating_add(1),
                Some(_) => streak.hot = 0,
                // A range without an earlier sample neither extends nor breaks the streak.
                None => {}
            }
            streak.idle = if queued {
                0
            } else {
                streak.idle.saturating_add(1)
            };
            if decision.is_some() {
                continue;
            }
            if hot && streak.hot >= HOT_SAMPLES && factor < self.policy.max {
                decision = Some((partition, (factor * 2).min(self.policy.max)));
            } else if streak.idle >= IDLE_SAMPLES && factor > self.policy.base {
                decision = Some((partition, (factor / 2).max(self.policy.base)));
            }
        }
        if let Some((partition, _)) = decision {
            self.streaks.remove(&partition);
        }
        decision
    }

    /// Forgets every count: after a change the ranges are new.
    pub fn reset(&mut self) {
        self.previous.clear();
        self.streaks.clear();
    }
}

/// The source loop's side of `parallelising.auto`: samples the engine and asks for changes.
pub(crate) struct AutoFactor {
    decider: AutoDecider,
    control: FactorControl,
    last: Option<Instant>,
    /// Invariant: at most one change asked and not answered; no sample is taken meanwhile.
    pending: Option<(u32, oneshot::Receiver<Result<FactorReport, String>>)>,
}

impl AutoFactor {
    /// Asks for changes through `control`, within `policy`.
    pub fn new(policy: AutoPolicy, control: FactorControl) -> Self {
        tracing::info!(
            base = policy.base,
            max = policy.max,
            queue_time_ms = policy.queue_time.as_millis() as u64,
            "parallelising.auto: the factor follows the load"
        );
        AutoFactor {
            decider: AutoDecider::new(policy),
            control,
            last: None,
            pending: None,
        }
    }

    /// Takes a sample when one is due and asks for the change it calls for.
    pub fn turn(&mut self, engine: &Engine) {
        if let Some((partition, rx)) = &mut self.pending {
            let outcome = match rx.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => return,
                Ok(Ok(report)) => Ok(report),
                Ok(Err(why)) => Err(why),
                Err(oneshot::error::TryRecvError::Closed) => Err("the service is stopping".into()),
            };
            match outcome {
                Ok(report) => tracing::info!(
                    partition = *partition,
                    changed = ?report.changed,
                    skipped = ?report.skipped,
                    paused_ms = report.paused_ms,
                    "parallelising.auto: factor changed"
                ),
                Err(why) => tracing::warn!(
                    partition = *partition,
                    %why,
                    "parallelising.auto: factor not changed"
                ),
            }
            self.pending = None;
            self.decider.reset();
            self.last = None;
        }
        let now = Instant::now();
        let elapsed = match self.last {
            Some(last) if now.duration_since(last) < SAMPLE_EVERY => return,
            Some(last) => now.duration_since(last),
            None => Duration::ZERO,
        };
        self.last = Some(now);
        let loads = engine.range_load();
        if elapsed.is_zero() {
            // The first sample only starts the counts.
            self.decider.observe(SAMPLE_EVERY, &loads);
            return;
        }
        let Some((partition, factor)) = self.decider.observe(elapsed, &loads) else {
            return;
        };
        tracing::info!(partition, factor, "parallelising.auto: changing the factor");
        match self
            .control
            .send(factor, Some(vec![partition]), DEFAULT_FACTOR_TIMEOUT)
        {
            Ok(rx) => self.pending = Some((partition, rx)),
            Err(e) => tracing::warn!(error = %e, "parallelising.auto: could not ask for a change"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: AutoPolicy = AutoPolicy {
        base: 1,
        max: 4,
        queue_time: Duration::from_millis(500),
    };

    fn load(partition: u32, range: usize, factor: usize, depth: usize, done: u64) -> RangeLoad {
        RangeLoad {
            task: TaskId {
                sub_topology: 0,
                partition,
            },
            range,
            factor,
            depth,
            done,
        }
    }

    /// Feeds `samples` one second apart; returns the first decision and the sample it came at.
    fn run(d: &mut AutoDecider, samples: &[Vec<RangeLoad>]) -> Option<(usize, (u32, usize))> {
        samples
            .iter()
            .enumerate()
            .find_map(|(i, s)| d.observe(Duration::from_secs(1), s).map(|x| (i, x)))
    }

    #[test]
    fn a_range_that_stays_slow_splits_its_partition_after_five_samples() {
        let mut d = AutoDecider::new(POLICY);
        // 100 records/s handled with 1000 queued: 10 s of queue time, far above 0.5 s.
        let samples: Vec<_> = (0..10)
            .map(|i| vec![load(0, 0, 1, 1000, 100 * i), load(1, 0, 1, 0, 50 * i)])
            .collect();
        // Sample 0 starts the count; samples 1..=5 are hot.
        assert_eq!(run(&mut d, &samples), Some((5, (0, 2))));
    }

    #[test]
    fn a_fast_range_with_a_queue_does_not_split() {
        let mut d = AutoDecider::new(POLICY);
        // 10 000 records/s with 1000 queued: 0.1 s.
        let samples: Vec<_> = (0..20)
            .map(|i| vec![load(0, 0, 1, 1000, 10_000 * i)])
            .collect();
        assert_eq!(run(&mut d, &samples), None);
    }

    #[test]
    fn a_dip_below_the_bound_starts_the_count_again() {
        let mut d = AutoDecider::new(POLICY);
        let mut samples: Vec<_> = (0..4).map(|i| vec![load(0, 0, 1, 1000, 100 * i)]).collect();
        samples.push(vec![load(0, 0, 1, 0, 2000)]);
        samples.extend((0..5).map(|i| vec![load(0, 0, 1, 1000, 2000 + 100 * (i + 1))]));
        assert_eq!(run(&mut d, &samples), Some((9, (0, 2))));
    }

    #[test]
    fn a_stalled_range_counts_as_slow_and_splits_stop_at_the_max() {
        let mut d = AutoDecider::new(POLICY);
        let stalled: Vec<_> = (0..6)
            .map(|_| {
                vec![
                    load(0, 0, 3, 5, 7),
                    load(0, 1, 3, 0, 7),
                    load(0, 2, 3, 0, 7),
                ]
            })
            .collect();
        assert_eq!(run(&mut d, &stalled), Some((5, (0, 4))), "6 capped at 4");
        let mut d = AutoDecider::new(POLICY);
        let at_max: Vec<_> = (0..20).map(|_| vec![load(0, 0, 4, 5, 7)]).collect();
        assert_eq!(run(&mut d, &at_max), None);
    }

    #[test]
    fn an_idle_partition_merges_after_a_minute_but_not_below_the_base() {
        let mut d = AutoDecider::new(POLICY);
        let idle: Vec<_> = (0..70)
            .map(|i| {
                vec![
                    load(2, 0, 4, 0, i),
                    load(2, 1, 4, 0, i),
                    load(3, 0, 1, 0, i),
                ]
            })
            .collect();
        assert_eq!(run(&mut d, &idle), Some((59, (2, 2))));
        let mut d = AutoDecider::new(AutoPolicy { base: 3, ..POLICY });
        let idle: Vec<_> = (0..70).map(|_| vec![load(0, 0, 4, 0, 0)]).collect();
        assert_eq!(
            run(&mut d, &idle),
            Some((59, (0, 3))),
            "4 / 2 raised to the base 3"
        );
    }

    #[test]
    fn a_record_queued_now_and_then_keeps_a_partition_split() {
        let mut d = AutoDecider::new(POLICY);
        let samples: Vec<_> = (0..200)
            .map(|i| vec![load(0, 0, 2, usize::from(i % 30 == 0), i as u64 * 1000)])
            .collect();
        assert_eq!(run(&mut d, &samples), None);
    }

    #[test]
    fn a_revoked_partition_is_forgotten() {
        let mut d = AutoDecider::new(POLICY);
        let mut samples: Vec<_> = (0..4).map(|i| vec![load(0, 0, 1, 1000, 100 * i)]).collect();
        samples.push(vec![]);
        samples.extend((0..4).map(|i| vec![load(0, 0, 1, 1000, 100 * i)]));
        assert_eq!(
            run(&mut d, &samples),
            None,
            "3 + 3 hot samples, not 5 in a row"
        );
    }

    proptest! {
        /// Whatever the load, a decision moves one partition's factor by a factor of two
        /// within [base, max], up only after a hot streak and down only after an idle one.
        #[test]
        fn decisions_stay_within_the_bounds(
            base in 1usize..4,
            extra in 0usize..8,
            steps in prop::collection::vec((0u32..3, 0usize..8, 0usize..50, 0u64..400), 1..300),
        ) {
            let policy = AutoPolicy { base, max: base + extra, queue_time: Duration::from_millis(500) };
            let mut d = AutoDecider::new(policy);
            let mut done: BTreeMap<u32, u64> = BTreeMap::new();
            for (partition, above_base, depth, handled) in steps {
                let factor = base + above_base.min(extra);
                let n = done.entry(partition).or_default();
                *n += handled;
                let l = load(partition, 0, factor, depth, *n);
                if let Some((p, to)) = d.observe(Duration::from_secs(1), &[l]) {
                    prop_assert_eq!(p, partition);
                    prop_assert!(to >= policy.base && to <= policy.max, "{} outside", to);
                    prop_assert!(to == (factor * 2).min(policy.max) || to == (factor / 2).max(policy.base));
                    prop_assert_ne!(to, factor);
                    if to > factor {
                        prop_assert!(depth > 0, "split with nothing queued");
                    } else {
                        prop_assert_eq!(depth, 0, "merge with records queued");
                    }
                }
            }
        }
    }
}
