//! Typed views of the window and session stores (Kafka Streams' `WindowStore` and
//! `SessionStore`) over their byte layouts in [`super::store`].

use super::store::{SessionBytes, SessionEntries, WindowBytes};
use super::{Window, Windowed};
use crate::store::{StoreError, StoreSerdes, TimedStore};

/// A typed view of a window store (Kafka Streams' `WindowStore`), from
/// `TaskContext::get_window_store`. On the DSL's timestamped stores, reads drop the stored
/// timestamp and `put` stores the window start as it.
pub struct WindowStore<'a, K, V> {
    inner: WindowBytes<'a>,
    serdes: StoreSerdes<K, V>,
}

impl<'a, K: 'static, V: 'static> WindowStore<'a, K, V> {
    /// A typed view of the window store opened as `store`, through its declared serdes.
    pub(crate) fn with_serdes(
        store: TimedStore<'a>,
        serdes: StoreSerdes<K, V>,
    ) -> Result<Self, StoreError> {
        Ok(WindowStore {
            inner: WindowBytes::open(store)?,
            serdes,
        })
    }

    fn value(&self, bytes: &[u8]) -> Result<V, StoreError> {
        let bytes = if self.inner.spec.timestamped {
            super::serde::split_timestamped(bytes)
                .map_err(|e| self.serdes.error(e))?
                .1
        } else {
            bytes
        };
        self.serdes.value_from(bytes)
    }

    /// Sets `key` in the window starting at `window_start`.
    pub fn put(&mut self, key: &K, value: &V, window_start: i64) -> Result<(), StoreError> {
        let k = self.serdes.key(key)?;
        let mut v = self.serdes.value(value)?;
        if self.inner.spec.timestamped {
            v = super::serde::timestamped(window_start, &v);
        }
        self.inner.put(&k, window_start, &v)
    }

    /// Removes `key` from the window starting at `window_start`.
    pub fn remove(&mut self, key: &K, window_start: i64) -> Result<(), StoreError> {
        let k = self.serdes.key(key)?;
        self.inner.remove(&k, window_start)
    }

    /// The value of `key` in the window starting at `window_start`.
    pub fn get(&self, key: &K, window_start: i64) -> Result<Option<V>, StoreError> {
        let k = self.serdes.key(key)?;
        self.inner
            .get(&k, window_start)?
            .map(|v| self.value(&v))
            .transpose()
    }

    /// The windows of `key` starting from `from` to `to` (both included): (start, value), by
    /// start (Kafka Streams' `fetch(key, timeFrom, timeTo)`).
    pub fn fetch(&self, key: &K, from: i64, to: i64) -> Result<Vec<(i64, V)>, StoreError> {
        let k = self.serdes.key(key)?;
        self.inner
            .fetch(&k, from, to)?
            .into_iter()
            .map(|(start, v)| Ok((start, self.value(&v)?)))
            .collect()
    }

    /// Every window starting from `from` to `to`, by start then key bytes (`fetchAll`).
    pub fn fetch_all(&self, from: i64, to: i64) -> Result<Vec<(Windowed<K>, V)>, StoreError> {
        let size = self.inner.spec.window_size_ms;
        self.inner
            .fetch_all(from, to)?
            .into_iter()
            .map(|(k, start, v)| {
                let key = self.serdes.key_from(&k)?;
                let w = Window::new(start, start.saturating_add(size));
                Ok((Windowed::new(key, w), self.value(&v)?))
            })
            .collect()
    }

    /// Every window of the store (`all`).
    pub fn all(&self) -> Result<Vec<(Windowed<K>, V)>, StoreError> {
        self.fetch_all(i64::MIN, i64::MAX)
    }

    /// Deletes expired windows now (writes do it too); returns how many.
    pub fn expire(&mut self) -> Result<usize, StoreError> {
        self.inner.expire()
    }
}

/// A typed view of a session store (Kafka Streams' `SessionStore`), from
/// `TaskContext::get_session_store`.
pub struct SessionStore<'a, K, V> {
    inner: SessionBytes<'a>,
    serdes: StoreSerdes<K, V>,
}

impl<'a, K: 'static, V: 'static> SessionStore<'a, K, V> {
    /// A typed view of the session store opened as `store`, through its declared serdes.
    pub(crate) fn with_serdes(
        store: TimedStore<'a>,
        serdes: StoreSerdes<K, V>,
    ) -> Result<Self, StoreError> {
        Ok(SessionStore {
            inner: SessionBytes::open(store)?,
            serdes,
        })
    }

    fn decode(&self, entries: SessionEntries) -> Result<Vec<(Windowed<K>, V)>, StoreError> {
        entries
            .into_iter()
            .map(|(k, w, v)| {
                let key = self.serdes.key_from(&k)?;
                Ok((Windowed::new(key, w), self.serdes.value_from(&v)?))
            })
            .collect()
    }

    /// Sets the session `session`.
    pub fn put(&mut self, session: &Windowed<K>, value: &V) -> Result<(), StoreError> {
        let k = self.serdes.key(&session.key)?;
        let v = self.serdes.value(value)?;
        self.inner.put(&k, session.window, &v)
    }

    /// Removes the session `session`.
    pub fn remove(&mut self, session: &Windowed<K>) -> Result<(), StoreError> {
        let k = self.serdes.key(&session.key)?;
        self.inner.remove(&k, session.window)
    }

    /// The sessions of `key` ending at or after `earliest_end` and starting at or before
    /// `latest_start` (Kafka Streams' `findSessions`).
    pub fn find_sessions(
        &self,
        key: &K,
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<Vec<(Windowed<K>, V)>, StoreError> {
        let k = self.serdes.key(key)?;
        self.decode(self.inner.find_sessions(&k, earliest_end, latest_start)?)
    }

    /// Every session of `key` (`fetch(key)`).
    pub fn fetch(&self, key: &K) -> Result<Vec<(Windowed<K>, V)>, StoreError> {
        self.find_sessions(key, i64::MIN, i64::MAX)
    }

    /// The value of `key`'s session `[start, end]` (`fetchSession`).
    pub fn fetch_session(&self, key: &K, start: i64, end: i64) -> Result<Option<V>, StoreError> {
        let k = self.serdes.key(key)?;
        self.inner
            .fetch_session(&k, Window::new(start, end))?
            .map(|v| self.serdes.value_from(&v))
            .transpose()
    }

    /// Every session ending from `from` to `to`, by end (`findSessions(earliestEnd, latestEnd)`).
    pub fn fetch_all(&self, from: i64, to: i64) -> Result<Vec<(Windowed<K>, V)>, StoreError> {
        self.decode(self.inner.fetch_all(from, to)?)
    }

    /// Deletes expired sessions now (writes do it too); returns how many.
    pub fn expire(&mut self) -> Result<usize, StoreError> {
        self.inner.expire()
    }
}
