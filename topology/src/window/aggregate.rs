//! The windowed aggregation of [`TimeWindows`], and what every windowed aggregation shares: the
//! aggregation functions, emit-final release, late-record accounting.
//!
//! Per record (Kafka Streams' `KStreamWindowAggregate`): with `S` the range's stream time (the
//! record included) and `close = S - grace`, the record updates each window it falls in whose
//! end is above `close` (creating it from "no aggregate"), and is late for the others. The store
//! keeps each window's aggregate with the largest timestamp of its records, which is the
//! timestamp of the records it forwards.
//!
//! Emit-final ([`EmitStrategy::OnWindowClose`]): after each record, the windows that closed and
//! were not released yet (start at most `close - size`) are taken from the store's unreleased
//! notes in (start, key) order and forwarded, each under its own key's routing hash. The notes are
//! entries of the windows' keys (see `window::store`), so they commit with the range: a replay
//! after a crash releases exactly what the lost run had not committed, with the same values, and
//! a factor change or a restore from a compacted changelog neither repeats nor skips a window.

use std::sync::Arc;

use super::serde::{split_timestamped, timestamped};
use super::store::{Unreleased, WindowBytes};
use super::{EmitStrategy, TimeWindows, Window, Windowed};
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext};
use crate::record::{Headers, Record};
use crate::serdes::Serde;
use crate::store::StoreError;

/// One aggregation step: the key, the record's value and the window's aggregate so far (`None`
/// for a new window) give the new aggregate.
pub type StepFn<K, V, A> = Arc<dyn Fn(&K, V, Option<A>) -> A + Send + Sync>;
/// Merges a session's aggregate into the aggregate of the sessions merged so far (`None`: none
/// yet, the initializer's value).
pub type MergeFn<K, A> = Arc<dyn Fn(&K, Option<A>, A) -> A + Send + Sync>;

/// What every windowed aggregation processor needs besides its windows.
pub struct WindowedAggregation<K, V, A> {
    /// The window or session store.
    pub store: String,
    /// Serializes the grouping key into store keys.
    pub key_serde: Arc<dyn Serde<K>>,
    /// Serializes aggregates.
    pub agg_serde: Arc<dyn Serde<A>>,
    /// The aggregation step.
    pub step: StepFn<K, V, A>,
    /// When results are forwarded.
    pub emit: EmitStrategy,
    /// Whether emit-on-update results go through the record cache (time windows only).
    pub cached: bool,
}

impl<K, V, A> Clone for WindowedAggregation<K, V, A> {
    fn clone(&self) -> Self {
        WindowedAggregation {
            store: self.store.clone(),
            key_serde: self.key_serde.clone(),
            agg_serde: self.agg_serde.clone(),
            step: self.step.clone(),
            emit: self.emit,
            cached: self.cached,
        }
    }
}

/// An aggregate with its largest record timestamp, decoded from a window store.
pub(crate) struct Stamped<A> {
    pub value: A,
    pub timestamp: i64,
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> WindowedAggregation<K, V, A> {
    pub(crate) fn decode(&self, bytes: &[u8]) -> Result<Stamped<A>, ProcessError> {
        let (timestamp, value) = split_timestamped(bytes)?;
        Ok(Stamped {
            value: self.agg_serde.deserialize(value)?,
            timestamp,
        })
    }

    pub(crate) fn encode(&self, value: &A, timestamp: i64) -> Result<Vec<u8>, ProcessError> {
        Ok(timestamped(timestamp, &self.agg_serde.serialize(value)?))
    }

    /// Counts `late` dropped windows and logs the record once.
    pub(crate) fn report_late(
        &self,
        ctx: &mut ProcessorContext<'_, Windowed<K>, A>,
        late: usize,
        timestamp: i64,
        close: i64,
    ) {
        if late == 0 {
            return;
        }
        let meta = ctx.record_meta().clone();
        tracing::debug!(store = %self.store, topic = %meta.topic, partition = meta.partition, offset = meta.offset, timestamp, close, windows = late, "dropping a late record: its windows closed (end + grace at or below stream time)");
        for _ in 0..late {
            ctx.late_record_dropped(&self.store);
        }
    }

    /// The stream time to release closed windows at, without a record: `None` unless the
    /// aggregation emits final results and the sub-task has a stream time.
    pub(crate) fn release_time<KO, VO>(&self, ctx: &ProcessorContext<'_, KO, VO>) -> Option<i64> {
        (self.emit == EmitStrategy::OnWindowClose)
            .then(|| ctx.current_stream_time())
            .flatten()
    }

    /// Writes a window's aggregate; under emit-final, notes it as not released yet.
    pub(crate) fn put_window(
        &self,
        store: &mut WindowBytes<'_>,
        kb: &[u8],
        start: i64,
        encoded: &[u8],
    ) -> Result<(), StoreError> {
        match self.emit {
            EmitStrategy::OnWindowClose => store.put_unreleased(kb, start, encoded),
            EmitStrategy::OnWindowUpdate => store.put(kb, start, encoded),
        }
    }

    /// Releases the windows not released yet whose start is at most `upper` (window end =
    /// start + `size`): output records, each with its key's routing hash.
    pub(crate) fn release_windows(
        &self,
        store: &mut WindowBytes<'_>,
        upper: i64,
        size: i64,
        headers: &Headers,
    ) -> Result<Vec<Released<K, A>>, ProcessError> {
        let taken = store.take_unreleased(upper, size)?;
        self.released_records(taken, headers, |v, _| {
            let s = self.decode(v)?;
            Ok((s.value, s.timestamp))
        })
    }

    /// Turns taken windows into output records; `decode` gives a value's aggregate and the
    /// record's time (from the value and the window).
    pub(crate) fn released_records(
        &self,
        taken: Vec<Unreleased>,
        headers: &Headers,
        decode: impl Fn(&[u8], Window) -> Result<(A, i64), ProcessError>,
    ) -> Result<Vec<Released<K, A>>, ProcessError> {
        taken
            .into_iter()
            .map(|(k, window, v, hash)| {
                let (value, timestamp) = decode(&v, window)?;
                let record = Record {
                    key: Some(Windowed::new(self.key_serde.deserialize(&k)?, window)),
                    value,
                    timestamp,
                    headers: headers.clone(),
                };
                Ok((record, hash))
            })
            .collect()
    }
}

/// A released window's record, with the routing hash of its key (forwarded under it, so what
/// the children write lands in the key's range, whichever record released it).
pub(crate) type Released<K, A> = (Record<Windowed<K>, A>, Option<u64>);

/// The processor of a [`TimeWindows`] aggregation.
pub struct TimeWindowAggregate<K, V, A> {
    /// The windows.
    pub windows: TimeWindows,
    /// Store, serdes, step and emit strategy.
    pub agg: WindowedAggregation<K, V, A>,
}

impl<K: Datum + Clone, V: Datum + Clone, A: Datum + Clone> Processor<K, V, Windowed<K>, A>
    for TimeWindowAggregate<K, V, A>
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
        let ts = record.timestamp;
        let close = ctx
            .current_stream_time()
            .unwrap_or(ts)
            .saturating_sub(self.windows.grace_ms());
        let kb = agg.key_serde.serialize(&key)?;
        let mut out = Vec::new();
        // Cache keys of the window updates at the front of `out` (emit-on-update only).
        let mut updates = Vec::new();
        let mut late = 0;
        let mut released = Vec::new();
        {
            let mut store = WindowBytes::open(ctx.timed_store(&agg.store)?)?;
            for w in self.windows.windows_for(ts) {
                if w.end <= close {
                    late += 1;
                    continue;
                }
                let (old, new_ts) = match store.get(&kb, w.start)? {
                    Some(bytes) => {
                        let s = agg.decode(&bytes)?;
                        (Some(s.value), ts.max(s.timestamp))
                    }
                    None => (None, ts),
                };
                let new = (agg.step)(&key, record.value.clone(), old);
                let encoded = agg.encode(&new, new_ts)?;
                agg.put_window(&mut store, &kb, w.start, &encoded)?;
                if agg.emit == EmitStrategy::OnWindowUpdate {
                    let mut cache_key = kb.clone();
                    cache_key.extend_from_slice(&w.start.to_be_bytes());
                    let size = cache_key.len() + encoded.len();
                    updates.push((cache_key, size));
                    out.push(Record {
                        key: Some(Windowed::new(key.clone(), w)),
                        value: new,
                        timestamp: new_ts,
                        headers: record.headers.clone(),
                    });
                }
            }
            if agg.emit == EmitStrategy::OnWindowClose {
                let size = self.windows.size_ms();
                let upper = close.saturating_sub(size);
                released = agg.release_windows(&mut store, upper, size, &record.headers)?;
            }
            store.expire()?;
        }
        agg.report_late(ctx, late, ts, close);
        let mut updates = updates.into_iter();
        for r in out {
            match updates.next() {
                Some((cache_key, size)) if agg.cached => ctx.forward_cached(cache_key, size, r),
                _ => ctx.forward(r),
            }
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
        let size = self.windows.size_ms();
        let upper = now
            .saturating_sub(self.windows.grace_ms())
            .saturating_sub(size);
        let released = {
            let mut store = WindowBytes::open(ctx.timed_store(&agg.store)?)?;
            let released = agg.release_windows(&mut store, upper, size, &Headers::new())?;
            store.expire()?;
            released
        };
        for (r, hash) in released {
            ctx.forward_about(r, hash);
        }
        Ok(())
    }
}
