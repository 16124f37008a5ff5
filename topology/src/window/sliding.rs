//! [`SlidingWindows`] and their aggregation (Kafka Streams' `SlidingWindows` and
//! `KStreamSlidingWindowAggregate`).
//!
//! A sliding window `[start, start + d]` (both ends included, `d` the time difference) exists
//! where records make it distinct: each record at `t` has a *left* window `[t - d, t]`, and a
//! *right* window `[t + 1, t + 1 + d]` when some later record falls in it. Aggregates cannot be
//! subtracted, so a new window takes a copy of an existing window that holds exactly the same
//! earlier records, as Kafka Streams does: the left window copies the latest window ending before
//! `t` (it holds the records of `[t - d, t)`), the right window copies the latest window
//! containing `t` before this record was added. The store keeps each window with its largest
//! record timestamp, which tells whether a window holds records after `t`.
//!
//! Records at `t < d` would open windows starting below 0: they go to the window `[0, d]`
//! instead (Kafka Streams' "early records").
//!
//! A window accepts a record while its end is at or above `close = S - grace`; a record with
//! `t + 1 + d <= close` has no open window left and is dropped whole. The store keeps windows for
//! `2d + grace` by default, the oldest a new window can need to copy from.

use std::collections::HashSet;
use std::time::Duration;

use super::aggregate::WindowedAggregation;
use super::store::WindowBytes;
use super::{EmitStrategy, Window, WindowError, Windowed};
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext};
use crate::record::{Headers, Record};
use crate::time::millis;

/// Windows of a fixed time difference that slide with the records (Kafka Streams'
/// `SlidingWindows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindows {
    time_difference_ms: i64,
    grace_ms: i64,
}

impl SlidingWindows {
    /// Records at most `time_difference` apart share a window; windows accept records up to
    /// `grace` after their end (`SlidingWindows.ofTimeDifferenceAndGrace`).
    pub fn of_time_difference_and_grace(time_difference: Duration, grace: Duration) -> Self {
        SlidingWindows {
            time_difference_ms: millis(time_difference),
            grace_ms: millis(grace),
        }
    }

    /// Sliding windows without grace (`SlidingWindows.ofTimeDifferenceWithNoGrace`).
    pub fn of_time_difference_with_no_grace(time_difference: Duration) -> Self {
        Self::of_time_difference_and_grace(time_difference, Duration::ZERO)
    }

    /// The time difference in ms (the window covers `[start, start + time_difference]`).
    pub fn time_difference_ms(&self) -> i64 {
        self.time_difference_ms
    }

    /// The grace period in ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// The retention a store needs at least: `2 * time_difference + grace` (the default).
    pub fn minimum_retention_ms(&self) -> i64 {
        self.time_difference_ms
            .saturating_mul(2)
            .saturating_add(self.grace_ms)
    }

    /// Checks the time difference.
    pub(crate) fn validate(&self) -> Result<(), WindowError> {
        if self.time_difference_ms < 1 {
            return Err(WindowError::NotPositive {
                what: "the time difference of SlidingWindows",
            });
        }
        Ok(())
    }
}

/// A window's aggregate so far (`None`: fresh) and timestamp, as an update starts from.
type Base<A> = (Option<A>, i64);

/// The processor of a [`SlidingWindows`] aggregation.
pub struct SlidingWindowAggregate<K, V, A> {
    /// The windows.
    pub windows: SlidingWindows,
    /// Store, serdes, step and emit strategy.
    pub agg: WindowedAggregation<K, V, A>,
}

/// What one record does, collected while the store is open.
struct Pass<'r, K, V, A> {
    key: &'r K,
    kb: Vec<u8>,
    value: &'r V,
    ts: i64,
    close: i64,
    headers: &'r Headers,
    out: Vec<Record<Windowed<K>, A>>,
    late: usize,
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> SlidingWindowAggregate<K, V, A> {
    fn d(&self) -> i64 {
        self.windows.time_difference_ms
    }

    /// Adds the record to `window` (from `base`) if the window is still open.
    fn update(
        &self,
        store: &mut WindowBytes<'_>,
        p: &mut Pass<'_, K, V, A>,
        window: Window,
        base: Base<A>,
    ) -> Result<(), ProcessError> {
        if window.end < p.close {
            p.late += 1;
            return Ok(());
        }
        let (old, old_ts) = base;
        let new_ts = if old.is_none() {
            p.ts
        } else {
            p.ts.max(old_ts)
        };
        let new = (self.agg.step)(p.key, p.value.clone(), old);
        let encoded = self.agg.encode(&new, new_ts)?;
        self.agg.put_window(store, &p.kb, window.start, &encoded)?;
        self.forward(p, window, new, new_ts);
        Ok(())
    }

    fn forward(&self, p: &mut Pass<'_, K, V, A>, window: Window, value: A, timestamp: i64) {
        if self.agg.emit == EmitStrategy::OnWindowUpdate {
            p.out.push(Record {
                key: Some(Windowed::new(p.key.clone(), window)),
                value,
                timestamp,
                headers: p.headers.clone(),
            });
        }
    }

    /// The right window of the current record, copied from `right` (not checked against
    /// close: it ends after the record's own left window).
    fn create_current_right(
        &self,
        store: &mut WindowBytes<'_>,
        p: &mut Pass<'_, K, V, A>,
        right: (A, i64),
    ) -> Result<(), ProcessError> {
        let w = Window::new(p.ts + 1, p.ts + 1 + self.d());
        let encoded = self.agg.encode(&right.0, right.1)?;
        self.agg.put_window(store, &p.kb, w.start, &encoded)?;
        self.forward(p, w, right.0, right.1);
        Ok(())
    }

    fn window_at(&self, start: i64) -> Window {
        Window::new(start, start + self.d())
    }

    /// Kafka Streams' `processInOrder`, for records at `t >= d`.
    fn in_order(
        &self,
        store: &mut WindowBytes<'_>,
        p: &mut Pass<'_, K, V, A>,
    ) -> Result<(), ProcessError> {
        let (d, ts) = (self.d(), p.ts);
        let mut starts = HashSet::new();
        let mut left: Option<(A, i64)> = None;
        let mut right: Option<(A, i64)> = None;
        let (mut left_exists, mut right_exists) = (false, false);
        let mut previous: Option<i64> = None;
        for (start, bytes) in store.fetch(&p.kb, (ts - 2 * d).max(0), ts + 1)? {
            starts.insert(start);
            let end = start + d;
            let s = self.agg.decode(&bytes)?;
            if end < ts {
                previous = Some(s.timestamp);
                left = Some((s.value, s.timestamp));
            } else if end == ts {
                left_exists = true;
                if s.timestamp < ts {
                    previous = Some(s.timestamp);
                }
                self.update(
                    store,
                    p,
                    self.window_at(start),
                    (Some(s.value), s.timestamp),
                )?;
            } else if start <= ts {
                right = Some((s.value.clone(), s.timestamp));
                self.update(
                    store,
                    p,
                    self.window_at(start),
                    (Some(s.value), s.timestamp),
                )?;
            } else if start == ts + 1 {
                right_exists = true;
            } else {
                return Err(ProcessError::Internal(format!(
                    "sliding window starting at {start} fetched for a record at {ts}"
                )));
            }
        }
        if let Some(prev) = previous {
            let start = prev + 1;
            if !starts.contains(&start) && start + d >= ts {
                self.update(store, p, self.window_at(start), (None, ts))?;
            }
        }
        if !left_exists {
            let base = match (previous, left) {
                (Some(prev), Some((agg, _))) if ts - d <= prev => (Some(agg), ts),
                _ => (None, ts),
            };
            self.update(store, p, Window::new(ts - d, ts), base)?;
        }
        if let Some(r) = right.filter(|r| !right_exists && r.1 > ts) {
            self.create_current_right(store, p, r)?;
        }
        Ok(())
    }

    /// Kafka Streams' `processEarly`, for records at `0 <= t < d`: they share `[0, d]`.
    fn early(
        &self,
        store: &mut WindowBytes<'_>,
        p: &mut Pass<'_, K, V, A>,
    ) -> Result<(), ProcessError> {
        let ts = p.ts;
        let mut starts = HashSet::new();
        let mut combined: Option<(A, i64)> = None;
        let mut right: Option<(A, i64)> = None;
        let mut right_exists = false;
        let mut previous: Option<i64> = None;
        for (start, bytes) in store.fetch(&p.kb, 0, ts + 1)? {
            starts.insert(start);
            let s = self.agg.decode(&bytes)?;
            if start == 0 {
                if s.timestamp < ts {
                    previous = Some(s.timestamp);
                }
                combined = Some((s.value, s.timestamp));
            } else if start <= ts {
                right = Some((s.value.clone(), s.timestamp));
                self.update(
                    store,
                    p,
                    self.window_at(start),
                    (Some(s.value), s.timestamp),
                )?;
            } else if start == ts + 1 {
                right_exists = true;
            } else {
                return Err(ProcessError::Internal(format!(
                    "sliding window starting at {start} fetched for an early record at {ts}"
                )));
            }
        }
        if right.is_none() {
            right = combined.clone().filter(|c| c.1 > ts);
        }
        if let Some(r) = right.filter(|r| !right_exists && r.1 > ts) {
            self.create_current_right(store, p, r)?;
        }
        if let Some(prev) = previous.filter(|prev| !starts.contains(&(prev + 1))) {
            self.update(store, p, self.window_at(prev + 1), (None, ts))?;
        }
        let base = match combined {
            Some((agg, t)) => (Some(agg), t),
            None => (None, ts),
        };
        self.update(store, p, self.window_at(0), base)
    }
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> Processor<K, V, Windowed<K>, A>
    for SlidingWindowAggregate<K, V, A>
{
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut ProcessorContext<'_, Windowed<K>, A>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key.as_ref() else {
            ctx.record_dropped("null_key");
            return Ok(());
        };
        let ts = record.timestamp;
        let d = self.d();
        let close = ctx
            .current_stream_time()
            .unwrap_or(ts)
            .saturating_sub(self.windows.grace_ms);
        let mut p = Pass {
            key,
            kb: self.agg.key_serde.serialize(key)?,
            value: &record.value,
            ts,
            close,
            headers: &record.headers,
            out: Vec::new(),
            late: 0,
        };
        let mut released = Vec::new();
        {
            let mut store = WindowBytes::open(ctx.timed_store(&self.agg.store)?)?;
            if ts.saturating_add(1).saturating_add(d) <= close {
                p.late = 1;
            } else if ts < d {
                self.early(&mut store, &mut p)?;
            } else {
                self.in_order(&mut store, &mut p)?;
            }
            if self.agg.emit == EmitStrategy::OnWindowClose {
                // Closed: end < close, so start <= close - 1 - d.
                let upper = close.saturating_sub(1).saturating_sub(d);
                released = self
                    .agg
                    .release_windows(&mut store, upper, d, &record.headers)?;
            }
            store.expire()?;
        }
        let (out, late) = (std::mem::take(&mut p.out), p.late);
        self.agg.report_late(ctx, late, ts, close);
        for r in out {
            ctx.forward(r);
        }
        for (r, hash) in released {
            ctx.forward_about(r, hash);
        }
        Ok(())
    }

    fn on_stream_time(
        &mut self,
        ctx: &mut ProcessorContext<'_, Windowed<K>, A>,
    ) -> Result<(), ProcessError> {
        let Some(now) = self.agg.release_time(ctx) else {
            return Ok(());
        };
        let d = self.d();
        let close = now.saturating_sub(self.windows.grace_ms);
        let released = {
            let mut store = WindowBytes::open(ctx.timed_store(&self.agg.store)?)?;
            let upper = close.saturating_sub(1).saturating_sub(d);
            let released = self
                .agg
                .release_windows(&mut store, upper, d, &Headers::new())?;
            store.expire()?;
            released
        };
        for (r, hash) in released {
            ctx.forward_about(r, hash);
        }
        Ok(())
    }
}
