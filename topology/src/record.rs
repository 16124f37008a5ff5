//! Records as processors see them: key, value, timestamp and headers.

/// A record written to an internal topic with this header (the partition, 4 bytes big-endian)
/// goes to that partition instead of its key's, and loses the header (Kafka Streams' stream
/// partitioner, as the foreign-key join's responses use it to reach their left record's task).
pub const PARTITION_HEADER: &str = "rill.partition";

/// Kafka record headers: an ordered list of (name, value) pairs; names may repeat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, Option<Vec<u8>>)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers(Vec::new())
    }

    /// No headers yet, with room for `n`.
    pub fn with_capacity(n: usize) -> Self {
        Headers(Vec::with_capacity(n))
    }

    /// Appends a header.
    pub fn add(&mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> &mut Self {
        self.0.push((name.into(), Some(value.into())));
        self
    }

    /// Appends a header with a null value.
    pub fn add_null(&mut self, name: impl Into<String>) -> &mut Self {
        self.0.push((name.into(), None));
        self
    }

    /// The value of the last header called `name` (`Some(None)` for a null value).
    pub fn last(&self, name: &str) -> Option<Option<&[u8]>> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_deref())
    }

    /// Removes every header called `name`.
    pub fn remove(&mut self, name: &str) {
        self.0.retain(|(n, _)| n != name);
    }

    /// Iterates over the headers in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_deref()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A typed record flowing through a topology. `key` is `None` for records without a key.
#[derive(Clone, Debug, PartialEq)]
pub struct Record<K, V> {
    /// The key, if the record has one.
    pub key: Option<K>,
    /// The value.
    pub value: V,
    /// Timestamp in milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Headers, carried along by stateless operations.
    pub headers: Headers,
}

impl<K, V> Record<K, V> {
    /// A keyed record with timestamp 0 and no headers.
    pub fn new(key: K, value: V) -> Self {
        Record {
            key: Some(key),
            value,
            timestamp: 0,
            headers: Headers::new(),
        }
    }

    /// Replaces the timestamp.
    pub fn with_timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// Replaces key and value, keeping timestamp and headers.
    pub fn with_key_value<K2, V2>(self, key: Option<K2>, value: V2) -> Record<K2, V2> {
        Record {
            key,
            value,
            timestamp: self.timestamp,
            headers: self.headers,
        }
    }
}

/// A serialized record as it is read from or written to a topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawRecord {
    /// Serialized key; `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// Serialized value; `None` for a null value (a tombstone).
    pub value: Option<Vec<u8>>,
    /// Timestamp in milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Headers.
    pub headers: Headers,
}
