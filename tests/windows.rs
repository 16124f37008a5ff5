//! Windows and event time on the TestDriver: each window type's semantics on hand-picked
//! records, late records, emit-final (emit strategy and suppress) across restarts, expiry,
//! timestamp extractors, and the Processor API's window stores.

use std::path::Path;
use std::time::Duration;

use rill::prelude::*;
use rill::topology::RawRecord;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Counts per key in tumbling windows of 10 ms with 5 ms grace, writing updates to `updates`.
fn tumbling_count() -> Topology {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_and_grace(ms(10), ms(5)))
        .count("counts")
        .to_stream()
        .to("updates");
    b.build().unwrap()
}

fn windowed(key: &str, start: i64, end: i64) -> Windowed<String> {
    Windowed::new(key.to_string(), Window::new(start, end))
}

#[test]
fn tumbling_windows_count_per_window_and_drop_records_later_than_grace() {
    let driver = TestDriver::new(tumbling_count()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let out = driver.output_topic("updates", TimeWindowedSerde::new(StringSerde, 10), I64Serde);
    let a = || "a".to_string();
    input.pipe_input_at(a(), "x".into(), 3);
    input.pipe_input_at(a(), "x".into(), 12);
    // Out of order, within grace: stream time 12, window [0,10) closes at 10 + 5.
    input.pipe_input_at(a(), "x".into(), 8);
    input.pipe_input_at(a(), "x".into(), 15);
    // Stream time 15: window [0,10) has closed (10 <= 15 - 5); this record is late.
    input.pipe_input_at(a(), "x".into(), 9);
    assert_eq!(
        out.read_key_values(),
        vec![
            (windowed("a", 0, 10), 1),
            (windowed("a", 10, 20), 1),
            (windowed("a", 0, 10), 2),
            (windowed("a", 10, 20), 2),
        ]
    );
    assert_eq!(driver.with_stats(|s| s.late_dropped()), 1);
    let store = driver.window_store("counts", StringSerde, I64Serde);
    assert_eq!(store.fetch(&a(), 0, 100), vec![(0, 2), (10, 2)]);
    assert_eq!(store.fetch(&a(), 5, 100), vec![(10, 2)]);
    assert_eq!(store.fetch_all(0, 0), vec![(windowed("a", 0, 10), 2)]);
}

#[test]
fn hopping_windows_count_a_record_in_every_window_it_falls_in() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(ms(10)).advance_by(ms(5)))
        .count(Materialized::named("hops").with_retention(ms(100)));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    for ts in [1, 6, 7, 12] {
        input.pipe_input_at("k".into(), "v".into(), ts);
    }
    let store = driver.window_store("hops", StringSerde, I64Serde);
    assert_eq!(
        store.fetch(&"k".to_string(), 0, 100),
        vec![(0, 3), (5, 3), (10, 1)]
    );
}

#[test]
fn sliding_windows_hold_the_records_within_the_time_difference() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde)
        .group_by_key()
        .windowed_by(SlidingWindows::of_time_difference_and_grace(
            ms(10),
            ms(100),
        ))
        .reduce(|a, b| a + b, "sums")
        .to_stream()
        .to("sums-out");
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    // Kafka Streams' documented example shape: records at 10, 15, 23 (difference 10).
    input.pipe_input_at("k".into(), 1, 10);
    input.pipe_input_at("k".into(), 2, 15);
    input.pipe_input_at("k".into(), 4, 23);
    // An out-of-order record at 12 lands in every window covering it.
    input.pipe_input_at("k".into(), 8, 12);
    let store = driver.window_store("sums", StringSerde, I64Serde);
    let got = store.fetch(&"k".to_string(), 0, 100);
    // Left windows [t-10, t] of 10, 12, 15 and 23, right windows [t+1, t+11] of 10 and 15
    // (12's right window is 23's left one; 23 has none).
    assert_eq!(
        got,
        vec![(0, 1), (2, 9), (5, 11), (11, 10), (13, 6), (16, 4)]
    );
}

#[test]
fn sessions_merge_when_a_record_bridges_the_gap() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(SessionWindows::of_inactivity_gap_and_grace(ms(5), ms(100)))
        .count("sessions")
        .to_stream()
        .to("sessions-out");
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let out = driver.output_topic(
        "sessions-out",
        SessionWindowedSerde::new(StringSerde),
        I64Serde,
    );
    input.pipe_input_at("u".into(), "x".into(), 0);
    input.pipe_input_at("u".into(), "x".into(), 3);
    input.pipe_input_at("u".into(), "x".into(), 20);
    let store = driver.session_store("sessions", StringSerde, I64Serde);
    assert_eq!(
        store.fetch(&"u".to_string()),
        vec![(Window::new(0, 3), 2), (Window::new(20, 20), 1)]
    );
    // 16 joins [20,20]; 8 joins [0,3]; 12 is within 5 of both 8 and 16: one session.
    input.pipe_input_at("u".into(), "x".into(), 16);
    input.pipe_input_at("u".into(), "x".into(), 8);
    input.pipe_input_at("u".into(), "x".into(), 12);
    assert_eq!(store.fetch(&"u".to_string()), vec![(Window::new(0, 20), 6)]);
    // The update stream carries each new session; merged-away ones are not retracted on it.
    assert_eq!(
        out.read_key_values(),
        vec![
            (windowed("u", 0, 0), 1),
            (windowed("u", 0, 3), 2),
            (windowed("u", 20, 20), 1),
            (windowed("u", 16, 20), 2),
            (windowed("u", 0, 8), 3),
            (windowed("u", 0, 20), 6),
        ]
    );
}

/// Emit-final both ways on one topology: the emit strategy and suppress.
fn final_counts(b: &StreamsBuilder) {
    let grouped = b.stream("in", StringSerde, StringSerde).group_by_key();
    let windows = TimeWindows::of_size_and_grace(ms(10), ms(5));
    grouped
        .windowed_by(windows)
        .emit_strategy(EmitStrategy::on_window_close())
        .count("closed")
        .to_stream()
        .to("on-close");
    grouped
        .windowed_by(windows)
        .count("counted")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()).with_name("final"))
        .to_stream()
        .to("suppressed");
}

#[test]
fn emit_final_forwards_each_window_once_when_stream_time_passes_end_plus_grace() {
    let b = StreamsBuilder::new();
    final_counts(&b);
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let serde = || TimeWindowedSerde::new(StringSerde, 10);
    let on_close = driver.output_topic("on-close", serde(), I64Serde);
    let suppressed = driver.output_topic("suppressed", serde(), I64Serde);
    for ts in [1, 4, 11, 9, 14] {
        input.pipe_input_at("a".into(), "x".into(), ts);
    }
    assert!(
        on_close.is_empty() && suppressed.is_empty(),
        "stream time 14 < 10 + 5"
    );
    input.pipe_input_at("b".into(), "x".into(), 15);
    for out in [&on_close, &suppressed] {
        assert_eq!(out.read_key_values(), vec![(windowed("a", 0, 10), 3)]);
    }
    input.pipe_input_at("a".into(), "x".into(), 40);
    for out in [&on_close, &suppressed] {
        assert_eq!(
            out.read_key_values(),
            vec![(windowed("a", 10, 20), 2), (windowed("b", 10, 20), 1)]
        );
    }
}

#[test]
fn emit_final_is_exact_across_a_restart_from_the_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let b = StreamsBuilder::new();
    final_counts(&b);
    let topology = b.build().unwrap();
    let serde = || TimeWindowedSerde::new(StringSerde, 10);
    let open = || {
        TestDriver::builder(topology.clone())
            .parallelising_factor(2)
            .state_dir(dir.path())
            .build()
            .unwrap()
    };
    let driver = open();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    for ts in [1, 4, 11] {
        input.pipe_input_at("a".into(), "x".into(), ts);
    }
    driver.commit().unwrap();
    // After the commit: closes window [0,10), then the process dies before committing.
    input.pipe_input_at("a".into(), "x".into(), 16);
    let before: Vec<_> = driver
        .output_topic("suppressed", serde(), I64Serde)
        .read_key_values();
    assert_eq!(before, vec![(windowed("a", 0, 10), 2)]);
    // Handles share the driver's engine: drop them all, like a process dying.
    drop((input, driver));
    // The restarted driver replays the uncommitted record: the window is released again, with
    // the same value (outputs are at least once), and nothing else.
    let driver = open();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    input.pipe_input_at("a".into(), "x".into(), 16);
    input.pipe_input_at("a".into(), "x".into(), 30);
    for topic in ["on-close", "suppressed"] {
        assert_eq!(
            driver
                .output_topic(topic, serde(), I64Serde)
                .read_key_values(),
            vec![(windowed("a", 0, 10), 2), (windowed("a", 10, 20), 2)],
            "{topic}"
        );
    }
}

#[test]
fn until_time_limit_forwards_a_key_at_most_once_per_limit() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count("totals")
        .suppress(Suppressed::until_time_limit(
            ms(10),
            BufferConfig::unbounded(),
        ))
        .to_stream()
        .to("limited");
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let out = driver.output_topic("limited", StringSerde, I64Serde);
    for ts in [0, 3, 6] {
        input.pipe_input_at("k".into(), "x".into(), ts);
    }
    assert!(out.is_empty());
    input.pipe_input_at("other".into(), "x".into(), 10);
    assert_eq!(out.read_key_values(), vec![("k".to_string(), 3)]);
    input.pipe_input_at("k".into(), "x".into(), 12);
    input.pipe_input_at("other".into(), "x".into(), 22);
    // Both are due at 22: "other" (held since 10, now 2) before "k" (held since 12).
    assert_eq!(
        out.read_key_values(),
        vec![("other".to_string(), 2), ("k".to_string(), 4)]
    );
}

#[test]
fn a_bounded_buffer_emits_early_or_stops_when_full() {
    let build = |buffer: BufferConfig| {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .group_by_key()
            .count("n")
            .suppress(Suppressed::until_time_limit(ms(1000), buffer))
            .to_stream()
            .to("out");
        TestDriver::new(b.build().unwrap()).unwrap()
    };
    let driver = build(BufferConfig::max_records(2));
    let input = driver.input_topic("in", StringSerde, StringSerde);
    for k in ["a", "b", "c"] {
        input.pipe_input_at(k.into(), "x".into(), 0);
    }
    let out = driver.output_topic("out", StringSerde, I64Serde);
    assert_eq!(
        out.read_key_values().len(),
        1,
        "the oldest held key went out early"
    );
    let driver = build(BufferConfig::max_records(2).shutdown_when_full());
    let input = driver.input_topic("in", StringSerde, StringSerde);
    input.pipe_input_at("a".into(), "x".into(), 0);
    input.pipe_input_at("b".into(), "x".into(), 0);
    let err = input.try_pipe_input("c".into(), "x".into()).unwrap_err();
    assert!(err.to_string().contains("is full"), "{err}");
}

#[test]
fn expired_windows_leave_the_store() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_and_grace(ms(10), ms(0)))
        .count(Materialized::named("expiring").with_retention(ms(40)));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let raw = driver.key_value_store("expiring", BytesSerde, BytesSerde);
    for t in 0..100 {
        input.pipe_input_at(format!("k{}", t % 7), "x".into(), t * 10);
    }
    // Stream time 990, retention 40: windows starting below 950 are expired, and expiry has
    // deleted (in steps of 10) everything starting below 950.
    let starts: Vec<i64> = raw
        .all()
        .keys()
        .filter(|k| k.first() == Some(&b'w'))
        .map(|k| i64::from_be_bytes(k[1..9].try_into().unwrap()) ^ i64::MIN)
        .collect();
    assert!(!starts.is_empty());
    assert!(starts.iter().all(|&s| s >= 950), "{starts:?}");
    assert!(raw.all().len() <= 8, "bounded: {} entries", raw.all().len());
    let store = driver.window_store("expiring", StringSerde, I64Serde);
    assert!(store.fetch(&"k0".to_string(), 0, 940).is_empty());
}

/// Compacts every column family of `store` in the RocksDB under the state dir `dir` and returns
/// the window start of every window-store entry left (data keys are `0x01 'w' T(start) key`).
fn window_starts_on_disk(dir: &Path, store: &str) -> Vec<i64> {
    let path = dir.join("rocksdb");
    let opts = rocksdb::Options::default();
    let cfs = rocksdb::DB::list_cf(&opts, &path).expect("list column families");
    let db = rocksdb::DB::open_cf(&opts, &path, &cfs).expect("open the state dir's RocksDB");
    let ours: Vec<&String> = cfs
        .iter()
        .filter(|n| n.starts_with(&format!("{store}.")))
        .collect();
    assert!(!ours.is_empty(), "no column family of {store} in {cfs:?}");
    let mut starts = Vec::new();
    for name in ours {
        let cf = db.cf_handle(name).expect("column family");
        db.compact_range_cf(&cf, None::<&[u8]>, None::<&[u8]>);
        for item in db.iterator_cf(&cf, rocksdb::IteratorMode::Start) {
            let (k, _) = item.expect("read");
            if let [0x01, b'w', t @ ..] = &k[..] {
                let t: [u8; 8] = t[..8].try_into().expect("8-byte time");
                starts.push(i64::from_be_bytes(t) ^ i64::MIN);
            }
        }
    }
    starts
}

#[test]
fn expiry_keeps_the_window_store_on_disk_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let b = StreamsBuilder::new();
    // Default retention: size + grace = 15 ms.
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_and_grace(ms(10), ms(5)))
        .count("bounded");
    let driver = TestDriver::builder(b.build().unwrap())
        .partitions("in", 2)
        .parallelising_factor(4)
        .state_dir(dir.path())
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    // 20 keys, one record each every 20 ms for 5 s: 250 windows per key without expiry.
    for t in 0..5_000i64 {
        input.pipe_input_at(format!("k{}", t % 20), "x".into(), t);
        if t % 500 == 0 {
            driver.commit().unwrap();
        }
    }
    driver.commit().unwrap();
    drop(input);
    driver.close().unwrap();
    let starts = window_starts_on_disk(dir.path(), "bounded");
    // Each range's stream time is at least 4980 (each holds a key, and each key comes every
    // 20 ms); entries below stream time - retention are deleted in steps of retention / 4 = 3.
    assert!(
        starts.iter().all(|&s| s >= 4_980 - 15 - 3 - 10),
        "expired windows left on disk: {:?}",
        starts.iter().filter(|&&s| s < 4_950).collect::<Vec<_>>()
    );
    assert!(
        starts.contains(&4_990),
        "the newest windows are kept: {starts:?}"
    );
    assert!(
        starts.len() <= 20 * 5,
        "{} window entries on disk for 20 keys",
        starts.len()
    );
}

#[test]
fn timestamp_extractors_and_invalid_timestamp_handlers() {
    let build = |consumed: Consumed<String, i64>| {
        let b = StreamsBuilder::new();
        b.stream_with("in", consumed)
            .group_by_key()
            .windowed_by(TimeWindows::of_size_with_no_grace(ms(100)))
            .count("c");
        TestDriver::new(b.build().unwrap()).unwrap()
    };
    // Event time from the value; the record timestamp is ignored.
    let driver = build(
        Consumed::with(StringSerde, I64Serde).with_timestamp_extractor(|_k, v: &i64, _ts| *v),
    );
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input_at("k".into(), 250, 0);
    let store = driver.window_store("c", StringSerde, I64Serde);
    assert_eq!(store.fetch(&"k".to_string(), 0, 1000), vec![(200, 1)]);

    // Default: a negative timestamp stops processing.
    let driver =
        build(Consumed::with(StringSerde, I64Serde).with_timestamp_extractor(|_, v: &i64, _| *v));
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let raw = |v: i64| RawRecord {
        key: Some(b"k".to_vec()),
        value: Some(v.to_be_bytes().to_vec()),
        timestamp: 0,
        headers: Headers::new(),
    };
    let err = driver.pipe_raw("in", None, raw(-5)).unwrap_err();
    assert!(
        err.to_string().contains("invalid (negative) timestamp -5"),
        "{err}"
    );
    drop(input);

    // LogAndSkip drops and counts; UsePartitionTime takes the range's stream time.
    let skip = build(
        Consumed::with(StringSerde, I64Serde)
            .with_timestamp_extractor(|_, v: &i64, _| *v)
            .with_invalid_timestamp_handler(LogAndSkipOnInvalidTimestamp),
    );
    skip.pipe_raw("in", None, raw(-1)).unwrap();
    assert_eq!(skip.with_stats(|s| s.discarded("invalid_timestamp")), 1);
    let partition_time = build(
        Consumed::with(StringSerde, I64Serde)
            .with_timestamp_extractor(|_, v: &i64, _| *v)
            .with_invalid_timestamp_handler(UsePartitionTimeOnInvalidTimestamp),
    );
    partition_time.pipe_raw("in", None, raw(150)).unwrap();
    partition_time.pipe_raw("in", None, raw(-1)).unwrap();
    let store = partition_time.window_store("c", StringSerde, I64Serde);
    assert_eq!(store.fetch(&"k".to_string(), 0, 1000), vec![(100, 2)]);
}

#[test]
fn processors_use_window_stores_through_the_context() {
    /// Keeps the last value per key and 100 ms window, and forwards what the window held.
    struct LastPerWindow;
    impl Processor<String, i64, String, i64> for LastPerWindow {
        fn process(
            &mut self,
            r: Record<String, i64>,
            ctx: &mut ProcessorContext<'_, String, i64>,
        ) -> Result<(), ProcessError> {
            let key = r.key.clone().unwrap_or_default();
            let start = r.timestamp - r.timestamp % 100;
            let store = ctx.get_window_store::<String, i64>("last")?;
            let previous = store.get(ctx, &key, start)?;
            store.put(ctx, &key, &r.value, start)?;
            ctx.forward(r.with_key_value(Some(key), previous.unwrap_or(-1)));
            Ok(())
        }
    }
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::window_store_builder(
        Stores::persistent_window_store("last", ms(1000), ms(100)),
        StringSerde,
        I64Serde,
    ));
    b.stream("in", StringSerde, I64Serde)
        .process("last-per-window", || LastPerWindow, &["last"])
        .to_with("previous", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    input.pipe_input_at("k".into(), 1, 10);
    input.pipe_input_at("k".into(), 2, 20);
    input.pipe_input_at("k".into(), 3, 120);
    let out = driver.output_topic("previous", StringSerde, I64Serde);
    assert_eq!(out.read_values(), vec![-1, 1, -1]);
    let store = driver.window_store("last", StringSerde, I64Serde);
    assert_eq!(
        store.fetch(&"k".to_string(), 0, 1000),
        vec![(0, 2), (100, 3)]
    );
}

#[test]
fn invalid_window_settings_fail_build_with_the_store_named() {
    let b = StreamsBuilder::new();
    let g = b.stream("in", StringSerde, StringSerde).group_by_key();
    g.windowed_by(TimeWindows::of_size_and_grace(ms(10), ms(5)))
        .count(Materialized::named("short").with_retention(ms(12)));
    let err = b.build().unwrap_err().to_string();
    assert!(
        err.contains("`short`") && err.contains("at least 15 ms"),
        "{err}"
    );

    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(ms(10)).advance_by(ms(20)))
        .count("hops");
    assert!(b.build().unwrap_err().to_string().contains("advance"));

    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count("plain")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()));
    assert!(b
        .build()
        .unwrap_err()
        .to_string()
        .contains("windowed table"));
}

#[test]
fn late_records_are_counted_in_the_metric() {
    let driver = TestDriver::new(tumbling_count()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    input.pipe_input_at("a".into(), "x".into(), 100);
    for ts in [1, 2, 3] {
        input.pipe_input_at("a".into(), "x".into(), ts);
    }
    assert_eq!(driver.with_stats(|s| s.late_dropped()), 3);
}

/// The windowed example of docs/windows-and-time.md, as written there.
#[test]
fn the_readme_windowed_example_emits_each_window_once() {
    let builder = StreamsBuilder::new();
    builder
        .stream("clicks", StringSerde, BytesSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_and_grace(
            Duration::from_secs(60),
            Duration::from_secs(10),
        ))
        .count("clicks-per-window-store")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
        })
        .to_with("clicks-per-window", Produced::with(StringSerde, I64Serde));

    let driver = TestDriver::builder(builder.build().unwrap())
        .parallelising_factor(4)
        .build()
        .unwrap();
    let clicks = driver.input_topic("clicks", StringSerde, BytesSerde);
    clicks.pipe_input_at("alice".into(), vec![], 1_000);
    clicks.pipe_input_at("alice".into(), vec![], 59_000);
    let out = driver.output_topic("clicks-per-window", StringSerde, I64Serde);
    assert!(out.is_empty(), "stream time 59 000: the window is open");
    clicks.pipe_input_at("alice".into(), vec![], 75_000);
    assert_eq!(out.read_key_values(), vec![("alice@0".to_string(), 2)]);
}

/// `a` and a key in another key range than `a`'s at P = 16.
fn keys_in_two_ranges() -> (String, String) {
    use rill::topology::{key_hash, range_of};
    let range = |k: &str| range_of(key_hash(k.as_bytes()), 16);
    let a = "a".to_string();
    let b = (0..)
        .map(|i| format!("b{i}"))
        .find(|k| range(k) != range(&a))
        .unwrap();
    (a, b)
}

/// Lateness and window closes follow the partition's stream time, in whichever key range a key
/// is, as with one range: at P = 16, `b`'s record at 40 closes `a`'s window [0,10) although
/// `a`'s range is quiet, and `a`'s record at 3 is then late. Before, each range had its own
/// time: the window waited for a record of `a`'s range newer than 15, and the one at 3 counted.
#[test]
fn lateness_and_window_closes_follow_the_partition_time_in_quiet_ranges_too() {
    let (a, b) = keys_in_two_ranges();
    for p in [1, 16] {
        let bld = StreamsBuilder::new();
        final_counts(&bld);
        let driver = TestDriver::builder(bld.build().unwrap())
            .parallelising_factor(p)
            .build()
            .unwrap();
        let input = driver.input_topic("in", StringSerde, StringSerde);
        let serde = || TimeWindowedSerde::new(StringSerde, 10);
        let on_close = driver.output_topic("on-close", serde(), I64Serde);
        let suppressed = driver.output_topic("suppressed", serde(), I64Serde);
        input.pipe_input_at(a.clone(), "x".into(), 1);
        input.pipe_input_at(b.clone(), "x".into(), 40);
        // `a`'s range is quiet: the partition's time reaches it all the same.
        let closed = vec![(windowed(&a, 0, 10), 1)];
        assert_eq!(
            (on_close.read_key_values(), suppressed.read_key_values()),
            (closed.clone(), closed),
            "P = {p}: closed by `b`'s record"
        );
        input.pipe_input_at(a.clone(), "x".into(), 3);
        input.pipe_input_at(a.clone(), "x".into(), 41);
        assert_eq!(
            driver.with_stats(|s| s.late_dropped()),
            2,
            "P = {p}: late for both counts"
        );
        assert!(
            on_close.is_empty() && suppressed.is_empty(),
            "P = {p}: each window once"
        );
    }
}

/// The same behind an async stage (issue 42): a quiet range with no call open takes the
/// partition's stream time too, so `b`'s record closes `a`'s window at P = 16 as at P = 1.
/// Before, async ranges took no ticks and the window waited for a record of `a`'s range.
#[test]
fn a_quiet_range_behind_an_async_stage_closes_its_windows_by_the_partition_time() {
    let (a, b) = keys_in_two_ranges();
    for p in [1, 16] {
        let bld = StreamsBuilder::new();
        bld.stream("in", StringSerde, StringSerde)
            .map_values_async(|v: String| async move { Ok(v) })
            .group_by_key()
            .windowed_by(TimeWindows::of_size_and_grace(ms(10), ms(5)))
            .emit_strategy(EmitStrategy::on_window_close())
            .count("closed")
            .to_stream()
            .to("on-close");
        let driver = TestDriver::builder(bld.build().unwrap())
            .parallelising_factor(p)
            .build()
            .unwrap();
        let input = driver.input_topic("in", StringSerde, StringSerde);
        let on_close = driver.output_topic(
            "on-close",
            TimeWindowedSerde::new(StringSerde, 10),
            I64Serde,
        );
        input.pipe_input_at(a.clone(), "x".into(), 1);
        input.pipe_input_at(b.clone(), "x".into(), 40);
        assert_eq!(
            on_close.read_key_values(),
            vec![(windowed(&a, 0, 10), 1)],
            "P = {p}: closed by `b`'s record"
        );
    }
}
