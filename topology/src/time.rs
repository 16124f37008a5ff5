//! Event time: which timestamp a record carries through a topology, what happens to invalid
//! ones, and the stream time that windows close by.
//!
//! # Timestamps
//!
//! A source reads each record's event time with its timestamp extractor
//! ([`crate::Consumed::with_timestamp_extractor`], a closure over key, value and the Kafka record
//! timestamp; by default the record timestamp itself, as Kafka Streams'
//! `FailOnInvalidTimestamp`). The result becomes the record's timestamp for every node
//! downstream, and outputs carry it (or the window's, for windowed aggregations).
//!
//! A negative timestamp is invalid. The source's [`OnInvalidTimestamp`] handler decides, as
//! Kafka Streams' extractors of the same names do:
//! - [`FailOnInvalidTimestamp`] (default): processing stops with an error naming the record;
//! - [`LogAndSkipOnInvalidTimestamp`]: the record is dropped, logged at warn and counted in
//!   `rill_discarded_records_total{reason="invalid_timestamp"}`;
//! - [`UsePartitionTimeOnInvalidTimestamp`]: the record takes the current stream time of its key
//!   range (an error while that is unknown, before the range's first valid record);
//! - [`UseWallclockTimeOnInvalidTimestamp`]: the record takes the system time (not
//!   reproducible: a replay gives it another time).
//!
//! [`WallclockTimestampExtractor::extract`] as the extractor gives every record the system time
//! (processing-time semantics; not reproducible either).
//!
//! # Stream time: the partition's, as each key range reaches it
//!
//! Windows use stream time as Kafka Streams does: a record is *late* when every window it falls
//! in has closed (window end + grace at or below stream time), and is then dropped and counted in
//! `rill_late_records_dropped_total`; emit-final results are released when stream time passes a
//! window's end + grace.
//!
//! Kafka Streams keeps stream time per task (per partition): every record of the partition
//! advances it. rill runs the ranges of one partition concurrently, each over its own keys'
//! records. The engine, which hands a partition's records to the ranges in offset order, notes
//! the partition's stream time at each record's offset (the largest timestamp up to it, every
//! range's records included; for a sub-topology with several inputs, such as a join, the task's
//! over all of them, as Kafka Streams keeps it) and hands it over with the record; the range's stream time moves to
//! it before the record runs, and is committed with the range's state and progress. So:
//!
//! - **Same decisions as P = 1.** A record is late, and a window closes, at the same offset as
//!   with one range (Kafka Streams' semantics), whatever the factor.
//! - **Determinism.** The time a record carries depends on the offsets before it only, not on
//!   how the ranges' work interleaved, so a replay after a crash decides the same.
//! - **After a restart** an engine knows the partition's time from the offset it began reading
//!   at (the lowest any range resumes from); each range also resumes with its committed time. A
//!   range behind the others may therefore, until the partition passes where the range furthest
//!   on resumed, accept a record that P = 1 drops; it never drops one P = 1 accepts.
//! - **Quiet ranges.** A range none of whose keys arrived lately is handed the partition's time
//!   without a record (a *tick*, before every commit: every `commit.interval.ms`, 100 ms by
//!   default; after every record in the TestDriver), its record cache flushed first. Emit-final windows and sessions, suppression, stream-stream joins'
//!   unmatched records and stream-time punctuations then release what closed
//!   (`Processor::on_stream_time`), as one range would have at the partition's records. Where
//!   rill differs: that release comes with the next tick, up to `commit.interval.ms` after the
//!   partition's record, and a sub-topology with an async stage takes no ticks (its open
//!   records hold the settled time back; its windows close with its own records).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// What to do with a record whose extracted timestamp is negative (invalid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnInvalidTimestamp {
    /// Stop processing with an error (Kafka Streams' `FailOnInvalidTimestamp`, the default).
    #[default]
    Fail,
    /// Drop the record, log it and count it (`LogAndSkipOnInvalidTimestamp`).
    LogAndSkip,
    /// Use the key range's stream time (`UsePartitionTimeOnInvalidTimestamp`).
    UsePartitionTime,
    /// Use the system time (not reproducible under replays).
    UseWallclockTime,
}

/// Kafka Streams' `FailOnInvalidTimestamp`: an invalid timestamp stops processing.
#[derive(Clone, Copy, Debug, Default)]
pub struct FailOnInvalidTimestamp;

/// Kafka Streams' `LogAndSkipOnInvalidTimestamp`: a record with an invalid timestamp is dropped,
/// logged and counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogAndSkipOnInvalidTimestamp;

/// Kafka Streams' `UsePartitionTimeOnInvalidTimestamp`: a record with an invalid timestamp takes
/// its key range's stream time.
#[derive(Clone, Copy, Debug, Default)]
pub struct UsePartitionTimeOnInvalidTimestamp;

/// A record with an invalid timestamp takes the system time.
#[derive(Clone, Copy, Debug, Default)]
pub struct UseWallclockTimeOnInvalidTimestamp;

impl From<FailOnInvalidTimestamp> for OnInvalidTimestamp {
    fn from(_: FailOnInvalidTimestamp) -> Self {
        OnInvalidTimestamp::Fail
    }
}

impl From<LogAndSkipOnInvalidTimestamp> for OnInvalidTimestamp {
    fn from(_: LogAndSkipOnInvalidTimestamp) -> Self {
        OnInvalidTimestamp::LogAndSkip
    }
}

impl From<UsePartitionTimeOnInvalidTimestamp> for OnInvalidTimestamp {
    fn from(_: UsePartitionTimeOnInvalidTimestamp) -> Self {
        OnInvalidTimestamp::UsePartitionTime
    }
}

impl From<UseWallclockTimeOnInvalidTimestamp> for OnInvalidTimestamp {
    fn from(_: UseWallclockTimeOnInvalidTimestamp) -> Self {
        OnInvalidTimestamp::UseWallclockTime
    }
}

/// Kafka Streams' `WallclockTimestampExtractor`: pass [`WallclockTimestampExtractor::extract`]
/// to [`crate::Consumed::with_timestamp_extractor`] for processing-time semantics.
#[derive(Clone, Copy, Debug, Default)]
pub struct WallclockTimestampExtractor;

impl WallclockTimestampExtractor {
    /// The system time in milliseconds since the Unix epoch, whatever the record.
    pub fn extract<K, V>(_key: Option<&K>, _value: &V, _record_timestamp: i64) -> i64 {
        now_ms()
    }
}

/// The system time in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Why a record's timestamp could not be settled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    /// The timestamp is negative and the handler is [`OnInvalidTimestamp::Fail`].
    #[error("invalid (negative) timestamp {0}; set Consumed::with_invalid_timestamp_handler(LogAndSkipOnInvalidTimestamp or UsePartitionTimeOnInvalidTimestamp) to go on")]
    Invalid(i64),
    /// The handler is [`OnInvalidTimestamp::UsePartitionTime`], but the range has no stream time
    /// yet.
    #[error("invalid (negative) timestamp {0}, and the key range's stream time is not known yet (no valid record seen), so UsePartitionTimeOnInvalidTimestamp cannot replace it")]
    NoPartitionTime(i64),
}

impl OnInvalidTimestamp {
    /// The timestamp a record with extracted timestamp `ts` takes: `Ok(Some(t))`, or `Ok(None)`
    /// when it is to be skipped; `stream_time` is the range's before this record.
    pub fn resolve(self, ts: i64, stream_time: Option<i64>) -> Result<Option<i64>, TimestampError> {
        if ts >= 0 {
            return Ok(Some(ts));
        }
        match self {
            OnInvalidTimestamp::Fail => Err(TimestampError::Invalid(ts)),
            OnInvalidTimestamp::LogAndSkip => Ok(None),
            OnInvalidTimestamp::UsePartitionTime => stream_time
                .map(Some)
                .ok_or(TimestampError::NoPartitionTime(ts)),
            OnInvalidTimestamp::UseWallclockTime => Ok(Some(now_ms())),
        }
    }
}

impl fmt::Display for OnInvalidTimestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnInvalidTimestamp::Fail => "FailOnInvalidTimestamp",
            OnInvalidTimestamp::LogAndSkip => "LogAndSkipOnInvalidTimestamp",
            OnInvalidTimestamp::UsePartitionTime => "UsePartitionTimeOnInvalidTimestamp",
            OnInvalidTimestamp::UseWallclockTime => "UseWallclockTimeOnInvalidTimestamp",
        })
    }
}

/// Milliseconds of a duration as an `i64` (saturating), the unit of every rill clock.
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_timestamps_pass_every_handler() {
        for h in [
            OnInvalidTimestamp::Fail,
            OnInvalidTimestamp::LogAndSkip,
            OnInvalidTimestamp::UsePartitionTime,
            OnInvalidTimestamp::UseWallclockTime,
        ] {
            assert_eq!(h.resolve(0, None), Ok(Some(0)));
            assert_eq!(h.resolve(42, Some(7)), Ok(Some(42)));
        }
    }

    #[test]
    fn each_handler_treats_a_negative_timestamp_as_its_kafka_streams_namesake() {
        assert_eq!(
            OnInvalidTimestamp::from(FailOnInvalidTimestamp).resolve(-1, Some(5)),
            Err(TimestampError::Invalid(-1))
        );
        assert_eq!(
            OnInvalidTimestamp::from(LogAndSkipOnInvalidTimestamp).resolve(-1, Some(5)),
            Ok(None)
        );
        let partition_time = OnInvalidTimestamp::from(UsePartitionTimeOnInvalidTimestamp);
        assert_eq!(partition_time.resolve(-1, Some(5)), Ok(Some(5)));
        assert_eq!(
            partition_time.resolve(-3, None),
            Err(TimestampError::NoPartitionTime(-3))
        );
        let wall = OnInvalidTimestamp::from(UseWallclockTimeOnInvalidTimestamp)
            .resolve(-1, None)
            .unwrap()
            .unwrap();
        assert!(wall > 1_600_000_000_000, "{wall}");
    }

    #[test]
    fn the_wallclock_extractor_ignores_the_record() {
        let t = WallclockTimestampExtractor::extract(Some(&1u8), &2u8, -5);
        assert!(t > 1_600_000_000_000, "{t}");
    }
}
