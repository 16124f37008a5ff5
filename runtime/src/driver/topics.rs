//! Typed input and output topics of the TestDriver.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use rill_topology::serdes::Serde;
use rill_topology::{Headers, RawRecord};

use super::{DriverError, Inner};

/// Pipes typed records into one input topic; the counterpart of `TestInputTopic`.
pub struct TestInputTopic<K, V> {
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) topic: String,
    pub(super) key_serde: Box<dyn Serde<K>>,
    pub(super) value_serde: Box<dyn Serde<V>>,
    /// Timestamp given to the next record without one; advances by 1 ms per record.
    pub(super) timestamp: Mutex<i64>,
}

impl<K: 'static, V: 'static> TestInputTopic<K, V> {
    fn raw(&self, key: Option<&K>, value: &V, timestamp: Option<i64>) -> RawRecord {
        let ts = {
            let mut t = self.timestamp.lock();
            let ts = timestamp.unwrap_or(*t);
            *t = ts + 1;
            ts
        };
        RawRecord {
            key: key.map(|k| {
                self.key_serde
                    .serialize(k)
                    .expect("test input key serializes")
            }),
            value: Some(
                self.value_serde
                    .serialize(value)
                    .expect("test input value serializes"),
            ),
            timestamp: ts,
            headers: Headers::new(),
        }
    }

    fn pipe(&self, raw: RawRecord) {
        if let Err(e) = self.inner.lock().pipe(&self.topic, None, raw) {
            panic!("piping into `{}` failed: {e}", self.topic);
        }
    }

    /// Pipes one keyed record and processes it (panics if processing fails; see `try_pipe`).
    pub fn pipe_input(&self, key: K, value: V) {
        self.pipe(self.raw(Some(&key), &value, None));
    }

    /// Pipes one keyed record with a timestamp.
    pub fn pipe_input_at(&self, key: K, value: V, timestamp: i64) {
        self.pipe(self.raw(Some(&key), &value, Some(timestamp)));
    }

    /// Pipes one record without a key.
    pub fn pipe_value(&self, value: V) {
        self.pipe(self.raw(None, &value, None));
    }

    /// Pipes records in order.
    pub fn pipe_key_values(&self, records: impl IntoIterator<Item = (K, V)>) {
        for (k, v) in records {
            self.pipe_input(k, v);
        }
    }

    /// Pipes keyed records with timestamps as one backlog: every record is queued before the
    /// driver waits for any, as a consumer finds them after a downtime, so async stages run
    /// them concurrently and complete them out of order (`pipe_input_at` settles each first).
    pub fn pipe_backlog_at(&self, records: impl IntoIterator<Item = (K, V, i64)>) {
        let raws: Vec<RawRecord> = records
            .into_iter()
            .map(|(k, v, ts)| self.raw(Some(&k), &v, Some(ts)))
            .collect();
        if let Err(e) = self.inner.lock().pipe_backlog(&self.topic, raws) {
            panic!("piping into `{}` failed: {e}", self.topic);
        }
    }

    /// Pipes one keyed record and returns the processing error instead of panicking.
    pub fn try_pipe_input(&self, key: K, value: V) -> Result<(), DriverError> {
        let raw = self.raw(Some(&key), &value, None);
        self.inner.lock().pipe(&self.topic, None, raw)
    }

    /// Pipes one keyed record with a timestamp and returns the processing error instead of
    /// panicking.
    pub fn try_pipe_input_at(&self, key: K, value: V, timestamp: i64) -> Result<(), DriverError> {
        let raw = self.raw(Some(&key), &value, Some(timestamp));
        self.inner.lock().pipe(&self.topic, None, raw)
    }
}

/// Reads typed records from one output topic; the counterpart of `TestOutputTopic`.
pub struct TestOutputTopic<K, V> {
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) topic: String,
    pub(super) key_serde: Box<dyn Serde<K>>,
    pub(super) value_serde: Box<dyn Serde<V>>,
}

impl<K: 'static, V: 'static> TestOutputTopic<K, V> {
    /// Removes and returns the next record as written: bytes, timestamp and headers.
    pub fn read_raw_record(&self) -> Option<RawRecord> {
        self.inner
            .lock()
            .outputs
            .get_mut(&self.topic)
            .and_then(VecDeque::pop_front)
    }

    /// Removes and returns the next record, if any.
    pub fn read_record(&self) -> Option<(Option<K>, V)> {
        let raw = self.read_raw_record()?;
        let key = raw.key.map(|k| {
            self.key_serde
                .deserialize(&k)
                .unwrap_or_else(|e| panic!("output key on `{}`: {e}", self.topic))
        });
        let value = self
            .value_serde
            .deserialize(raw.value.as_deref().unwrap_or_default())
            .unwrap_or_else(|e| panic!("output value on `{}`: {e}", self.topic));
        Some((key, value))
    }

    /// Removes and returns every keyed record as (key, value), in output order.
    pub fn read_key_values(&self) -> Vec<(K, V)> {
        std::iter::from_fn(|| self.read_record())
            .filter_map(|(k, v)| k.map(|k| (k, v)))
            .collect()
    }

    /// Removes and returns every value, in output order.
    pub fn read_values(&self) -> Vec<V> {
        std::iter::from_fn(|| self.read_record())
            .map(|(_, v)| v)
            .collect()
    }

    /// Whether no record is waiting.
    pub fn is_empty(&self) -> bool {
        self.inner
            .lock()
            .outputs
            .get(&self.topic)
            .is_none_or(VecDeque::is_empty)
    }
}
