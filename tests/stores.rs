//! Issue 42 item 5: Processor-API stores declared once with `Stores` builders (key-value,
//! timestamped key-value, window, session) and opened typed without serdes, as handles that do
//! not hold the context across `forward`; scans and fetches as iterators; a clear error for
//! wrong types.

use std::collections::BTreeMap;
use std::time::Duration;

use rill::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Puts each record in all four stores; a record with key `?` instead forwards what the scans
/// of `totals` return, tagged with the scan.
struct Everything;

impl Processor<String, i64, String, i64> for Everything {
    fn process(
        &mut self,
        r: Record<String, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let key = r.key.clone().unwrap_or_default();
        let ts = r.timestamp;
        if key == "?" {
            let totals = ctx.get_state_store::<String, i64>("totals")?;
            let scans = [
                ("all", totals.all(ctx)?),
                ("range", totals.range(ctx, &"b".into(), &"c".into())?),
                (
                    "reverse",
                    totals.reverse_range(ctx, &"a".into(), &"bb".into())?,
                ),
                (
                    "prefix",
                    totals.prefix_scan(ctx, &"b".to_string(), StringSerde)?,
                ),
            ];
            // The iterators own their entries: forwarding while walking them compiles.
            for (tag, entries) in scans {
                for entry in entries {
                    let (k, v) = entry?;
                    ctx.forward(Record::new(format!("{tag}:{k}"), v).with_timestamp(ts));
                }
            }
            let stamped = ctx.get_state_store::<String, ValueAndTimestamp<i64>>("stamped")?;
            for entry in stamped.all(ctx)? {
                let (k, v) = entry?;
                ctx.forward(Record::new(format!("stamped:{k}"), v.timestamp).with_timestamp(ts));
            }
            return Ok(());
        }
        let totals = ctx.get_state_store::<String, i64>("totals")?;
        let total = totals.get(ctx, &key)?.unwrap_or(0) + r.value;
        totals.put(ctx, &key, &total)?;
        let stamped = ctx.get_state_store::<String, ValueAndTimestamp<i64>>("stamped")?;
        let value = ValueAndTimestamp {
            value: total,
            timestamp: ts,
        };
        stamped.put(ctx, &key, &value)?;
        ctx.get_window_store::<String, i64>("windows")?
            .put(ctx, &key, &r.value, ts - ts % 100)?;
        let session = Windowed::new(key.clone(), Window::new(ts, ts));
        ctx.get_session_store::<String, i64>("sessions")?
            .put(ctx, &session, &r.value)?;
        Ok(())
    }
}

/// Running totals, with handles opened in `init` and kept in the processor: each record reads
/// its key's total and its window's, forwards the new total, then writes both (the handles
/// do not hold the context across `forward`). A key `?` forwards, per window of key `a`,
/// the window's sum, walking the window store's iterator while it forwards.
#[derive(Default)]
struct KeptHandles {
    stores: Option<(KeyValueStore<String, i64>, WindowStore<String, i64>)>,
}

impl Processor<String, i64, String, i64> for KeptHandles {
    fn init(&mut self, ctx: &mut ProcessorContext<'_, String, i64>) -> Result<(), ProcessError> {
        let totals = ctx.get_state_store("totals")?;
        let windows = ctx.get_window_store("windows")?;
        self.stores = Some((totals, windows));
        Ok(())
    }

    fn process(
        &mut self,
        r: Record<String, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let Some((totals, windows)) = &self.stores else {
            return Err(ProcessError::User("process before init".into()));
        };
        let key = r.key.clone().unwrap_or_default();
        let ts = r.timestamp;
        if key == "?" {
            for entry in windows.fetch(ctx, &"a".to_string(), 0, ts)? {
                let (start, sum) = entry?;
                ctx.forward(Record::new(format!("window@{start}"), sum).with_timestamp(ts));
            }
            return Ok(());
        }
        let start = ts - ts % 100;
        let total = totals.get(ctx, &key)?.unwrap_or(0) + r.value;
        let in_window = windows.get(ctx, &key, start)?.unwrap_or(0) + r.value;
        ctx.forward(Record::new(key.clone(), total).with_timestamp(ts));
        totals.put(ctx, &key, &total)?;
        windows.put(ctx, &key, &in_window, start)?;
        Ok(())
    }
}

#[test]
fn store_handles_kept_from_init_read_forward_and_write() {
    let b = StreamsBuilder::new();
    declare_all(&b);
    b.stream("in", StringSerde, I64Serde)
        .process("kept", KeptHandles::default, &["totals", "windows"])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    // One sub-task, so that the record `?` sees the windows of `a`.
    let driver = TestDriver::builder(b.build().unwrap())
        .parallelising_factor(1)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let output = driver.output_topic("out", StringSerde, I64Serde);
    for (key, value, ts) in [("a", 1, 10), ("b", 5, 20), ("a", 2, 30), ("a", 4, 120)] {
        input.pipe_input_at(key.into(), value, ts);
    }
    input.pipe_input_at("?".into(), 0, 200);
    let got = output.read_key_values();
    let want: Vec<(String, i64)> = [
        ("a", 1),
        ("b", 5),
        ("a", 3),
        ("a", 7),
        ("window@0", 3),
        ("window@100", 4),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect();
    assert_eq!(got, want);
    let totals = driver.key_value_store("totals", StringSerde, I64Serde);
    assert_eq!(totals.get(&"a".into()), Some(7));
}

fn declare_all(b: &StreamsBuilder) {
    let configs: BTreeMap<String, String> =
        [("segment.ms".to_string(), "3600000".to_string())].into();
    b.add_state_store(
        Stores::key_value_store_builder(
            Stores::persistent_key_value_store("totals"),
            StringSerde,
            I64Serde,
        )
        .with_logging_enabled(configs),
    );
    b.add_state_store(Stores::timestamped_key_value_store_builder(
        Stores::persistent_timestamped_key_value_store("stamped"),
        StringSerde,
        I64Serde,
    ));
    b.add_state_store(Stores::window_store_builder(
        Stores::persistent_window_store("windows", ms(10_000), ms(100)),
        StringSerde,
        I64Serde,
    ));
    b.add_state_store(Stores::session_store_builder(
        Stores::persistent_session_store("sessions", ms(10_000)),
        StringSerde,
        I64Serde,
    ));
}

const ALL: [&str; 4] = ["totals", "stamped", "windows", "sessions"];

#[test]
fn processors_open_stores_declared_once_and_scan_them_with_iterators() {
    let b = StreamsBuilder::new();
    declare_all(&b);
    b.stream("in", StringSerde, I64Serde)
        .process("everything", || Everything, &ALL)
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let topology = b.build().unwrap();
    let declared = topology.store_declaration("totals").unwrap();
    assert_eq!(declared.changelog_configs()["segment.ms"], "3600000");
    assert_eq!(
        topology.changelog_configs("totals"),
        Some(declared.changelog_configs()),
        "the runtime creates the changelog with them"
    );
    assert_eq!(topology.changelog_configs("stamped"), None);
    // One sub-task, so that one record sees every key in its scans.
    let driver = TestDriver::builder(topology)
        .parallelising_factor(1)
        .build()
        .unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let output = driver.output_topic("out", StringSerde, I64Serde);
    input.pipe_input_at("a".into(), 1, 10);
    input.pipe_input_at("b".into(), 2, 20);
    input.pipe_input_at("bb".into(), 3, 130);
    input.pipe_input_at("c".into(), 4, 140);
    input.pipe_input_at("b".into(), 5, 150);
    input.pipe_input_at("?".into(), 0, 200);
    let got = output.read_key_values();
    let want: Vec<(String, i64)> = [
        ("all:a", 1),
        ("all:b", 7),
        ("all:bb", 3),
        ("all:c", 4),
        ("range:b", 7),
        ("range:bb", 3),
        ("range:c", 4),
        ("reverse:bb", 3),
        ("reverse:b", 7),
        ("reverse:a", 1),
        ("prefix:b", 7),
        ("prefix:bb", 3),
        ("stamped:a", 10),
        ("stamped:b", 150),
        ("stamped:bb", 130),
        ("stamped:c", 140),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect();
    assert_eq!(got, want);
    // The other stores took the records with their declared serdes.
    let windows = driver.window_store("windows", StringSerde, I64Serde);
    assert_eq!(windows.fetch(&"b".into(), 0, 1000), vec![(0, 2), (100, 5)]);
    let sessions = driver.session_store("sessions", StringSerde, I64Serde);
    assert_eq!(
        sessions.fetch(&"b".into()),
        vec![(Window::new(20, 20), 2), (Window::new(150, 150), 5)]
    );
    let totals = driver.key_value_store("totals", StringSerde, I64Serde);
    assert_eq!(totals.get(&"b".into()), Some(7));
}

/// How a processor opens a store: one of the accessors, with some types.
type Open = fn(&mut ProcessorContext<'_, String, i64>) -> Result<(), StoreError>;

/// Opens a store as its [`Open`] says, on every record.
struct Opens(Open);

impl Processor<String, i64, String, i64> for Opens {
    fn process(
        &mut self,
        _r: Record<String, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        (self.0)(ctx)?;
        Ok(())
    }
}

/// The error of the first record of a topology whose processor, connected to `store`, opens
/// it as `open` says.
fn failure_of(open: Open, store: &str) -> String {
    let b = StreamsBuilder::new();
    declare_all(&b);
    b.table("tiers", StringSerde, StringSerde, "tiers-store");
    b.stream("in", StringSerde, I64Serde)
        .process("opener", move || Opens(open), &[store])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    driver
        .input_topic("in", StringSerde, I64Serde)
        .try_pipe_input("k".into(), 1)
        .unwrap_err()
        .to_string()
}

#[test]
fn opening_a_store_with_other_types_or_as_another_kind_fails_clearly() {
    let cases: [(Open, &str, &str); 4] = [
        (
            |ctx| ctx.get_state_store::<String, String>("totals").map(drop),
            "totals",
            "store `totals` holds (alloc::string::String, i64) (its Stores builder's key and \
             value types), not (alloc::string::String, alloc::string::String)",
        ),
        (
            |ctx| ctx.get_state_store::<String, i64>("windows").map(drop),
            "windows",
            "store `windows` is a window store, not a key-value store",
        ),
        (
            |ctx| ctx.get_window_store::<String, i64>("totals").map(drop),
            "totals",
            "store `totals` is a key-value store, not a window store",
        ),
        (
            |ctx| ctx.get_state_store::<String, i64>("tiers-store").map(drop),
            "tiers-store",
            "store `tiers-store` was declared by the DSL, without serdes",
        ),
    ];
    for (open, store, want) in cases {
        let got = failure_of(open, store);
        assert!(got.contains(want), "{store}: {got}");
    }
}

/// `Materialized::with_logging_enabled(configs)` gives a DSL store's changelog topic configs, as
/// the Stores builders do; `with_logging_disabled` afterwards drops them with the changelog.
#[test]
fn materialized_with_logging_enabled_gives_the_changelog_its_topic_configs() {
    let configs: BTreeMap<String, String> =
        [("segment.bytes".to_string(), "104857600".to_string())].into();
    let b = StreamsBuilder::new();
    let grouped = b.stream("in", StringSerde, I64Serde).group_by_key();
    grouped
        .count(Materialized::named("logged").with_logging_enabled(configs.clone()))
        .to_stream()
        .to_with("counts", Produced::with(StringSerde, I64Serde));
    grouped
        .count(
            Materialized::named("unlogged")
                .with_logging_enabled(configs.clone())
                .with_logging_disabled(),
        )
        .to_stream()
        .to_with("other-counts", Produced::with(StringSerde, I64Serde));
    let topology = b.build().unwrap();
    assert_eq!(topology.changelog_configs("logged"), Some(&configs));
    assert_eq!(topology.changelog_configs("unlogged"), None);
    let logged: Vec<&String> = topology
        .sub_topologies()
        .iter()
        .flat_map(|s| &s.logged)
        .collect();
    assert!(logged.contains(&&"logged".to_string()), "{logged:?}");
    assert!(!logged.contains(&&"unlogged".to_string()), "{logged:?}");
}
