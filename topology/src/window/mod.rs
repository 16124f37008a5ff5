//! Windows: Kafka Streams' window definitions, windowed keys, windowed aggregations, window and
//! session stores, and emit-final (suppression).
//!
//! ```
//! use std::time::Duration;
//! use rill_topology::prelude::*;
//!
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("clicks", StringSerde, StringSerde)
//!     .group_by_key()
//!     .windowed_by(TimeWindows::of_size_and_grace(Duration::from_secs(60), Duration::from_secs(10)))
//!     .count("clicks-per-minute")
//!     .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
//!     .to_stream()
//!     .map(|k: Option<Windowed<String>>, n: i64| {
//!         let k = k.expect("aggregations forward keyed records");
//!         (format!("{}@{}", k.key, k.window.start), n)
//!     })
//!     .to_with("clicks-per-window", Produced::with(StringSerde, I64Serde));
//! builder.build().unwrap();
//! ```
//!
//! # Semantics (as in Kafka Streams)
//!
//! Time is event time ([`crate::time`]); "stream time" below is the record's key range's.
//!
//! - [`TimeWindows`]: fixed-size windows `[start, start + size)` every `advance` (tumbling when
//!   `advance == size`, hopping otherwise), aligned to the epoch. A record updates each window it
//!   falls in whose end is above `stream time - grace`; for each other one it is counted as
//!   late.
//! - [`SlidingWindows`]: windows `[start, start + time_difference]` (both ends included) that
//!   exist where records are: each record has a left window ending at its timestamp, and a right
//!   window starting just after it if a later record falls in it. A window accepts records while
//!   its end is at or above `stream time - grace`; a record whose every possible window has closed
//!   (`timestamp + 1 + time_difference <= stream time - grace`) is dropped.
//! - [`SessionWindows`]: a record opens a session `[t, t]` and merges with every session of its
//!   key that ends at or after `t - gap` and starts at or before `t + gap`; the merged session's
//!   aggregate is the sessions' aggregates combined by the merger, then the record. A record
//!   whose merged session ends before `stream time - grace - gap` is late.
//!
//! Late records are dropped, counted in `rill_late_records_dropped_total` (once per window a
//! record could not update, as Kafka Streams' dropped-records sensor) and logged at debug.
//!
//! # Emitting
//!
//! A windowed aggregation forwards every update by default (`EmitStrategy::on_window_update`).
//! [`EmitStrategy::on_window_close`] forwards each window once, with its final value, when stream
//! time passes its close (the point after which the aggregation accepts no record for it);
//! `KTable::suppress(Suppressed::until_window_closes(..))` does the same downstream of the
//! aggregation through a buffer store. Both keep what they have emitted in state that commits
//! with the range, so after a crash nothing is emitted with another value and nothing is
//! forgotten; outputs being at least once, a window whose emission was not yet covered by a range
//! commit is emitted again after a crash, with the same value.
//!
//! Where rill differs from Kafka Streams:
//! - stream time is per key range (see [`crate::time`]);
//! - emit-final decisions are taken on every record, not throttled by wall-clock time (Kafka
//!   Streams' `emit.interval.ms.kstreams.windowed.aggregation`), which keeps them reproducible;
//! - `suppress` releases a sliding or session window only once the aggregation cannot update it
//!   any more (end below `stream time - grace`, resp. `- grace - gap`); Kafka Streams releases it
//!   at end = that bound, one millisecond before the aggregation's own close, and may then emit it
//!   twice;
//! - expired entries (older than stream time minus retention) are invisible at once, not by
//!   segments, and deleted in steps of a quarter of the retention;
//! - a session merged into a larger one is not retracted on the update stream (Kafka Streams
//!   sends a null value for it); emit-final and `suppress` only ever release surviving sessions.

pub mod aggregate;
pub mod serde;
pub mod session;
pub mod sliding;
pub mod store;
pub mod suppress;
pub mod time;
mod typed;

use std::fmt;

pub use self::serde::{SessionWindowedSerde, TimeWindowedSerde, ValueAndTimestamp};
pub use session::SessionWindows;
pub use sliding::SlidingWindows;
pub use suppress::{BufferConfig, Suppressed};
pub use time::TimeWindows;
pub use typed::{SessionStore, WindowStore};

/// A time interval in milliseconds. Whether `end` is included depends on the window type:
/// excluded for [`TimeWindows`], included for sliding and session windows (as in Kafka Streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// The first millisecond of the window.
    pub start: i64,
    /// The end of the window.
    pub end: i64,
}

impl Window {
    /// The window `[start, end]`.
    pub fn new(start: i64, end: i64) -> Self {
        Window { start, end }
    }
}

/// A key with the window it was aggregated in (Kafka Streams' `Windowed<K>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Windowed<K> {
    /// The record key.
    pub key: K,
    /// The window.
    pub window: Window,
}

impl<K> Windowed<K> {
    /// `key` in `window`.
    pub fn new(key: K, window: Window) -> Self {
        Windowed { key, window }
    }
}

impl<K: fmt::Display> fmt::Display for Windowed<K> {
    /// `[key@start/end]`, as Kafka Streams prints a `Windowed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}@{}/{}]",
            self.key, self.window.start, self.window.end
        )
    }
}

/// When a windowed aggregation forwards results (Kafka Streams' `EmitStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EmitStrategy {
    /// Every update of a window (the default).
    #[default]
    OnWindowUpdate,
    /// One final result per window, once stream time passes its close.
    OnWindowClose,
}

impl EmitStrategy {
    /// Forward every update (Kafka Streams' `EmitStrategy.onWindowUpdate()`).
    pub fn on_window_update() -> Self {
        EmitStrategy::OnWindowUpdate
    }

    /// Forward each window once, when it closes (Kafka Streams' `EmitStrategy.onWindowClose()`).
    pub fn on_window_close() -> Self {
        EmitStrategy::OnWindowClose
    }
}

/// Why a window definition or its store settings are invalid; reported by `build`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// A size, difference or gap must be positive.
    #[error("{what} must be at least 1 ms")]
    NotPositive {
        /// The setting.
        what: &'static str,
    },
    /// A hopping window's advance must lie in (0, size].
    #[error(
        "the advance of TimeWindows ({advance_ms} ms) must lie within (0, size = {size_ms} ms]"
    )]
    Advance {
        /// The advance.
        advance_ms: i64,
        /// The size.
        size_ms: i64,
    },
    /// The store would forget windows the aggregation may still update.
    #[error("the retention of window store `{store}` ({retention_ms} ms) must be at least {minimum_ms} ms ({why})")]
    Retention {
        /// The store.
        store: String,
        /// The retention asked for.
        retention_ms: i64,
        /// The smallest retention that works.
        minimum_ms: i64,
        /// How the minimum comes about.
        why: &'static str,
    },
}

/// Encodes a timestamp so that byte order is numeric order (sign bit flipped, big-endian); the
/// time prefix of every time-ordered store key.
pub(crate) fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The inverse of [`time_bytes`]; `None` unless `b` has 8 bytes.
pub(crate) fn time_from(b: &[u8]) -> Option<i64> {
    let arr: [u8; 8] = b.try_into().ok()?;
    Some((u64::from_be_bytes(arr) ^ (1 << 63)) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bytes_order_like_the_numbers_and_round_trip() {
        let ts = [i64::MIN, -5, -1, 0, 1, 59_999, 60_000, i64::MAX];
        for w in ts.windows(2) {
            assert!(time_bytes(w[0]) < time_bytes(w[1]), "{w:?}");
        }
        for t in ts {
            assert_eq!(time_from(&time_bytes(t)), Some(t));
        }
        assert_eq!(time_from(&[1, 2]), None);
    }

    #[test]
    fn windowed_keys_print_like_kafka_streams() {
        let w = Windowed::new("alice".to_string(), Window::new(0, 60_000));
        assert_eq!(w.to_string(), "[alice@0/60000]");
    }
}
