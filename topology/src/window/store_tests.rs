//! Window and session store layouts over an in-memory key-value store.

use super::*;
use crate::serdes::{I64Serde, StringSerde};
use crate::store::MemoryKeyValue;
use crate::window::Windowed;

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

/// Issue 42, item 5: the typed handles fetch windows and sessions as iterators that own their
/// entries, so a processor writes to the same store while it walks one.
#[test]
fn typed_window_and_session_stores_fetch_iterators_while_writing() {
    use crate::processor::ProcessorContext;
    use crate::stores::Stores;
    use crate::test_host::TestHost;
    use std::time::Duration;
    let mut host = TestHost::default();
    let ms = Duration::from_millis;
    host.declare(Stores::window_store_builder(
        Stores::persistent_window_store("w", ms(1000), ms(10)),
        StringSerde,
        I64Serde,
    ));
    host.declare(Stores::session_store_builder(
        Stores::persistent_session_store("s", ms(1000)),
        StringSerde,
        I64Serde,
    ));
    let mut ctx = ProcessorContext::<String, i64>::new(&mut host);
    let w = ctx.get_window_store::<String, i64>("w").unwrap();
    let a = "a".to_string();
    for (start, v) in [(10, 7), (20, 8), (30, 9)] {
        w.put(&mut ctx, &a, &v, start).unwrap();
    }
    w.put(&mut ctx, &"b".to_string(), &1, 20).unwrap();
    assert_eq!(w.get(&mut ctx, &a, 10).unwrap(), Some(7));
    // Doubles every window of "a" while walking them: the walk sees the values it started with.
    for entry in w.fetch(&mut ctx, &a, 0, 25).unwrap() {
        let (start, v) = entry.unwrap();
        w.put(&mut ctx, &a, &(v * 2), start).unwrap();
    }
    let fetched: Vec<(i64, i64)> = w
        .fetch(&mut ctx, &a, 0, 100)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(fetched, [(10, 14), (20, 16), (30, 9)]);
    let backward: Vec<i64> = w
        .fetch(&mut ctx, &a, 0, 100)
        .unwrap()
        .rev()
        .map(|e| e.unwrap().0)
        .collect();
    assert_eq!(backward, [30, 20, 10], "backwardFetch");
    let all: Vec<(Windowed<String>, i64)> = w
        .fetch_all(&mut ctx, 20, 20)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        all,
        [
            (Windowed::new(a.clone(), Window::new(20, 30)), 16),
            (Windowed::new("b".to_string(), Window::new(20, 30)), 1)
        ]
    );
    assert_eq!(w.all(&mut ctx).unwrap().len(), 4);

    let s = ctx.get_session_store::<String, i64>("s").unwrap();
    for (start, end, v) in [(0, 5, 1), (50, 60, 2)] {
        s.put(
            &mut ctx,
            &Windowed::new(a.clone(), Window::new(start, end)),
            &v,
        )
        .unwrap();
    }
    let found: Vec<(Window, i64)> = s
        .find_sessions(&mut ctx, &a, 4, 100)
        .unwrap()
        .map(|e| e.map(|(k, v)| (k.window, v)).unwrap())
        .collect();
    assert_eq!(found, [(Window::new(0, 5), 1), (Window::new(50, 60), 2)]);
    for entry in s.fetch(&mut ctx, &a).unwrap() {
        let (session, _) = entry.unwrap();
        s.remove(&mut ctx, &session).unwrap();
    }
    assert_eq!(s.fetch_all(&mut ctx, i64::MIN, i64::MAX).unwrap().len(), 0);
    assert_eq!(s.fetch_session(&mut ctx, &a, 0, 5).unwrap(), None);
}
