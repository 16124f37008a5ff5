//! Window and session stores over a key-value column family, with time-ordered composite keys.
//!
//! # Layout
//!
//! Every entry lives in the store's [`KeyValueBytes`] (so in the range's column family, written by
//! the range commit and changelogged like any key-value entry). `T(t)` is a timestamp as 8 bytes
//! in numeric byte order (`window::time_bytes`), `len` a 4-byte big-endian length.
//!
//! ```text
//! window store   'w' T(start) key                  -> value     time-ordered: what expires is a prefix
//!                'x' len key T(start)              -> ()        key-first index (indexed stores only)
//! session store  's' T(end) key T(start)           -> value     ordered by session end
//!                't' len key T(end) T(start)       -> ()        key-first index
//!                'u' T(start) key                  -> ()        not released yet (emit-final)
//!                'v' T(end) key T(start)           -> ()        not released yet (emit-final)
//! both           'm' name                          -> bytes     metadata
//! ```
//!
//! Emit-final notes each window (session) it has not released in an entry of the window's key:
//! like any entry it follows its key's range across a factor change, and no two ranges write it,
//! so compaction keeps it. (A released bound per range, the layout before, went to one child of a
//! split and was shared by every range of a partition in the changelog: windows were emitted twice
//! or never. A store written so is converted at its first release: see `take_unreleased`.)
//!
//! Time first means expiry deletes one contiguous key range (`'w' T(MIN)` to `'w' T(bound)`) and
//! emit-final finds closed windows with one range scan; the index answers fetches by key without
//! scanning other keys. A store without an index (the DSL's `TimeWindows`, whose aggregation only
//! reads single windows) answers fetches by key with a scan of the time range.
//!
//! # Retention and expiry
//!
//! With stream time `S` and retention `R`, an entry whose time (window start, session end) is
//! below `S - R` is expired: every read hides it at once, so what a processor sees depends only on
//! stream time, which the range commits with its state. Expiry deletes expired entries
//! physically, in steps of a quarter of the retention, from where it last stopped (a position the
//! sub-task keeps in memory; after a restart it starts again from the beginning once). Deletions
//! are changelogged, so a restored store is bounded the same way.

use std::ops::Bound;

use super::{time_bytes, time_from, Window};
use crate::store::{
    KeyValueBytes, SessionStoreSpec, StoreError, StoreKind, TimedStore, WindowStoreSpec,
};

const WINDOW: u8 = b'w';
const WINDOW_INDEX: u8 = b'x';
const SESSION: u8 = b's';
const SESSION_INDEX: u8 = b't';
const META: u8 = b'm';
const WINDOW_UNRELEASED: u8 = b'u';
const SESSION_UNRELEASED: u8 = b'v';

/// Metadata entry of the layout before unreleased notes: the largest window time (start, or
/// session end) emit-final had released in the range.
const RELEASED_BOUND: &str = "released";

/// A window or session taken for release: (key bytes, window, value, routing hash of its key).
pub(crate) type Unreleased = (Vec<u8>, Window, Vec<u8>, Option<u64>);

/// Expiry deletes in steps of the retention divided by this.
const EXPIRY_STEPS_PER_RETENTION: i64 = 4;

fn corrupt(store: &dyn KeyValueBytes, what: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        store: store.name().to_string(),
        what: what.into(),
    }
}

fn wrong_kind(name: &str, expected: &'static str, actual: StoreKind) -> StoreError {
    StoreError::WrongKind {
        store: name.to_string(),
        expected,
        actual: actual.name(),
    }
}

fn tagged(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + parts.iter().map(|p| p.len()).sum::<usize>());
    k.push(tag);
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

fn len_prefix(key: &[u8]) -> [u8; 4] {
    // Keys above 4 GiB cannot reach a store (Kafka's limits are far below).
    (key.len() as u32).to_be_bytes()
}

/// The smallest visible time for `stream_time` and `retention_ms`.
fn visible_from(stream_time: Option<i64>, retention_ms: i64) -> i64 {
    stream_time.map_or(i64::MIN, |s| s.saturating_sub(retention_ms))
}

/// Reads metadata entry `name` of a window or session store.
fn meta_get(bytes: &dyn KeyValueBytes, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
    bytes.get(&tagged(META, &[name.as_bytes()]))
}

/// A note taken: the key after its tag, with the routing hash of the entry it notes.
type TakenNote = (Vec<u8>, Option<u64>);

/// Takes the notes of `tag` (`'u'` or `'v'`) whose time is at most `upper`, in (time, key)
/// order: deletes each and returns its key after the tag, with the routing hash of the entry
/// `primary` gives for it (the key the window is about).
fn take_notes(
    bytes: &mut dyn KeyValueBytes,
    tag: u8,
    upper: i64,
    primary: impl Fn(&[u8]) -> Vec<u8>,
) -> Result<Vec<TakenNote>, StoreError> {
    let hi = match upper.checked_add(1) {
        Some(t) => tagged(tag, &[&time_bytes(t)]),
        None => vec![tag + 1],
    };
    let notes = bytes.range(Bound::Included(&[tag][..]), Bound::Excluded(&hi))?;
    let mut out = Vec::with_capacity(notes.len());
    for (k, _) in notes {
        let hash = bytes.routing_hash_of(&primary(&k[1..]))?;
        bytes.delete(&k)?;
        out.push((k[1..].to_vec(), hash));
    }
    Ok(out)
}

/// Physically deletes the entries of `tag` with a time below the step-aligned `bound`, from
/// `*cursor` on; `delete` removes one primary entry (and its index entry).
fn expire_prefix(
    bytes: &mut dyn KeyValueBytes,
    tag: u8,
    bound: i64,
    retention_ms: i64,
    cursor: &mut i64,
    mut index_key: impl FnMut(&[u8]) -> Option<Vec<u8>>,
) -> Result<usize, StoreError> {
    if bound == i64::MIN {
        return Ok(0);
    }
    let step = (retention_ms / EXPIRY_STEPS_PER_RETENTION).max(1);
    let aligned = bound - bound.rem_euclid(step);
    if aligned <= *cursor {
        return Ok(0);
    }
    let from = tagged(tag, &[&time_bytes(*cursor)]);
    let to = tagged(tag, &[&time_bytes(aligned)]);
    let expired = bytes.range(Bound::Included(&from), Bound::Excluded(&to))?;
    for (k, _) in &expired {
        bytes.delete(k)?;
        if let Some(i) = index_key(k) {
            bytes.delete(&i)?;
        }
    }
    *cursor = aligned;
    Ok(expired.len())
}

/// Byte-level access to a window store: keys and values are serialized bytes.
pub struct WindowBytes<'a> {
    bytes: &'a mut dyn KeyValueBytes,
    pub(super) spec: WindowStoreSpec,
    stream_time: Option<i64>,
    expired_below: &'a mut i64,
}

impl<'a> WindowBytes<'a> {
    /// Opens `store` as a window store (an error if it is another kind).
    pub fn open(store: TimedStore<'a>) -> Result<Self, StoreError> {
        match store.kind {
            StoreKind::Window(spec) => Ok(WindowBytes {
                bytes: store.bytes,
                spec,
                stream_time: store.stream_time,
                expired_below: store.expired_below,
            }),
            other => Err(wrong_kind(store.bytes.name(), "window", other)),
        }
    }

    /// The store's layout.
    pub fn spec(&self) -> WindowStoreSpec {
        self.spec
    }

    fn visible_from(&self) -> i64 {
        visible_from(self.stream_time, self.spec.retention_ms)
    }

    fn primary(key: &[u8], start: i64) -> Vec<u8> {
        tagged(WINDOW, &[&time_bytes(start), key])
    }

    fn index(key: &[u8], start: i64) -> Vec<u8> {
        tagged(WINDOW_INDEX, &[&len_prefix(key), key, &time_bytes(start)])
    }

    /// Splits a primary key into (start, key).
    fn parse(&self, k: &[u8]) -> Result<(i64, Vec<u8>), StoreError> {
        match (k.first(), k.get(1..9).and_then(time_from)) {
            (Some(&WINDOW), Some(start)) => Ok((start, k[9..].to_vec())),
            _ => Err(corrupt(&*self.bytes, "window key without its time prefix")),
        }
    }

    /// The value of `key` in the window starting at `start`, unless expired.
    pub fn get(&self, key: &[u8], start: i64) -> Result<Option<Vec<u8>>, StoreError> {
        if start < self.visible_from() {
            return Ok(None);
        }
        self.bytes.get(&Self::primary(key, start))
    }

    /// Sets `key` in the window starting at `start`; a window already expired is not written
    /// (as Kafka Streams drops writes to expired segments).
    pub fn put(&mut self, key: &[u8], start: i64, value: &[u8]) -> Result<(), StoreError> {
        if start < self.visible_from() {
            return Ok(());
        }
        self.bytes.put(&Self::primary(key, start), value)?;
        if self.spec.indexed {
            self.bytes.put(&Self::index(key, start), &[])?;
        }
        Ok(())
    }

    /// Removes `key` from the window starting at `start`.
    pub fn remove(&mut self, key: &[u8], start: i64) -> Result<(), StoreError> {
        self.bytes.delete(&Self::primary(key, start))?;
        if self.spec.indexed {
            self.bytes.delete(&Self::index(key, start))?;
        }
        Ok(())
    }

    /// [`put`](Self::put), noting the window as not released yet (emit-final; see the module
    /// docs).
    pub(crate) fn put_unreleased(
        &mut self,
        key: &[u8],
        start: i64,
        value: &[u8],
    ) -> Result<(), StoreError> {
        if start < self.visible_from() {
            return Ok(());
        }
        self.put(key, start, value)?;
        self.bytes
            .put(&tagged(WINDOW_UNRELEASED, &[&time_bytes(start), key]), &[])
    }

    /// Takes the windows noted unreleased that start at or before `upper`, by (start, key),
    /// with their values (expired ones too, if not deleted yet) and their keys' routing hashes.
    pub(crate) fn take_unreleased(
        &mut self,
        upper: i64,
        size: i64,
    ) -> Result<Vec<Unreleased>, StoreError> {
        // The layout before: note every window past the range's released bound once.
        if let Some(bound) = self.meta(RELEASED_BOUND)?.and_then(|b| time_from(&b)) {
            for (key, start, _) in self.scan(bound.saturating_add(1), i64::MAX)? {
                self.bytes
                    .put(&tagged(WINDOW_UNRELEASED, &[&time_bytes(start), &key]), &[])?;
            }
            self.bytes
                .delete(&tagged(META, &[RELEASED_BOUND.as_bytes()]))?;
        }
        let notes = take_notes(self.bytes, WINDOW_UNRELEASED, upper, |k| {
            tagged(WINDOW, &[k])
        })?;
        let mut out = Vec::with_capacity(notes.len());
        for (k, hash) in notes {
            let (start, key) = self.parse(&tagged(WINDOW, &[&k]))?;
            if let Some(v) = self.bytes.get(&Self::primary(&key, start))? {
                let w = Window::new(start, start.saturating_add(size));
                out.push((key, w, v, hash));
            }
        }
        Ok(out)
    }

    /// The windows of `key` starting from `from` to `to` (both included), by start: (start,
    /// value).
    pub fn fetch(&self, key: &[u8], from: i64, to: i64) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let from = from.max(self.visible_from());
        if from > to {
            return Ok(Vec::new());
        }
        if !self.spec.indexed {
            return Ok(self
                .scan(from, to)?
                .into_iter()
                .filter(|(k, _, _)| k == key)
                .map(|(_, start, v)| (start, v))
                .collect());
        }
        let (lo, hi) = (Self::index(key, from), Self::index(key, to));
        let mut out = Vec::new();
        for (k, _) in self
            .bytes
            .range(Bound::Included(&lo), Bound::Included(&hi))?
        {
            let start = k
                .len()
                .checked_sub(8)
                .and_then(|at| time_from(&k[at..]))
                .ok_or_else(|| corrupt(&*self.bytes, "window index key without its time"))?;
            if let Some(v) = self.bytes.get(&Self::primary(key, start))? {
                out.push((start, v));
            }
        }
        Ok(out)
    }

    /// Every window starting from `from` to `to` (both included), by (start, key bytes):
    /// (key, start, value).
    pub fn fetch_all(&self, from: i64, to: i64) -> Result<WindowEntries, StoreError> {
        let from = from.max(self.visible_from());
        if from > to {
            return Ok(Vec::new());
        }
        self.scan(from, to)
    }

    /// [`WindowBytes::fetch_all`] including expired entries not yet deleted (emit-final releases
    /// every closed window, even one that expired in the same step).
    pub(crate) fn scan(&self, from: i64, to: i64) -> Result<WindowEntries, StoreError> {
        let lo = tagged(WINDOW, &[&time_bytes(from)]);
        let hi = match to.checked_add(1) {
            Some(t) => tagged(WINDOW, &[&time_bytes(t)]),
            None => vec![WINDOW + 1],
        };
        self.bytes
            .range(Bound::Included(&lo), Bound::Excluded(&hi))?
            .into_iter()
            .map(|(k, v)| {
                let (start, key) = self.parse(&k)?;
                Ok((key, start, v))
            })
            .collect()
    }

    /// Deletes expired windows (in steps; see the module docs); returns how many.
    pub fn expire(&mut self) -> Result<usize, StoreError> {
        let indexed = self.spec.indexed;
        let bound = self.visible_from();
        expire_prefix(
            self.bytes,
            WINDOW,
            bound,
            self.spec.retention_ms,
            self.expired_below,
            |k| {
                let start = time_from(k.get(1..9)?)?;
                indexed.then(|| Self::index(&k[9..], start))
            },
        )
    }

    /// Metadata entry `name`.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        meta_get(&*self.bytes, name)
    }

    /// Sets metadata entry `name`.
    pub fn set_meta(&mut self, name: &str, value: &[u8]) -> Result<(), StoreError> {
        self.bytes.put(&tagged(META, &[name.as_bytes()]), value)
    }
}

/// Window entries as (key bytes, window start, value bytes).
pub type WindowEntries = Vec<(Vec<u8>, i64, Vec<u8>)>;
/// Session entries as (key bytes, session window, value bytes).
pub type SessionEntries = Vec<(Vec<u8>, Window, Vec<u8>)>;

/// Byte-level access to a session store.
pub struct SessionBytes<'a> {
    bytes: &'a mut dyn KeyValueBytes,
    spec: SessionStoreSpec,
    stream_time: Option<i64>,
    expired_below: &'a mut i64,
}

impl<'a> SessionBytes<'a> {
    /// Opens `store` as a session store (an error if it is another kind).
    pub fn open(store: TimedStore<'a>) -> Result<Self, StoreError> {
        match store.kind {
            StoreKind::Session(spec) => Ok(SessionBytes {
                bytes: store.bytes,
                spec,
                stream_time: store.stream_time,
                expired_below: store.expired_below,
            }),
            other => Err(wrong_kind(store.bytes.name(), "session", other)),
        }
    }

    fn visible_from(&self) -> i64 {
        visible_from(self.stream_time, self.spec.retention_ms)
    }

    fn primary(key: &[u8], w: Window) -> Vec<u8> {
        tagged(SESSION, &[&time_bytes(w.end), key, &time_bytes(w.start)])
    }

    fn index(key: &[u8], w: Window) -> Vec<u8> {
        tagged(
            SESSION_INDEX,
            &[
                &len_prefix(key),
                key,
                &time_bytes(w.end),
                &time_bytes(w.start),
            ],
        )
    }

    /// Splits a primary key into (key, window).
    fn parse(&self, k: &[u8]) -> Result<(Vec<u8>, Window), StoreError> {
        let n = k.len();
        let times = (k.first() == Some(&SESSION) && n >= 17)
            .then(|| Some((time_from(&k[1..9])?, time_from(&k[n - 8..])?)))
            .flatten();
        match times {
            Some((end, start)) => Ok((k[9..n - 8].to_vec(), Window::new(start, end))),
            None => Err(corrupt(&*self.bytes, "session key without its times")),
        }
    }

    /// The sessions of `key` that end at or after `earliest_end` and start at or before
    /// `latest_start`, by end (Kafka Streams' `findSessions`); expired ones are hidden.
    pub fn find_sessions(
        &self,
        key: &[u8],
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<SessionEntries, StoreError> {
        let from = earliest_end.max(self.visible_from());
        let lo = tagged(
            SESSION_INDEX,
            &[
                &len_prefix(key),
                key,
                &time_bytes(from),
                &time_bytes(i64::MIN),
            ],
        );
        let hi = tagged(SESSION_INDEX, &[&len_prefix(key), key]);
        let hi = crate::store::prefix_end(&hi);
        let to = hi.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::new();
        for (k, _) in self.bytes.range(Bound::Included(&lo), to)? {
            let n = k.len();
            let (Some(end), Some(start)) = (
                k.get(n.wrapping_sub(16)..n - 8).and_then(time_from),
                k.get(n - 8..).and_then(time_from),
            ) else {
                return Err(corrupt(&*self.bytes, "session index key without its times"));
            };
            if start > latest_start {
                // Sessions of one key never overlap: later ones start later too.
                break;
            }
            let w = Window::new(start, end);
            if let Some(v) = self.bytes.get(&Self::primary(key, w))? {
                out.push((key.to_vec(), w, v));
            }
        }
        Ok(out)
    }

    /// The value of `key`'s session `window`, unless expired or gone.
    pub fn fetch_session(&self, key: &[u8], window: Window) -> Result<Option<Vec<u8>>, StoreError> {
        if window.end < self.visible_from() {
            return Ok(None);
        }
        self.bytes.get(&Self::primary(key, window))
    }

    /// Sets `key`'s session `window`.
    pub fn put(&mut self, key: &[u8], window: Window, value: &[u8]) -> Result<(), StoreError> {
        if window.end < self.visible_from() {
            return Ok(());
        }
        self.bytes.put(&Self::primary(key, window), value)?;
        self.bytes.put(&Self::index(key, window), &[])
    }

    /// Removes `key`'s session `window`.
    pub fn remove(&mut self, key: &[u8], window: Window) -> Result<(), StoreError> {
        self.bytes.delete(&Self::primary(key, window))?;
        self.bytes.delete(&Self::index(key, window))
    }

    fn unreleased(key: &[u8], w: Window) -> Vec<u8> {
        tagged(
            SESSION_UNRELEASED,
            &[&time_bytes(w.end), key, &time_bytes(w.start)],
        )
    }

    /// [`put`](Self::put), noting the session as not released yet (emit-final).
    pub(crate) fn put_unreleased(
        &mut self,
        key: &[u8],
        window: Window,
        value: &[u8],
    ) -> Result<(), StoreError> {
        if window.end < self.visible_from() {
            return Ok(());
        }
        self.put(key, window, value)?;
        self.bytes.put(&Self::unreleased(key, window), &[])
    }

    /// [`remove`](Self::remove) of a session emit-final has not released (merged into another).
    pub(crate) fn remove_unreleased(
        &mut self,
        key: &[u8],
        window: Window,
    ) -> Result<(), StoreError> {
        self.remove(key, window)?;
        self.bytes.delete(&Self::unreleased(key, window))
    }

    /// Takes the sessions noted unreleased that end at or before `upper`, by (end, key, start),
    /// with their values and their keys' routing hashes.
    pub(crate) fn take_unreleased(&mut self, upper: i64) -> Result<Vec<Unreleased>, StoreError> {
        // The layout before: note every session past the range's released bound once.
        if let Some(bound) = self.meta(RELEASED_BOUND)?.and_then(|b| time_from(&b)) {
            for (key, w, _) in self.scan(bound.saturating_add(1), i64::MAX)? {
                self.bytes.put(&Self::unreleased(&key, w), &[])?;
            }
            self.bytes
                .delete(&tagged(META, &[RELEASED_BOUND.as_bytes()]))?;
        }
        let notes = take_notes(self.bytes, SESSION_UNRELEASED, upper, |k| {
            tagged(SESSION, &[k])
        })?;
        let mut out = Vec::with_capacity(notes.len());
        for (k, hash) in notes {
            let (key, w) = self.parse(&tagged(SESSION, &[&k]))?;
            if let Some(v) = self.bytes.get(&Self::primary(&key, w))? {
                out.push((key, w, v, hash));
            }
        }
        Ok(out)
    }

    /// Every visible session ending from `from` to `to` (both included), by (end, key, start).
    pub fn fetch_all(&self, from: i64, to: i64) -> Result<SessionEntries, StoreError> {
        self.scan(from.max(self.visible_from()), to)
    }

    /// [`SessionBytes::fetch_all`] including expired sessions not yet deleted.
    pub(crate) fn scan(&self, from: i64, to: i64) -> Result<SessionEntries, StoreError> {
        if from > to {
            return Ok(Vec::new());
        }
        let lo = tagged(SESSION, &[&time_bytes(from)]);
        let hi = match to.checked_add(1) {
            Some(t) => tagged(SESSION, &[&time_bytes(t)]),
            None => vec![SESSION + 1],
        };
        self.bytes
            .range(Bound::Included(&lo), Bound::Excluded(&hi))?
            .into_iter()
            .map(|(k, v)| {
                let (key, w) = self.parse(&k)?;
                Ok((key, w, v))
            })
            .collect()
    }

    /// Deletes expired sessions (in steps); returns how many.
    pub fn expire(&mut self) -> Result<usize, StoreError> {
        let bound = self.visible_from();
        expire_prefix(
            self.bytes,
            SESSION,
            bound,
            self.spec.retention_ms,
            self.expired_below,
            |k| {
                let n = k.len();
                let w = Window::new(
                    time_from(k.get(n.checked_sub(8)?..)?)?,
                    time_from(k.get(1..9)?)?,
                );
                Some(Self::index(k.get(9..n - 8)?, w))
            },
        )
    }

    /// Metadata entry `name`.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        meta_get(&*self.bytes, name)
    }

    /// Sets metadata entry `name`.
    pub fn set_meta(&mut self, name: &str, value: &[u8]) -> Result<(), StoreError> {
        self.bytes.put(&tagged(META, &[name.as_bytes()]), value)
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
