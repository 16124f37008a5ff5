//! Windowed streams: `group_by_key().windowed_by(windows)` and their aggregations (Kafka
//! Streams' `TimeWindowedKStream` and `SessionWindowedKStream`). The semantics are in
//! [`crate::window`].

use std::sync::Arc;

use super::grouped::Resolved;
use super::{KGroupedStream, KStream, KTable, Materialized, TopologyError, WindowedTable};
use crate::graph::Supplier;
use crate::processor::{Datum, Typed};
use crate::serdes::{I64Serde, Serde};
use crate::store::{SessionStoreSpec, StoreKind, WindowStoreSpec};
use crate::window::aggregate::{MergeFn, StepFn, TimeWindowAggregate, WindowedAggregation};
use crate::window::session::SessionWindowAggregate;
use crate::window::sliding::SlidingWindowAggregate;
use crate::window::suppress::RETRACT_HEADER;
use crate::window::{
    EmitStrategy, SessionWindowedSerde, SessionWindows, SlidingWindows, TimeWindowedSerde,
    TimeWindows, WindowError, Windowed,
};

/// A window definition `windowed_by` accepts: [`TimeWindows`] and [`SlidingWindows`] give a
/// [`TimeWindowedKStream`], [`SessionWindows`] a [`SessionWindowedKStream`].
pub trait WindowedBy<K, V> {
    /// The windowed stream.
    type Stream;
    /// Windows `grouped` by `self`.
    fn windowed(self, grouped: &KGroupedStream<K, V>) -> Self::Stream;
}

impl<K: Datum + Clone, V: Datum + Clone> KGroupedStream<K, V> {
    /// Aggregates per window from here on (Kafka Streams' `windowedBy`): `TimeWindows`
    /// (tumbling, hopping), `SlidingWindows` or `SessionWindows`.
    pub fn windowed_by<W: WindowedBy<K, V>>(&self, windows: W) -> W::Stream {
        windows.windowed(self)
    }
}

#[derive(Clone, Copy, Debug)]
enum Timed {
    Time(TimeWindows),
    Sliding(SlidingWindows),
}

impl<K, V> WindowedBy<K, V> for TimeWindows {
    type Stream = TimeWindowedKStream<K, V>;
    fn windowed(self, grouped: &KGroupedStream<K, V>) -> Self::Stream {
        TimeWindowedKStream {
            grouped: grouped.clone(),
            windows: Timed::Time(self),
            emit: EmitStrategy::default(),
        }
    }
}

impl<K, V> WindowedBy<K, V> for SlidingWindows {
    type Stream = TimeWindowedKStream<K, V>;
    fn windowed(self, grouped: &KGroupedStream<K, V>) -> Self::Stream {
        TimeWindowedKStream {
            grouped: grouped.clone(),
            windows: Timed::Sliding(self),
            emit: EmitStrategy::default(),
        }
    }
}

impl<K, V> WindowedBy<K, V> for SessionWindows {
    type Stream = SessionWindowedKStream<K, V>;
    fn windowed(self, grouped: &KGroupedStream<K, V>) -> Self::Stream {
        SessionWindowedKStream {
            grouped: grouped.clone(),
            windows: self,
            emit: EmitStrategy::default(),
        }
    }
}

/// A stream grouped by key and windowed by [`TimeWindows`] or [`SlidingWindows`].
pub struct TimeWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: Timed,
    emit: EmitStrategy,
}

/// A stream grouped by key and windowed by [`SessionWindows`].
pub struct SessionWindowedKStream<K, V> {
    grouped: KGroupedStream<K, V>,
    windows: SessionWindows,
    emit: EmitStrategy,
}

/// Checks a window definition and settles the store's retention (`Materialized` or minimum).
fn retention<K, V>(
    grouped: &KGroupedStream<K, V>,
    store: &str,
    valid: Result<(), WindowError>,
    asked: Option<i64>,
    minimum: i64,
    why: &'static str,
) -> Option<i64>
where
    K: Datum + Clone,
    V: Datum + Clone,
{
    let checked = valid.and_then(|()| match asked {
        Some(r) if r < minimum => Err(WindowError::Retention {
            store: store.to_string(),
            retention_ms: r,
            minimum_ms: minimum,
            why,
        }),
        r => Ok(r.unwrap_or(minimum)),
    });
    match checked {
        Ok(r) => Some(r),
        Err(source) => {
            grouped.error(TopologyError::InvalidWindows {
                store: store.to_string(),
                source,
            });
            None
        }
    }
}

/// The output table of a windowed aggregation built from `r`.
fn windowed_table<K: Datum + Clone, A: Datum + Clone>(
    grouped_stream: &KStream<impl Sized, impl Sized>,
    node: usize,
    r: Resolved<K, A>,
    key_serde: Arc<dyn Serde<Windowed<K>>>,
    window: WindowedTable<Windowed<K>>,
) -> KTable<Windowed<K>, A> {
    KTable {
        stream: KStream {
            builder: grouped_stream.builder.clone(),
            node,
            key_serde: Some(key_serde),
            value_serde: Some(r.agg_serde),
            key_changed: false,
        },
        store: r.store,
        window: Some(window),
        versioned: false,
        view: None,
        changes: None,
    }
}

/// Reads the time a windowed key is released at (its window's end).
type WindowTime<K> = Arc<dyn Fn(&Windowed<K>) -> i64 + Send + Sync>;

fn window_end<K>() -> WindowTime<K> {
    Arc::new(|k: &Windowed<K>| k.window.end)
}

impl<K: Datum + Clone, V: Datum + Clone> TimeWindowedKStream<K, V> {
    /// When results are forwarded (Kafka Streams' `emitStrategy`): every update (default) or
    /// once per window when it closes.
    pub fn emit_strategy(mut self, emit: EmitStrategy) -> Self {
        self.emit = emit;
        self
    }

    /// Counts records per key and window in the window store `materialized` names.
    pub fn count(&self, materialized: impl Into<Materialized<K, i64>>) -> KTable<Windowed<K>, i64> {
        self.build(
            materialized.into(),
            Some(Arc::new(I64Serde)),
            |_k, _v, old| old.unwrap_or(0) + 1,
        )
    }

    /// Combines the values of each key and window with `reducer(aggregate, value)`.
    pub fn reduce(
        &self,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, V>>,
    ) -> KTable<Windowed<K>, V> {
        let values = self.grouped.stream.value_serde.clone();
        self.build(materialized.into(), values, move |_k, v, old| match old {
            Some(a) => reducer(a, v),
            None => v,
        })
    }

    /// Folds the values of each key and window into an aggregate: `initializer()` for a new
    /// window, then `aggregator(key, value, aggregate)`, stored with `materialized`'s value
    /// serde (Kafka Streams' `aggregate(Initializer, Aggregator, Materialized)`).
    pub fn aggregate<A: Datum + Clone>(
        &self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, A>>,
    ) -> KTable<Windowed<K>, A> {
        self.build(materialized.into(), None, move |k, v, old| {
            aggregator(k, v, old.unwrap_or_else(&initializer))
        })
    }

    fn build<A: Datum + Clone>(
        &self,
        materialized: Materialized<K, A>,
        agg_serde: Option<Arc<dyn Serde<A>>>,
        step: impl Fn(&K, V, Option<A>) -> A + Send + Sync + 'static,
    ) -> KTable<Windowed<K>, A> {
        let g = &self.grouped;
        let r = match g.resolve(materialized, agg_serde, "windowed-aggregate-store") {
            Ok(r) => r,
            Err((store, agg)) => return g.dangling_table(store, agg),
        };
        let (valid, minimum, size, why) = match self.windows {
            Timed::Time(w) => (
                w.validate(),
                w.minimum_retention_ms(),
                w.size_ms(),
                "size + grace",
            ),
            Timed::Sliding(w) => (
                w.validate(),
                w.minimum_retention_ms(),
                w.time_difference_ms(),
                "2 x time difference + grace",
            ),
        };
        let Some(retention_ms) = retention(g, &r.store, valid, r.retention_ms, minimum, why) else {
            return g.dangling_table(r.store, r.agg_serde);
        };
        let spec = WindowStoreSpec {
            retention_ms,
            window_size_ms: size,
            // Sliding windows fetch by key and time; time windows read single windows.
            indexed: matches!(self.windows, Timed::Sliding(_)),
            timestamped: true,
        };
        let step: StepFn<K, V, A> = Arc::new(step);
        let agg = WindowedAggregation {
            store: r.store.clone(),
            key_serde: r.key_serde.clone(),
            agg_serde: r.agg_serde.clone(),
            step,
            emit: self.emit,
            cached: r.cached,
        };
        let (supplier, due_after): (Supplier, i64) = match self.windows {
            Timed::Time(windows) => (
                Arc::new(move || {
                    Box::new(Typed::<_, K, V, Windowed<K>, A>::new(TimeWindowAggregate {
                        windows,
                        agg: agg.clone(),
                    }))
                }),
                // Closed once end <= stream time - grace.
                windows.grace_ms(),
            ),
            Timed::Sliding(windows) => (
                Arc::new(move || {
                    Box::new(Typed::<_, K, V, Windowed<K>, A>::new(
                        SlidingWindowAggregate {
                            windows,
                            agg: agg.clone(),
                        },
                    ))
                }),
                // Closed once end < stream time - grace.
                windows.grace_ms().saturating_add(1),
            ),
        };
        let node = g.add_aggregation(&r, StoreKind::Window(spec), supplier);
        let key_serde = Arc::new(TimeWindowedSerde::from_arc(r.key_serde.clone(), size));
        let window = WindowedTable {
            end_of: window_end(),
            due_after,
            updates: None,
        };
        windowed_table(&g.stream, node, r, key_serde, window)
    }
}

impl<K: Datum + Clone, V: Datum + Clone> SessionWindowedKStream<K, V> {
    /// When results are forwarded: every update (default) or once per session when it closes.
    pub fn emit_strategy(mut self, emit: EmitStrategy) -> Self {
        self.emit = emit;
        self
    }

    /// Counts records per key and session.
    pub fn count(&self, materialized: impl Into<Materialized<K, i64>>) -> KTable<Windowed<K>, i64> {
        self.build(
            materialized.into(),
            Some(Arc::new(I64Serde)),
            |_k, _v, old| old.unwrap_or(0) + 1,
            Arc::new(|_k: &K, merged: Option<i64>, s: i64| merged.unwrap_or(0) + s),
        )
    }

    /// Combines the values of each session with `reducer(aggregate, value)`; merged sessions
    /// combine with `reducer` too.
    pub fn reduce(
        &self,
        reducer: impl Fn(V, V) -> V + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, V>>,
    ) -> KTable<Windowed<K>, V> {
        let values = self.grouped.stream.value_serde.clone();
        let reducer = Arc::new(reducer);
        let r2 = reducer.clone();
        self.build(
            materialized.into(),
            values,
            move |_k, v, old| match old {
                Some(a) => reducer(a, v),
                None => v,
            },
            Arc::new(move |_k: &K, merged: Option<V>, s: V| match merged {
                Some(a) => r2(a, s),
                None => s,
            }),
        )
    }

    /// Folds the values of each session into an aggregate: `initializer()` for a new session,
    /// `aggregator(key, value, aggregate)` per record, and `merger(key, aggregate, other)` when
    /// a record bridges sessions (Kafka Streams' `aggregate(initializer, aggregator, merger,
    /// Materialized)`), stored with `materialized`'s value serde.
    pub fn aggregate<A: Datum + Clone>(
        &self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
        merger: impl Fn(&K, A, A) -> A + Send + Sync + 'static,
        materialized: impl Into<Materialized<K, A>>,
    ) -> KTable<Windowed<K>, A> {
        let init = Arc::new(initializer);
        let init2 = init.clone();
        self.build(
            materialized.into(),
            None,
            move |k, v, old| aggregator(k, v, old.unwrap_or_else(|| init())),
            Arc::new(move |k: &K, merged: Option<A>, s: A| {
                merger(k, merged.unwrap_or_else(|| init2()), s)
            }),
        )
    }

    fn build<A: Datum + Clone>(
        &self,
        materialized: Materialized<K, A>,
        agg_serde: Option<Arc<dyn Serde<A>>>,
        step: impl Fn(&K, V, Option<A>) -> A + Send + Sync + 'static,
        merge: MergeFn<K, A>,
    ) -> KTable<Windowed<K>, A> {
        let g = &self.grouped;
        let r = match g.resolve(materialized, agg_serde, "session-aggregate-store") {
            Ok(r) => r,
            Err((store, agg)) => return g.dangling_table(store, agg),
        };
        let w = self.windows;
        let asked = r.retention_ms;
        let Some(retention_ms) = retention(
            g,
            &r.store,
            w.validate(),
            asked,
            w.minimum_retention_ms(),
            "gap + grace",
        ) else {
            return g.dangling_table(r.store, r.agg_serde);
        };
        let agg = WindowedAggregation {
            store: r.store.clone(),
            key_serde: r.key_serde.clone(),
            agg_serde: r.agg_serde.clone(),
            step: Arc::new(step) as StepFn<K, V, A>,
            emit: self.emit,
            cached: r.cached,
        };
        let supplier: Supplier = Arc::new(move || {
            Box::new(Typed::<_, K, V, Windowed<K>, A>::new(
                SessionWindowAggregate {
                    windows: w,
                    agg: agg.clone(),
                    merge: merge.clone(),
                },
            ))
        });
        let kind = StoreKind::Session(SessionStoreSpec { retention_ms });
        let node = g.add_aggregation(&r, kind, supplier);
        // The table's update stream drops the retractions of merged sessions; suppress reads
        // them from the aggregation itself.
        let raw: KStream<Windowed<K>, A> = KStream {
            builder: g.stream.builder.clone(),
            node,
            key_serde: None,
            value_serde: None,
            key_changed: false,
        };
        let filtered = raw
            .stateless::<Windowed<K>, A>("drop-retractions", false, |rec, out| {
                if rec.headers.last(RETRACT_HEADER).is_none() {
                    out(rec)
                }
            })
            .node;
        let key_serde = Arc::new(SessionWindowedSerde::from_arc(r.key_serde.clone()));
        let window = WindowedTable {
            end_of: window_end(),
            // Closed once end < stream time - grace - gap.
            due_after: w
                .grace_ms()
                .saturating_add(w.inactivity_gap_ms())
                .saturating_add(1),
            updates: Some(node),
        };
        windowed_table(&g.stream, filtered, r, key_serde, window)
    }
}
