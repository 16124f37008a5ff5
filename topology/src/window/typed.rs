//! Typed window and session stores for processors (Kafka Streams' `WindowStore` and
//! `SessionStore`) over their byte layouts in [`super::store`].
//!
//! Like [`crate::store::KeyValueStore`], each is a handle that holds the store's name and
//! serdes, not the context: every call takes the context for its own duration, and fetches
//! return owned iterators ([`WindowStoreIterator`], [`KeyValueIterator`]), so a processor can
//! walk one while it forwards and writes.

use super::store::{SessionBytes, SessionEntries, WindowBytes};
use super::{Window, Windowed};
use crate::processor::TaskContext;
use crate::store::{store_handle, KeyValueIterator, StoreError, StoreSerdes, WindowStoreIterator};

/// A typed window store (Kafka Streams' `WindowStore`), from
/// `ctx.get_window_store::<K, V>(name)`: a handle that does not hold the context. On the DSL's
/// timestamped stores, reads drop the stored timestamp and `put` stores the window start as it.
pub struct WindowStore<K, V> {
    serdes: StoreSerdes<K, V>,
}

store_handle!(WindowStore);

/// Decodes a stored window value: drops the timestamp a timestamped store keeps before it.
fn window_value<K: 'static, V: 'static>(
    serdes: &StoreSerdes<K, V>,
    timestamped: bool,
    bytes: &[u8],
) -> Result<V, StoreError> {
    let bytes = if timestamped {
        super::serde::split_timestamped(bytes)
            .map_err(|e| serdes.error(e))?
            .1
    } else {
        bytes
    };
    serdes.value_from(bytes)
}

impl<K: 'static, V: 'static> WindowStore<K, V> {
    /// A handle on the window store named in `serdes`.
    pub(crate) fn with_serdes(serdes: StoreSerdes<K, V>) -> Self {
        WindowStore { serdes }
    }

    fn open<'c>(&self, ctx: &'c mut TaskContext<'_>) -> Result<WindowBytes<'c>, StoreError> {
        WindowBytes::open(ctx.timed_store(&self.serdes.name)?)
    }

    /// Sets `key` in the window starting at `window_start`.
    pub fn put(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        value: &V,
        window_start: i64,
    ) -> Result<(), StoreError> {
        let k = self.serdes.key(key)?;
        let mut v = self.serdes.value(value)?;
        let mut store = self.open(ctx)?;
        if store.spec.timestamped {
            v = super::serde::timestamped(window_start, &v);
        }
        store.put(&k, window_start, &v)
    }

    /// Removes `key` from the window starting at `window_start`.
    pub fn remove(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        window_start: i64,
    ) -> Result<(), StoreError> {
        let k = self.serdes.key(key)?;
        self.open(ctx)?.remove(&k, window_start)
    }

    /// The value of `key` in the window starting at `window_start`.
    pub fn get(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        window_start: i64,
    ) -> Result<Option<V>, StoreError> {
        let k = self.serdes.key(key)?;
        let store = self.open(ctx)?;
        let timestamped = store.spec.timestamped;
        store
            .get(&k, window_start)?
            .map(|v| window_value(&self.serdes, timestamped, &v))
            .transpose()
    }

    /// The windows of `key` starting from `from` to `to` (both included): (start, value), by
    /// start (Kafka Streams' `fetch(key, timeFrom, timeTo)`; `.rev()` for `backwardFetch`).
    pub fn fetch(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        from: i64,
        to: i64,
    ) -> Result<WindowStoreIterator<V>, StoreError> {
        let k = self.serdes.key(key)?;
        let store = self.open(ctx)?;
        let timestamped = store.spec.timestamped;
        let entries = store.fetch(&k, from, to)?;
        let serdes = self.serdes.clone();
        Ok(KeyValueIterator::decoding(entries, move |(start, v)| {
            Ok((start, window_value(&serdes, timestamped, &v)?))
        }))
    }

    /// Every window starting from `from` to `to`, by start then key bytes (`fetchAll`).
    pub fn fetch_all(
        &self,
        ctx: &mut TaskContext<'_>,
        from: i64,
        to: i64,
    ) -> Result<KeyValueIterator<Windowed<K>, V>, StoreError> {
        let store = self.open(ctx)?;
        let spec = store.spec;
        let entries = store.fetch_all(from, to)?;
        let serdes = self.serdes.clone();
        Ok(KeyValueIterator::decoding(entries, move |(k, start, v)| {
            let key = serdes.key_from(&k)?;
            let w = Window::new(start, start.saturating_add(spec.window_size_ms));
            Ok((
                Windowed::new(key, w),
                window_value(&serdes, spec.timestamped, &v)?,
            ))
        }))
    }

    /// Every window of the store (`all`).
    pub fn all(
        &self,
        ctx: &mut TaskContext<'_>,
    ) -> Result<KeyValueIterator<Windowed<K>, V>, StoreError> {
        self.fetch_all(ctx, i64::MIN, i64::MAX)
    }

    /// Deletes expired windows now (writes do it too); returns how many.
    pub fn expire(&self, ctx: &mut TaskContext<'_>) -> Result<usize, StoreError> {
        self.open(ctx)?.expire()
    }
}

/// A typed session store (Kafka Streams' `SessionStore`), from
/// `ctx.get_session_store::<K, V>(name)`: a handle that does not hold the context.
pub struct SessionStore<K, V> {
    serdes: StoreSerdes<K, V>,
}

store_handle!(SessionStore);

impl<K: 'static, V: 'static> SessionStore<K, V> {
    /// A handle on the session store named in `serdes`.
    pub(crate) fn with_serdes(serdes: StoreSerdes<K, V>) -> Self {
        SessionStore { serdes }
    }

    fn open<'c>(&self, ctx: &'c mut TaskContext<'_>) -> Result<SessionBytes<'c>, StoreError> {
        SessionBytes::open(ctx.timed_store(&self.serdes.name)?)
    }

    fn iter(&self, entries: SessionEntries) -> KeyValueIterator<Windowed<K>, V> {
        let serdes = self.serdes.clone();
        KeyValueIterator::decoding(entries, move |(k, w, v)| {
            let key = serdes.key_from(&k)?;
            Ok((Windowed::new(key, w), serdes.value_from(&v)?))
        })
    }

    /// Sets the session `session`.
    pub fn put(
        &self,
        ctx: &mut TaskContext<'_>,
        session: &Windowed<K>,
        value: &V,
    ) -> Result<(), StoreError> {
        let k = self.serdes.key(&session.key)?;
        let v = self.serdes.value(value)?;
        self.open(ctx)?.put(&k, session.window, &v)
    }

    /// Removes the session `session`.
    pub fn remove(
        &self,
        ctx: &mut TaskContext<'_>,
        session: &Windowed<K>,
    ) -> Result<(), StoreError> {
        let k = self.serdes.key(&session.key)?;
        self.open(ctx)?.remove(&k, session.window)
    }

    /// The sessions of `key` ending at or after `earliest_end` and starting at or before
    /// `latest_start`, by end (Kafka Streams' `findSessions`; `.rev()` for
    /// `backwardFindSessions`).
    pub fn find_sessions(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<KeyValueIterator<Windowed<K>, V>, StoreError> {
        let k = self.serdes.key(key)?;
        let entries = self
            .open(ctx)?
            .find_sessions(&k, earliest_end, latest_start)?;
        Ok(self.iter(entries))
    }

    /// Every session of `key` (`fetch(key)`).
    pub fn fetch(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
    ) -> Result<KeyValueIterator<Windowed<K>, V>, StoreError> {
        self.find_sessions(ctx, key, i64::MIN, i64::MAX)
    }

    /// The value of `key`'s session `[start, end]` (`fetchSession`).
    pub fn fetch_session(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        start: i64,
        end: i64,
    ) -> Result<Option<V>, StoreError> {
        let k = self.serdes.key(key)?;
        self.open(ctx)?
            .fetch_session(&k, Window::new(start, end))?
            .map(|v| self.serdes.value_from(&v))
            .transpose()
    }

    /// Every session ending from `from` to `to`, by end (`findSessions(earliestEnd, latestEnd)`).
    pub fn fetch_all(
        &self,
        ctx: &mut TaskContext<'_>,
        from: i64,
        to: i64,
    ) -> Result<KeyValueIterator<Windowed<K>, V>, StoreError> {
        let entries = self.open(ctx)?.fetch_all(from, to)?;
        Ok(self.iter(entries))
    }

    /// Deletes expired sessions now (writes do it too); returns how many.
    pub fn expire(&self, ctx: &mut TaskContext<'_>) -> Result<usize, StoreError> {
        self.open(ctx)?.expire()
    }
}
