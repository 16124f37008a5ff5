use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::serdes::{I64Serde, StringSerde};
use crate::store::{MemoryKeyValue, VersionedStoreSpec};

fn open(mem: &mut MemoryKeyValue, history_ms: i64) -> VersionedBytes<'_> {
    // Versioned stores do not use the expiry position; the view only needs one to borrow. The
    // observed time lives as long as the view (each test opens its store once).
    let expired_below = Box::leak(Box::new(i64::MIN));
    let observed = Box::leak(Box::new(None));
    VersionedBytes::open(TimedStore {
        bytes: mem,
        kind: StoreKind::Versioned(VersionedStoreSpec {
            history_retention_ms: history_ms,
        }),
        stream_time: None,
        expired_below,
        observed,
    })
    .expect("a versioned store")
}

#[test]
fn reads_as_of_a_time_see_the_version_valid_then() {
    let mut mem = MemoryKeyValue::new("v");
    let mut s = open(&mut mem, 1_000);
    assert_eq!(s.put(b"k", Some(b"a"), 10).unwrap(), PutOutcome::Latest);
    assert_eq!(s.put(b"k", Some(b"c"), 30).unwrap(), PutOutcome::Latest);
    // Out of order: valid until the next version.
    assert_eq!(
        s.put(b"k", Some(b"b"), 20).unwrap(),
        PutOutcome::ValidTo(30)
    );
    assert_eq!(s.get_as_of(b"k", 9).unwrap(), None);
    let at = |s: &VersionedBytes<'_>, t| s.get_as_of(b"k", t).unwrap().map(|r| r.value);
    assert_eq!(at(&s, 10), Some(b"a".to_vec()));
    assert_eq!(at(&s, 25), Some(b"b".to_vec()));
    let r = s.get_as_of(b"k", 25).unwrap().unwrap();
    assert_eq!((r.timestamp, r.valid_to), (20, Some(30)));
    assert_eq!(s.get(b"k").unwrap(), Some((b"c".to_vec(), 30)));
    // A tombstone ends the key's life from its time on.
    assert_eq!(s.put(b"k", None, 40).unwrap(), PutOutcome::Latest);
    assert_eq!(s.get(b"k").unwrap(), None);
    assert_eq!(at(&s, 39), Some(b"c".to_vec()));
    assert_eq!(at(&s, 40), None);
}

#[test]
fn history_retention_bounds_reads_puts_and_what_is_kept() {
    let mut mem = MemoryKeyValue::new("v");
    let mut s = open(&mut mem, 100);
    for t in [0, 50, 100, 150] {
        s.put(b"k", Some(format!("{t}").as_bytes()), t).unwrap();
    }
    s.put(b"other", Some(b"x"), 1_000).unwrap();
    // Observed stream time 1000: the bound is 900.
    assert_eq!(
        s.put(b"k", Some(b"late"), 899).unwrap(),
        PutOutcome::Expired
    );
    assert_eq!(s.get_as_of(b"k", 899).unwrap(), None);
    assert_eq!(
        s.get_as_of(b"k", 900).unwrap().map(|r| r.value),
        Some(b"150".to_vec())
    );
    // The latest version is kept whatever its age.
    assert_eq!(s.get(b"k").unwrap(), Some((b"150".to_vec(), 150)));
    // A put to `k` drops its versions no read can reach: only the one valid at 900 is left.
    s.put(b"k", Some(b"new"), 950).unwrap();
    let k_versions = mem
        .all()
        .unwrap()
        .into_iter()
        .filter(|(key, _)| key.starts_with(&VersionedBytes::prefix(b"k")))
        .count();
    assert_eq!(k_versions, 2);
}

#[test]
fn a_window_store_is_not_a_versioned_store() {
    let mut mem = MemoryKeyValue::new("w");
    let mut expired_below = i64::MIN;
    let err = VersionedBytes::open(TimedStore {
        bytes: &mut mem,
        kind: StoreKind::KeyValue,
        stream_time: None,
        expired_below: &mut expired_below,
        observed: &mut None,
    })
    .err();
    assert!(matches!(err, Some(StoreError::WrongKind { .. })), "{err:?}");
}

#[test]
fn the_typed_store_deletes_and_returns_what_was_valid() {
    use crate::processor::ProcessorContext;
    let mut host = crate::test_host::TestHost::default();
    let kind = StoreKind::Versioned(VersionedStoreSpec {
        history_retention_ms: 60_000,
    });
    host.connect("v", kind);
    host.connect("w", StoreKind::KeyValue);
    let mut ctx = ProcessorContext::<String, i64>::new(&mut host);
    let s = ctx.versioned_store("v", StringSerde, I64Serde).unwrap();
    let k = "alice".to_string();
    s.put(&mut ctx, &k, &1, 100).unwrap();
    s.put(&mut ctx, &k, &2, 200).unwrap();
    let gone = s.delete(&mut ctx, &k, 150).unwrap().unwrap();
    assert_eq!(
        (gone.value, gone.timestamp, gone.valid_to),
        (1, 100, Some(200))
    );
    assert_eq!(s.get_as_of(&mut ctx, &k, 160).unwrap(), None);
    assert_eq!(s.get(&mut ctx, &k).unwrap().map(|r| r.value), Some(2));
    let err = ctx.versioned_store("w", StringSerde, I64Serde).unwrap_err();
    assert!(matches!(err, StoreError::WrongKind { .. }), "{err}");
}

/// Every version ever put, by key and time (`None`: a tombstone), and the observed stream time.
#[derive(Default)]
struct Oracle {
    history: BTreeMap<u8, BTreeMap<i64, Option<u8>>>,
    observed: Option<i64>,
}

impl Oracle {
    fn bound(&self, h: i64) -> i64 {
        self.observed.map_or(i64::MIN, |o| o - h)
    }
    fn put(&mut self, k: u8, v: Option<u8>, t: i64, h: i64) -> PutOutcome {
        if t < self.bound(h) {
            return PutOutcome::Expired;
        }
        self.observed = Some(self.observed.map_or(t, |o| o.max(t)));
        let versions = self.history.entry(k).or_default();
        versions.insert(t, v);
        match versions.range(t + 1..).next() {
            Some((&next, _)) => PutOutcome::ValidTo(next),
            None => PutOutcome::Latest,
        }
    }
    fn get(&self, k: u8) -> Option<(u8, i64)> {
        let (&t, v) = self.history.get(&k)?.iter().next_back()?;
        v.map(|v| (v, t))
    }
    fn get_as_of(&self, k: u8, t: i64, h: i64) -> Option<(u8, i64, Option<i64>)> {
        if t < self.bound(h) {
            return None;
        }
        let versions = self.history.get(&k)?;
        let (&from, v) = versions.range(..=t).next_back()?;
        let valid_to = versions.range(t + 1..).next().map(|(&n, _)| n);
        v.map(|v| (v, from, valid_to))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random puts and tombstones at random (often out-of-order) times: every outcome and every
    /// read equals an oracle that keeps all history.
    #[test]
    fn versioned_store_equals_a_full_history_oracle(
        h in 0i64..50,
        ops in prop::collection::vec((0u8..4, prop::option::weighted(0.8, any::<u8>()), 0i64..200), 1..80),
    ) {
        let mut mem = MemoryKeyValue::new("v");
        let mut s = open(&mut mem, h);
        let mut oracle = Oracle::default();
        for (k, v, t) in ops {
            let got = s.put(&[k], v.as_ref().map(std::slice::from_ref), t).unwrap();
            prop_assert_eq!(got, oracle.put(k, v, t, h));
            for key in 0u8..4 {
                let latest = s.get(&[key]).unwrap().map(|(v, t)| (v[0], t));
                prop_assert_eq!(latest, oracle.get(key));
                for at in (-1..=201).step_by(7) {
                    let got = s
                        .get_as_of(&[key], at)
                        .unwrap()
                        .map(|r| (r.value[0], r.timestamp, r.valid_to));
                    prop_assert_eq!(got, oracle.get_as_of(key, at, h), "key {} as of {}", key, at);
                }
            }
        }
    }
}

/// A store of the layout before keeps its observed time in an entry: it is read while the range
/// has no committed time, and deleted once the time moves to the range's progress.
#[test]
fn the_observed_time_of_the_layout_before_is_taken_over() {
    let mut mem = MemoryKeyValue::new("v");
    mem.put(LEGACY_OBSERVED, &crate::window::time_bytes(100))
        .unwrap();
    {
        let mut s = open(&mut mem, 10);
        assert_eq!(s.observed_stream_time().unwrap(), Some(100));
        assert_eq!(s.put(b"k", Some(b"a"), 50).unwrap(), PutOutcome::Expired);
        assert_eq!(s.put(b"k", Some(b"a"), 95).unwrap(), PutOutcome::Latest);
        assert_eq!(s.observed_stream_time().unwrap(), Some(100));
        assert_eq!(*s.observed, Some(100), "kept by the sub-task now");
    }
    assert_eq!(mem.get(LEGACY_OBSERVED).unwrap(), None);
}
