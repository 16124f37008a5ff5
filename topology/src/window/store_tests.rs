//! Window and session store layouts over an in-memory key-value store.

use super::*;
use crate::serdes::{I64Serde, StringSerde};
use crate::store::MemoryKeyValue;
use crate::window::WindowStore;

fn window_kind(retention_ms: i64, indexed: bool) -> StoreKind {
    StoreKind::Window(WindowStoreSpec {
        retention_ms,
        window_size_ms: 10,
        indexed,
        timestamped: false,
    })
}

fn open<'a>(
    kv: &'a mut MemoryKeyValue,
    kind: StoreKind,
    stream_time: Option<i64>,
    cursor: &'a mut i64,
) -> TimedStore<'a> {
    TimedStore {
        bytes: kv,
        kind,
        stream_time,
        expired_below: cursor,
        observed: Box::leak(Box::new(None)),
    }
}

#[test]
fn windows_fetch_by_key_and_time_with_or_without_the_index() {
    for indexed in [true, false] {
        let mut kv = MemoryKeyValue::new("w");
        let mut cursor = i64::MIN;
        let mut w = WindowBytes::open(open(&mut kv, window_kind(1000, indexed), None, &mut cursor))
            .unwrap();
        // "a" and "a\0" share a prefix: the index must keep them apart.
        for (k, start) in [
            (&b"a"[..], 0),
            (b"a\0", 0),
            (b"a", 10),
            (b"b", 10),
            (b"a", 20),
        ] {
            w.put(k, start, &start.to_be_bytes()).unwrap();
        }
        let got: Vec<i64> = w
            .fetch(b"a", 0, 20)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(got, vec![0, 10, 20], "indexed={indexed}");
        assert_eq!(w.fetch(b"a", 5, 15).unwrap().len(), 1);
        assert_eq!(w.fetch(b"a\0", 0, 20).unwrap().len(), 1);
        let all: Vec<(Vec<u8>, i64)> = w
            .fetch_all(10, 10)
            .unwrap()
            .into_iter()
            .map(|(k, s, _)| (k, s))
            .collect();
        assert_eq!(all, vec![(b"a".to_vec(), 10), (b"b".to_vec(), 10)]);
        w.remove(b"a", 10).unwrap();
        assert_eq!(w.fetch(b"a", 0, 20).unwrap().len(), 2);
        assert_eq!(w.get(b"a", 10).unwrap(), None);
    }
}

#[test]
fn expired_windows_are_hidden_at_once_and_deleted_in_steps() {
    let mut kv = MemoryKeyValue::new("w");
    let mut cursor = i64::MIN;
    {
        let mut w =
            WindowBytes::open(open(&mut kv, window_kind(100, true), None, &mut cursor)).unwrap();
        for start in [0, 10, 50, 90, 120] {
            w.put(b"k", start, b"v").unwrap();
        }
    }
    assert_eq!(kv.len(), 10, "5 windows and 5 index entries");
    {
        // Stream time 160: starts below 60 are expired; the step is 25, so expiry deletes
        // below 50 and leaves the window at 50 for a later step.
        let mut w = WindowBytes::open(open(
            &mut kv,
            window_kind(100, true),
            Some(160),
            &mut cursor,
        ))
        .unwrap();
        let visible: Vec<i64> = w
            .fetch(b"k", 0, 200)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(visible, vec![90, 120]);
        assert_eq!(w.get(b"k", 50).unwrap(), None);
        assert_eq!(w.expire().unwrap(), 2);
        assert_eq!(w.expire().unwrap(), 0, "nothing new below the step");
        // Writes to expired windows are dropped.
        w.put(b"k", 5, b"late").unwrap();
    }
    assert_eq!(kv.len(), 6);
    assert_eq!(cursor, 50);
}

#[test]
fn sessions_are_found_by_key_and_overlap_and_expire_by_end() {
    let mut kv = MemoryKeyValue::new("s");
    let mut cursor = i64::MIN;
    let kind = StoreKind::Session(SessionStoreSpec { retention_ms: 100 });
    {
        let mut s = SessionBytes::open(open(&mut kv, kind, None, &mut cursor)).unwrap();
        s.put(b"k", Window::new(0, 5), b"1").unwrap();
        s.put(b"k", Window::new(20, 30), b"2").unwrap();
        s.put(b"k", Window::new(50, 50), b"3").unwrap();
        s.put(b"j", Window::new(22, 24), b"4").unwrap();
        let found: Vec<Window> = s
            .find_sessions(b"k", 6, 50)
            .unwrap()
            .into_iter()
            .map(|(_, w, _)| w)
            .collect();
        assert_eq!(found, vec![Window::new(20, 30), Window::new(50, 50)]);
        let found = s.find_sessions(b"k", 0, 19).unwrap();
        assert_eq!(found.len(), 1);
        let ends: Vec<i64> = s
            .fetch_all(0, 40)
            .unwrap()
            .into_iter()
            .map(|(_, w, _)| w.end)
            .collect();
        assert_eq!(ends, vec![5, 24, 30]);
        s.remove(b"k", Window::new(20, 30)).unwrap();
        assert_eq!(s.fetch_session(b"k", Window::new(20, 30)).unwrap(), None);
    }
    let mut s = SessionBytes::open(open(&mut kv, kind, Some(140), &mut cursor)).unwrap();
    // Stream time 140, retention 100: ends below 40 are hidden; deletion goes to 25 (step 25).
    assert_eq!(
        s.find_sessions(b"k", 0, 100).unwrap().len(),
        1,
        "end 5 expired"
    );
    assert_eq!(s.expire().unwrap(), 2, "[0,5] of k and [22,24] of j");
    // `s` borrows `kv` until its last use above.
    assert_eq!(kv.len(), 2, "k's [50,50] and its index entry");
}

#[test]
fn typed_views_read_and_write_through_serdes() {
    let mut kv = MemoryKeyValue::new("w");
    let mut cursor = i64::MIN;
    let serdes = crate::store::StoreSerdes::new(
        "w",
        std::sync::Arc::new(StringSerde),
        std::sync::Arc::new(I64Serde),
    );
    let mut w = WindowStore::with_serdes(
        open(&mut kv, window_kind(1000, true), None, &mut cursor),
        serdes,
    )
    .unwrap();
    w.put(&"a".to_string(), &7, 10).unwrap();
    assert_eq!(w.get(&"a".to_string(), 10).unwrap(), Some(7));
    assert_eq!(w.fetch(&"a".to_string(), 0, 100).unwrap(), vec![(10, 7)]);
    let all = w.all().unwrap();
    assert_eq!(all[0].0.window, Window::new(10, 20));
    drop(w);
    let session_kind = StoreKind::Session(SessionStoreSpec { retention_ms: 100 });
    let err = WindowBytes::open(open(&mut kv, session_kind, None, &mut cursor)).err();
    assert!(matches!(err, Some(StoreError::WrongKind { .. })), "{err:?}");
}
