//! Serdes of windowed keys, in Kafka Streams' layouts, and of timestamped aggregates.
//!
//! - [`TimeWindowedSerde`] (Kafka Streams' `TimeWindowedSerde`): the key's bytes, then the window
//!   start as an 8-byte big-endian long. The end is not written; the deserializer adds the window
//!   size to the start.
//! - [`SessionWindowedSerde`] (`SessionWindowedSerde`): the key's bytes, then the session end and
//!   the session start, each an 8-byte big-endian long.
//! - [`ValueAndTimestamp`]: an aggregate with the largest record timestamp of its window, as the
//!   DSL's window stores keep it: the 8-byte big-endian timestamp, then the value's bytes.

use std::sync::Arc;

use super::{Window, Windowed};
use crate::serdes::{Serde, SerdeError};

/// Splits `n` trailing bytes off `bytes`.
fn split_tail<'a>(
    bytes: &'a [u8],
    n: usize,
    serde: &'static str,
) -> Result<(&'a [u8], &'a [u8]), SerdeError> {
    if bytes.len() < n {
        return Err(SerdeError::new(
            serde,
            format!("expected at least {n} bytes, got {}", bytes.len()),
        ));
    }
    Ok(bytes.split_at(bytes.len() - n))
}

/// Reads an 8-byte big-endian long.
fn long(bytes: &[u8]) -> i64 {
    let mut arr = [0u8; 8];
    arr.copy_from_slice(&bytes[..8]);
    i64::from_be_bytes(arr)
}

/// Keys of time windows: key bytes + 8-byte big-endian start (Kafka Streams' layout).
pub struct TimeWindowedSerde<K> {
    inner: Arc<dyn Serde<K>>,
    window_size_ms: i64,
}

impl<K> TimeWindowedSerde<K> {
    /// Windowed keys whose key uses `inner`; `window_size_ms` gives the window end on reads.
    pub fn new(inner: impl Serde<K>, window_size_ms: i64) -> Self {
        Self::from_arc(Arc::new(inner), window_size_ms)
    }

    /// Like [`TimeWindowedSerde::new`] with a shared key serde.
    pub fn from_arc(inner: Arc<dyn Serde<K>>, window_size_ms: i64) -> Self {
        TimeWindowedSerde {
            inner,
            window_size_ms,
        }
    }
}

impl<K: 'static> Serde<Windowed<K>> for TimeWindowedSerde<K> {
    fn serialize(&self, value: &Windowed<K>) -> Result<Vec<u8>, SerdeError> {
        let mut out = self.inner.serialize(&value.key)?;
        out.extend_from_slice(&value.window.start.to_be_bytes());
        Ok(out)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Windowed<K>, SerdeError> {
        let (key, start) = split_tail(bytes, 8, "TimeWindowedSerde")?;
        let start = long(start);
        Ok(Windowed::new(
            self.inner.deserialize(key)?,
            Window::new(start, start.saturating_add(self.window_size_ms)),
        ))
    }
}

/// Keys of session windows: key bytes + 8-byte big-endian end + 8-byte big-endian start (Kafka
/// Streams' layout).
pub struct SessionWindowedSerde<K> {
    inner: Arc<dyn Serde<K>>,
}

impl<K> SessionWindowedSerde<K> {
    /// Session-windowed keys whose key uses `inner`.
    pub fn new(inner: impl Serde<K>) -> Self {
        Self::from_arc(Arc::new(inner))
    }

    /// Like [`SessionWindowedSerde::new`] with a shared key serde.
    pub fn from_arc(inner: Arc<dyn Serde<K>>) -> Self {
        SessionWindowedSerde { inner }
    }
}

impl<K: 'static> Serde<Windowed<K>> for SessionWindowedSerde<K> {
    fn serialize(&self, value: &Windowed<K>) -> Result<Vec<u8>, SerdeError> {
        let mut out = self.inner.serialize(&value.key)?;
        out.extend_from_slice(&value.window.end.to_be_bytes());
        out.extend_from_slice(&value.window.start.to_be_bytes());
        Ok(out)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Windowed<K>, SerdeError> {
        let (key, times) = split_tail(bytes, 16, "SessionWindowedSerde")?;
        Ok(Windowed::new(
            self.inner.deserialize(key)?,
            Window::new(long(&times[8..]), long(times)),
        ))
    }
}

/// An aggregate and the largest timestamp of the records in it (Kafka Streams'
/// `ValueAndTimestamp`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueAndTimestamp<V> {
    /// The value.
    pub value: V,
    /// The largest record timestamp that went into it.
    pub timestamp: i64,
}

/// Splits timestamped bytes into the timestamp and the value's bytes.
pub(crate) fn split_timestamped(bytes: &[u8]) -> Result<(i64, &[u8]), SerdeError> {
    if bytes.len() < 8 {
        return Err(SerdeError::new(
            "ValueAndTimestamp",
            format!("expected at least 8 bytes, got {}", bytes.len()),
        ));
    }
    Ok((long(bytes), &bytes[8..]))
}

/// Prefixes value bytes with their timestamp.
pub(crate) fn timestamped(timestamp: i64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + value.len());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(value);
    out
}

/// [`ValueAndTimestamp`] over a value serde.
pub struct ValueAndTimestampSerde<V> {
    inner: Arc<dyn Serde<V>>,
}

impl<V> ValueAndTimestampSerde<V> {
    /// Timestamped values whose value uses `inner`.
    pub fn new(inner: Arc<dyn Serde<V>>) -> Self {
        ValueAndTimestampSerde { inner }
    }
}

impl<V: 'static> Serde<ValueAndTimestamp<V>> for ValueAndTimestampSerde<V> {
    fn serialize(&self, v: &ValueAndTimestamp<V>) -> Result<Vec<u8>, SerdeError> {
        Ok(timestamped(v.timestamp, &self.inner.serialize(&v.value)?))
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<ValueAndTimestamp<V>, SerdeError> {
        let (timestamp, value) = split_timestamped(bytes)?;
        Ok(ValueAndTimestamp {
            value: self.inner.deserialize(value)?,
            timestamp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serdes::{I64Serde, StringSerde};

    #[test]
    fn time_windowed_keys_are_key_bytes_then_the_big_endian_start() {
        let s = TimeWindowedSerde::new(StringSerde, 60_000);
        let k = Windowed::new("ab".to_string(), Window::new(120_000, 180_000));
        let bytes = s.serialize(&k).unwrap();
        let mut expected = b"ab".to_vec();
        expected.extend_from_slice(&120_000i64.to_be_bytes());
        assert_eq!(bytes, expected);
        assert_eq!(s.deserialize(&bytes).unwrap(), k);
        assert!(s.deserialize(&[1, 2]).is_err());
    }

    #[test]
    fn session_windowed_keys_are_key_bytes_then_end_then_start() {
        let s = SessionWindowedSerde::new(StringSerde);
        let k = Windowed::new("u".to_string(), Window::new(5, 9));
        let bytes = s.serialize(&k).unwrap();
        let mut expected = b"u".to_vec();
        expected.extend_from_slice(&9i64.to_be_bytes());
        expected.extend_from_slice(&5i64.to_be_bytes());
        assert_eq!(bytes, expected);
        assert_eq!(s.deserialize(&bytes).unwrap(), k);
    }

    #[test]
    fn timestamped_values_round_trip() {
        let s = ValueAndTimestampSerde::new(Arc::new(I64Serde));
        let v = ValueAndTimestamp {
            value: 3,
            timestamp: 77,
        };
        assert_eq!(s.deserialize(&s.serialize(&v).unwrap()).unwrap(), v);
        assert!(s.deserialize(&[0; 4]).is_err());
    }
}
