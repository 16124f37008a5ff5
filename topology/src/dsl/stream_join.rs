//! Windowed stream-stream joins: [`KStream::join_windowed`], [`KStream::left_join_windowed`] and
//! [`KStream::outer_join_windowed`] (Kafka Streams' `KStream.join(KStream, ValueJoiner,
//! JoinWindows)` and its `leftJoin` / `outerJoin`).
//!
//! Two records join when they have the same key and their timestamps are at most the window's
//! difference apart ([`JoinWindows`]). Each side's records wait in a window store of their own
//! (`<name>-this-store`, `<name>-other-store`, changelogged like every store) for as long as a
//! record of the other side may still join them: the difference on both sides plus the grace
//! period, in stream time. A record of either side is put into its own store and looked up in
//! the other's: every match produces `joiner(..)` with the larger of the two timestamps, in the
//! order of the other records' timestamps.
//!
//! Left and outer joins emit the records of their outer side(s) that found no match with `None`
//! for the other value, as Kafka Streams 3.x+ does: only once the record's window has closed
//! (its timestamp plus the look-ahead plus the grace period is below stream time), so a record
//! that finds its match late produces the match and never a spurious `None` result. Until then
//! it waits in a third store (`<name>-outer-store`), which is scanned, in timestamp order, when
//! a record advances stream time. A record that arrives when its window has already ended is
//! joined with what the other store still holds, and if nothing, emitted with `None` at once;
//! one older than the stores' retention (window size plus grace) is not stored. On an outer
//! side a record without a key produces `joiner(value, None)` at once (KIP-962); elsewhere it is
//! dropped (`null_key`). Where rill differs: Kafka Streams scans the outer store at most once
//! per second of wall-clock time (an internal setting), rill on every record that advances
//! stream time, so what is emitted does not depend on timing.
//!
//! Both streams must be co-partitioned (same partition count, keys partitioned alike): their
//! topics are read by the same tasks and split by the same key ranges, so a join never leaves
//! its range; a stream whose key changed upstream is repartitioned first. Stream time is the key
//! range's, as everywhere in rill, so when a window closes is decided per range.

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use super::{KStream, Repartitioned};
use crate::graph::Supplier;
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext, Typed};
use crate::record::Record;
use crate::serdes::Serde;
use crate::store::{StoreKind, WindowStoreSpec};
use crate::window::store::WindowBytes;

/// How far apart in time two records may be to join (Kafka Streams' `JoinWindows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinWindows {
    /// How much earlier than a record of this stream the other's record may be (ms).
    before_ms: i64,
    /// How much later (ms).
    after_ms: i64,
    /// How long after a window's end records are still accepted (ms).
    grace_ms: i64,
}

impl JoinWindows {
    /// Records at most `difference` apart join; records up to `grace` late (in stream time) are
    /// still joined (`JoinWindows.ofTimeDifferenceAndGrace`).
    pub fn of_time_difference_and_grace(difference: Duration, grace: Duration) -> Self {
        let d = millis(difference);
        JoinWindows {
            before_ms: d,
            after_ms: d,
            grace_ms: millis(grace),
        }
    }

    /// Records at most `difference` apart join; none is accepted late
    /// (`JoinWindows.ofTimeDifferenceWithNoGrace`).
    pub fn of_time_difference_with_no_grace(difference: Duration) -> Self {
        Self::of_time_difference_and_grace(difference, Duration::ZERO)
    }

    /// The other stream's records may be up to `before` earlier than this stream's.
    pub fn before(self, before: Duration) -> Self {
        JoinWindows {
            before_ms: millis(before),
            ..self
        }
    }

    /// The other stream's records may be up to `after` later than this stream's.
    pub fn after(self, after: Duration) -> Self {
        JoinWindows {
            after_ms: millis(after),
            ..self
        }
    }

    /// How long (in stream time) the stores keep a record: the window's size plus the grace.
    fn retention(&self) -> i64 {
        self.before_ms
            .saturating_add(self.after_ms)
            .saturating_add(self.grace_ms)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Serdes for the stores of a stream-stream join (Kafka Streams' `StreamJoined`): the key and
/// each side's values. Unset ones come from the streams.
pub struct StreamJoined<K, V1, V2> {
    key_serde: Option<Arc<dyn Serde<K>>>,
    this_value_serde: Option<Arc<dyn Serde<V1>>>,
    other_value_serde: Option<Arc<dyn Serde<V2>>>,
    name: Option<String>,
}

impl<K, V1, V2> Default for StreamJoined<K, V1, V2> {
    fn default() -> Self {
        StreamJoined {
            key_serde: None,
            this_value_serde: None,
            other_value_serde: None,
            name: None,
        }
    }
}

impl<K, V1, V2> StreamJoined<K, V1, V2> {
    /// The key serde and the two value serdes (`StreamJoined.with`).
    pub fn with(
        key: impl Serde<K> + 'static,
        this_value: impl Serde<V1> + 'static,
        other_value: impl Serde<V2> + 'static,
    ) -> Self {
        StreamJoined {
            key_serde: Some(Arc::new(key)),
            this_value_serde: Some(Arc::new(this_value)),
            other_value_serde: Some(Arc::new(other_value)),
            name: None,
        }
    }

    /// Names the join's nodes and stores (`<name>-this-store`, ...).
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
}

/// A join's result from (this value, other value); at least one is set.
type Joiner<V1, V2, VR> = Arc<dyn Fn(Option<V1>, Option<V2>) -> VR + Send + Sync>;

/// Which of the two streams a record came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    This,
    Other,
}

impl Side {
    /// Its byte in the outer store's keys (Kafka Streams': the right side sorts first).
    fn byte(self) -> u8 {
        match self {
            Side::Other => 0,
            Side::This => 1,
        }
    }
}

/// The join processor of one side: puts its records in its store, looks them up in the other's.
#[derive(Clone)]
struct JoinSide<K, VT, VO, VR> {
    side: Side,
    this_store: String,
    other_store: String,
    /// The store of unmatched records waiting for their window to close (left and outer joins).
    outer_store: Option<String>,
    /// Whether this side's unmatched records produce a result (the left side of a left join,
    /// both sides of an outer one).
    outer: bool,
    key_serde: Arc<dyn Serde<K>>,
    this_serde: Arc<dyn Serde<VT>>,
    other_serde: Arc<dyn Serde<VO>>,
    /// Other records from `ts - before` to `ts + after` join a record at `ts`.
    before: i64,
    after: i64,
    grace: i64,
    /// (this value, other value) to the result; `None`: absent.
    pair: Joiner<VT, VO, VR>,
    /// The stream time of this processor's last scan for closed windows: it scans again once
    /// stream time has moved past it (Kafka Streams scans at a record whose timestamp is the
    /// stream time; here a record may move stream time to the partition's, above its own).
    scanned: Option<i64>,
}

impl<K, VT, VO, VR> Processor<K, VT, K, VR> for JoinSide<K, VT, VO, VR>
where
    K: Datum + Clone,
    VT: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    fn on_stream_time(
        &mut self,
        ctx: &mut ProcessorContext<'_, K, VR>,
    ) -> Result<(), ProcessError> {
        let Some(now) = ctx.current_stream_time() else {
            return Ok(());
        };
        if self.scanned.is_none_or(|s| now > s) {
            self.emit_closed(ctx, now, &crate::record::Headers::new())?;
            self.scanned = Some(now);
        }
        Ok(())
    }

    fn process(
        &mut self,
        record: Record<K, VT>,
        ctx: &mut ProcessorContext<'_, K, VR>,
    ) -> Result<(), ProcessError> {
        let ts = record.timestamp;
        let Some(key) = record.key.clone() else {
            // An outer side passes a record without a key through unjoined (KIP-962).
            if self.outer {
                ctx.forward(Record {
                    key: None,
                    value: (self.pair)(Some(record.value), None),
                    timestamp: ts,
                    headers: record.headers,
                });
            } else {
                ctx.record_dropped("null_key");
            }
            return Ok(());
        };
        let stream_time = ctx.current_stream_time().unwrap_or(ts);
        // As Kafka Streams: the window is [ts - before, ts + after], cut at 0.
        let (from, to) = (
            ts.saturating_sub(self.before).max(0),
            ts.saturating_add(self.after).max(0),
        );
        if self.scanned.is_none_or(|s| stream_time > s) {
            self.emit_closed(ctx, stream_time, &record.headers)?;
            self.scanned = Some(stream_time);
        }
        let kb = self.key_serde.serialize(&key)?;
        let vb = self.this_serde.serialize(&record.value)?;
        append(
            &mut WindowBytes::open(ctx.timed_store(&self.this_store)?)?,
            &kb,
            ts,
            &vb,
        )?;
        let matches =
            WindowBytes::open(ctx.timed_store(&self.other_store)?)?.fetch(&kb, from, to)?;
        let mut matched = false;
        for (other_ts, list) in matches {
            for ob in values(&list) {
                matched = true;
                let other = self.other_serde.deserialize(ob)?;
                ctx.forward(Record {
                    key: Some(key.clone()),
                    value: (self.pair)(Some(record.value.clone()), Some(other)),
                    timestamp: ts.max(other_ts),
                    headers: record.headers.clone(),
                });
            }
            if let Some(outer) = &self.outer_store {
                // The other record has its match now: it produces no unmatched result.
                ctx.store(outer)?
                    .delete(&outer_key(other_ts, self.side_of_other(), &kb))?;
            }
        }
        if !matched && self.outer {
            match &self.outer_store {
                // Its window is open: a match may still come.
                Some(outer) if to >= stream_time => {
                    let store = ctx.store(outer)?;
                    let k = outer_key(ts, self.side, &kb);
                    let mut list = store.get(&k)?.unwrap_or_default();
                    push_value(&mut list, &vb);
                    store.put(&k, &list)?;
                }
                _ => ctx.forward(Record {
                    key: Some(key),
                    value: (self.pair)(Some(record.value), None),
                    timestamp: ts,
                    headers: record.headers,
                }),
            }
        }
        Ok(())
    }
}

impl<K, VT, VO, VR> JoinSide<K, VT, VO, VR>
where
    K: Datum + Clone,
    VT: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    fn side_of_other(&self) -> Side {
        match self.side {
            Side::This => Side::Other,
            Side::Other => Side::This,
        }
    }

    /// Emits the unmatched records whose window closed (timestamp + look-ahead + grace below
    /// stream time), in timestamp order, and forgets them.
    fn emit_closed(
        &self,
        ctx: &mut ProcessorContext<'_, K, VR>,
        stream_time: i64,
        headers: &crate::record::Headers,
    ) -> Result<(), ProcessError> {
        let Some(outer) = &self.outer_store else {
            return Ok(());
        };
        // An entry of this side at `t` is due when t + after + grace < stream time; one of the
        // other side when t + before + grace < stream time (its look-ahead is this side's
        // look-back).
        let reach = self.after.min(self.before).saturating_add(self.grace);
        let bound = time_bytes(stream_time.saturating_sub(reach));
        let entries = ctx
            .store(outer)?
            .range(Bound::Unbounded, Bound::Excluded(bound.as_slice()))?;
        for (k, list) in entries {
            let Some((t, side, kb)) = parse_outer_key(&k) else {
                continue;
            };
            let ahead = if side == self.side {
                self.after
            } else {
                self.before
            };
            if t.saturating_add(ahead).saturating_add(self.grace) >= stream_time {
                continue;
            }
            let key = self.key_serde.deserialize(kb)?;
            for vb in values(&list) {
                let value = if side == self.side {
                    (self.pair)(Some(self.this_serde.deserialize(vb)?), None)
                } else {
                    (self.pair)(None, Some(self.other_serde.deserialize(vb)?))
                };
                ctx.forward(Record {
                    key: Some(key.clone()),
                    value,
                    timestamp: t,
                    headers: headers.clone(),
                });
            }
            ctx.store(outer)?.delete(&k)?;
        }
        Ok(())
    }
}

/// Appends `value` to the values of `key` at `ts` (records with equal key and timestamp all
/// join: Kafka Streams' `retainDuplicates`).
fn append(
    store: &mut WindowBytes<'_>,
    key: &[u8],
    ts: i64,
    value: &[u8],
) -> Result<(), ProcessError> {
    let mut list = store.get(key, ts)?.unwrap_or_default();
    push_value(&mut list, value);
    store.put(key, ts, &list)?;
    Ok(())
}

/// Adds one length-prefixed value to a list.
fn push_value(list: &mut Vec<u8>, value: &[u8]) {
    list.extend_from_slice(&(value.len() as u32).to_be_bytes());
    list.extend_from_slice(value);
}

/// The values of a list written by [`push_value`] (a truncated tail is ignored).
fn values(list: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = list;
    while rest.len() >= 4 {
        let n = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(v) = rest.get(4..4 + n) else {
            break;
        };
        out.push(v);
        rest = &rest[4 + n..];
    }
    out
}

/// A timestamp as bytes that sort like the numbers.
fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The outer store's key: timestamp, side, key bytes (scans go in timestamp order).
fn outer_key(t: i64, side: Side, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&time_bytes(t));
    k.push(side.byte());
    k.extend_from_slice(key);
    k
}

fn parse_outer_key(k: &[u8]) -> Option<(i64, Side, &[u8])> {
    let t = u64::from_be_bytes(k.get(..8)?.try_into().ok()?) ^ (1 << 63);
    let side = match k.get(8)? {
        0 => Side::Other,
        1 => Side::This,
        _ => return None,
    };
    Some((t as i64, side, &k[9..]))
}

/// Which sides' unmatched records produce a result.
#[derive(Clone, Copy)]
enum Outer {
    Neither,
    This,
    Both,
}

impl<K: Datum + Clone, V: Datum + Clone> KStream<K, V> {
    /// Joins each record with the records of `other` that have its key and are at most the
    /// window's difference apart in time (Kafka Streams' `join(KStream, ValueJoiner,
    /// JoinWindows)`): `joiner(value, other_value)` for each pair, with the larger timestamp.
    /// The stores' serdes come from the streams (or `joined`). See [`crate::dsl::stream_join`].
    pub fn join_windowed<V2, VR>(
        &self,
        other: &KStream<K, V2>,
        joiner: impl Fn(V, V2) -> VR + Send + Sync + 'static,
        windows: JoinWindows,
        joined: StreamJoined<K, V, V2>,
    ) -> KStream<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: Joiner<V, V2, VR> = Arc::new(move |a, b| match (a, b) {
            (Some(a), Some(b)) => joiner(a, b),
            // Never called: an inner join has no unmatched results.
            _ => unreachable!("an inner join's joiner gets both values"),
        });
        self.join_streams(other, "join", joiner, windows, joined, Outer::Neither)
    }

    /// Like [`KStream::join_windowed`], and each record of this stream that found no match once
    /// its window closed produces `joiner(value, None)` (Kafka Streams' `leftJoin`).
    pub fn left_join_windowed<V2, VR>(
        &self,
        other: &KStream<K, V2>,
        joiner: impl Fn(V, Option<V2>) -> VR + Send + Sync + 'static,
        windows: JoinWindows,
        joined: StreamJoined<K, V, V2>,
    ) -> KStream<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let joiner: Joiner<V, V2, VR> = Arc::new(move |a, b| match a {
            Some(a) => joiner(a, b),
            None => unreachable!("a left join's joiner always gets this stream's value"),
        });
        self.join_streams(other, "left-join", joiner, windows, joined, Outer::This)
    }

    /// Like [`KStream::left_join_windowed`], and unmatched records of `other` produce
    /// `joiner(None, other_value)` too (Kafka Streams' `outerJoin`).
    pub fn outer_join_windowed<V2, VR>(
        &self,
        other: &KStream<K, V2>,
        joiner: impl Fn(Option<V>, Option<V2>) -> VR + Send + Sync + 'static,
        windows: JoinWindows,
        joined: StreamJoined<K, V, V2>,
    ) -> KStream<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        self.join_streams(
            other,
            "outer-join",
            Arc::new(joiner),
            windows,
            joined,
            Outer::Both,
        )
    }

    fn join_streams<V2, VR>(
        &self,
        other: &KStream<K, V2>,
        op: &str,
        joiner: Joiner<V, V2, VR>,
        windows: JoinWindows,
        joined: StreamJoined<K, V, V2>,
        outer: Outer,
    ) -> KStream<K, VR>
    where
        V2: Datum + Clone,
        VR: Datum + Clone,
    {
        let key_serde = joined
            .key_serde
            .clone()
            .or_else(|| self.key_serde.clone())
            .or_else(|| other.key_serde.clone());
        let hint = "StreamJoined::with";
        let this = co_partitioned(self, key_serde.clone());
        let that = co_partitioned(other, key_serde.clone());
        let this_serdes = this.serdes_or_error(key_serde.clone(), joined.this_value_serde, hint);
        let that_serdes = that.serdes_or_error(key_serde, joined.other_value_serde, hint);
        let (Some((ks, vs1)), Some((_, vs2))) = (this_serdes, that_serdes) else {
            // The error is recorded; `build` reports it.
            return this.stateless(op, false, |_, _| {});
        };
        let name = {
            let mut g = self.builder.inner.borrow_mut();
            g.name_or_generated(joined.name.as_deref(), op)
        };
        let (this_store, other_store) =
            (format!("{name}-this-store"), format!("{name}-other-store"));
        let outer_store = match outer {
            Outer::Neither => None,
            _ => Some(format!("{name}-outer-store")),
        };
        {
            let mut g = self.builder.inner.borrow_mut();
            let spec = WindowStoreSpec {
                retention_ms: windows.retention(),
                window_size_ms: 1,
                indexed: true,
                timestamped: false,
            };
            g.add_store(&this_store, StoreKind::Window(spec));
            g.add_store(&other_store, StoreKind::Window(spec));
            if let Some(o) = &outer_store {
                g.add_store(o, StoreKind::KeyValue);
            }
        }
        let stores: Vec<String> = [
            Some(this_store.clone()),
            Some(other_store.clone()),
            outer_store.clone(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let j = joiner.clone();
        let this_side = side_node(
            &this,
            format!("{name}-this"),
            op,
            JoinSide {
                side: Side::This,
                this_store: this_store.clone(),
                other_store: other_store.clone(),
                outer_store: outer_store.clone(),
                outer: !matches!(outer, Outer::Neither),
                key_serde: ks.clone(),
                this_serde: vs1.clone(),
                other_serde: vs2.clone(),
                before: windows.before_ms,
                after: windows.after_ms,
                grace: windows.grace_ms,
                pair: Arc::new(move |a, b| j(a, b)),
                scanned: None,
            },
            stores.clone(),
        );
        let other_side = side_node(
            &that,
            format!("{name}-other"),
            op,
            JoinSide {
                side: Side::Other,
                this_store: other_store,
                other_store: this_store,
                outer_store,
                outer: matches!(outer, Outer::Both),
                key_serde: ks.clone(),
                this_serde: vs2,
                other_serde: vs1,
                // The other side looks the other way.
                before: windows.after_ms,
                after: windows.before_ms,
                grace: windows.grace_ms,
                pair: Arc::new(move |b, a| joiner(a, b)),
                scanned: None,
            },
            stores,
        );
        let mut merged = this_side.merge(&other_side);
        merged.key_serde = Some(ks);
        merged
    }
}

/// Adds the processor of one side below `stream`: each sub-task gets a copy of `side`.
fn side_node<K, VT, VO, VR>(
    stream: &KStream<K, VT>,
    name: String,
    op: &str,
    side: JoinSide<K, VT, VO, VR>,
    stores: Vec<String>,
) -> KStream<K, VR>
where
    K: Datum + Clone,
    VT: Datum + Clone,
    VO: Datum + Clone,
    VR: Datum + Clone,
{
    let supplier: Supplier =
        Arc::new(move || Box::new(Typed::<_, K, VT, K, VR>::new(side.clone())));
    stream.add_processor(Some(&name), op, supplier, stores, vec![stream.node], false)
}

/// `stream`, repartitioned first when its key changed (both sides of a join must meet in one
/// key range); without a key serde of its own it takes `key_serde`.
pub(super) fn co_partitioned<K: Datum + Clone, V: Datum + Clone>(
    stream: &KStream<K, V>,
    key_serde: Option<Arc<dyn Serde<K>>>,
) -> KStream<K, V> {
    if stream.key_changed {
        stream.repartition(Repartitioned {
            key_serde: stream.key_serde.clone().or(key_serde),
            ..Repartitioned::default()
        })
    } else {
        stream.clone()
    }
}
