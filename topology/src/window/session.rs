//! [`SessionWindows`] and their aggregation (Kafka Streams' `SessionWindows` and
//! `KStreamSessionWindowAggregate`).
//!
//! A session is a period of activity of one key: records at most `gap` apart belong to the same
//! session `[first, last]` (both included). A record at `t` opens `[t, t]` and merges with every
//! session of its key that ends at or after `t - gap` and starts at or before `t + gap` (one
//! record can bridge two sessions). The merged session's aggregate is the merger applied to the
//! sessions' aggregates in order, then the aggregator to the record. The merged-away sessions are
//! removed; with emit-on-update each of them is forwarded once more as a retraction (see
//! [`RETRACT_HEADER`]), which the table's update stream filters out and `suppress` uses.
//!
//! With `close = S - grace - gap`, a record whose merged session ends before `close` is late.
//! Emit-final releases sessions that end before `close`; the store keeps sessions for
//! `gap + grace` after their end by default. Forwarded records carry the session end as their
//! timestamp.

use std::time::Duration;

use super::aggregate::{MergeFn, WindowedAggregation};
use super::store::SessionBytes;
use super::suppress::RETRACT_HEADER;
use super::{EmitStrategy, Window, WindowError, Windowed};
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext};
use crate::record::{Headers, Record};
use crate::time::millis;

/// Sessions of activity separated by more than an inactivity gap (Kafka Streams'
/// `SessionWindows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionWindows {
    gap_ms: i64,
    grace_ms: i64,
}

impl SessionWindows {
    /// Records at most `gap` apart share a session; a session accepts records until `grace`
    /// after it could last have been extended (`SessionWindows.ofInactivityGapAndGrace`).
    pub fn of_inactivity_gap_and_grace(gap: Duration, grace: Duration) -> Self {
        SessionWindows {
            gap_ms: millis(gap),
            grace_ms: millis(grace),
        }
    }

    /// Session windows without grace (`SessionWindows.ofInactivityGapWithNoGrace`).
    pub fn of_inactivity_gap_with_no_grace(gap: Duration) -> Self {
        Self::of_inactivity_gap_and_grace(gap, Duration::ZERO)
    }

    /// The inactivity gap in ms.
    pub fn inactivity_gap_ms(&self) -> i64 {
        self.gap_ms
    }

    /// The grace period in ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// The retention a store needs at least: gap + grace (the default).
    pub fn minimum_retention_ms(&self) -> i64 {
        self.gap_ms.saturating_add(self.grace_ms)
    }

    /// Checks the gap.
    pub(crate) fn validate(&self) -> Result<(), WindowError> {
        if self.gap_ms < 1 {
            return Err(WindowError::NotPositive {
                what: "the inactivity gap of SessionWindows",
            });
        }
        Ok(())
    }
}

/// The processor of a [`SessionWindows`] aggregation.
pub struct SessionWindowAggregate<K, V, A> {
    /// The windows.
    pub windows: SessionWindows,
    /// Store, serdes, step and emit strategy (the store is a session store).
    pub agg: WindowedAggregation<K, V, A>,
    /// Combines the aggregates of merged sessions.
    pub merge: MergeFn<K, A>,
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> Processor<K, V, Windowed<K>, A>
    for SessionWindowAggregate<K, V, A>
{
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut ProcessorContext<'_, Windowed<K>, A>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            ctx.record_dropped("null_key");
            return Ok(());
        };
        let agg = &self.agg;
        let (ts, gap) = (record.timestamp, self.windows.gap_ms);
        let close = ctx
            .current_stream_time()
            .unwrap_or(ts)
            .saturating_sub(self.windows.grace_ms)
            .saturating_sub(gap);
        let kb = agg.key_serde.serialize(&key)?;
        let mut out = Vec::new();
        let mut late = 0;
        let mut released = Vec::new();
        let final_only = agg.emit == EmitStrategy::OnWindowClose;
        {
            let mut store = SessionBytes::open(ctx.timed_store(&agg.store)?)?;
            let found = store.find_sessions(&kb, ts.saturating_sub(gap), ts.saturating_add(gap))?;
            let mut merged: Option<A> = None;
            let mut window = Window::new(ts, ts);
            let mut olds = Vec::with_capacity(found.len());
            for (_, w, bytes) in &found {
                let old = agg.agg_serde.deserialize(bytes)?;
                merged = Some((self.merge)(&key, merged, old.clone()));
                olds.push((*w, old));
                window = Window::new(window.start.min(w.start), window.end.max(w.end));
            }
            if window.end < close {
                late = 1;
            } else {
                if window != Window::new(ts, ts) {
                    for (w, old) in olds {
                        if final_only {
                            store.remove_unreleased(&kb, w)?;
                        } else {
                            store.remove(&kb, w)?;
                        }
                        if agg.emit == EmitStrategy::OnWindowUpdate {
                            // Kafka Streams forwards a null value here; see RETRACT_HEADER.
                            let mut headers = record.headers.clone();
                            headers.add(RETRACT_HEADER, Vec::new());
                            out.push(Record {
                                key: Some(Windowed::new(key.clone(), w)),
                                value: old,
                                timestamp: w.end,
                                headers,
                            });
                        }
                    }
                }
                let new = (agg.step)(&key, record.value, merged);
                let encoded = agg.agg_serde.serialize(&new)?;
                if final_only {
                    store.put_unreleased(&kb, window, &encoded)?;
                } else {
                    store.put(&kb, window, &encoded)?;
                }
                if agg.emit == EmitStrategy::OnWindowUpdate {
                    out.push(Record {
                        key: Some(Windowed::new(key.clone(), window)),
                        value: new,
                        timestamp: window.end,
                        headers: record.headers.clone(),
                    });
                }
            }
            if final_only {
                // Closed: the session ends before close.
                let taken = store.take_unreleased(close.saturating_sub(1))?;
                // A session's records carry its end as their time.
                released = agg.released_records(taken, &record.headers, |v, w| {
                    Ok((agg.agg_serde.deserialize(v)?, w.end))
                })?;
            }
            store.expire()?;
        }
        agg.report_late(ctx, late, ts, close);
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
        let agg = &self.agg;
        let Some(now) = agg.release_time(ctx) else {
            return Ok(());
        };
        let close = now
            .saturating_sub(self.windows.grace_ms)
            .saturating_sub(self.windows.gap_ms);
        let released = {
            let mut store = SessionBytes::open(ctx.timed_store(&agg.store)?)?;
            let taken = store.take_unreleased(close.saturating_sub(1))?;
            let released = agg.released_records(taken, &Headers::new(), |v, w| {
                Ok((agg.agg_serde.deserialize(v)?, w.end))
            })?;
            store.expire()?;
            released
        };
        for (r, hash) in released {
            ctx.forward_about(r, hash);
        }
        Ok(())
    }
}
