//! `process_values` (Kafka Streams' `processValues`): a processor that may change values but
//! never keys, so no repartition topic follows it; state and punctuation as with `process`.

use std::time::Duration;

use rill::prelude::*;

/// Drops a value its key already had (a de-duplication), upper-cases the rest, and counts what
/// it dropped in store `seen`.
struct Dedup;

impl FixedKeyProcessor<String, String, String> for Dedup {
    fn process(
        &mut self,
        record: FixedKeyRecord<String, String>,
        ctx: &mut FixedKeyContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key().cloned() else {
            return Ok(());
        };
        let seen = ctx.get_state_store::<String, String>("seen")?;
        if seen.get(ctx, &key)?.as_deref() == Some(record.value().as_str()) {
            return Ok(());
        }
        seen.put(ctx, &key, record.value())?;
        let upper = record.value().to_uppercase();
        ctx.forward(record.with_value(upper));
        Ok(())
    }
}

/// `in` de-duplicated per key, joined with table `tiers`, and counted per key.
fn topology(use_process: bool) -> Result<Topology, TopologyError> {
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("seen"),
        StringSerde,
        StringSerde,
    ));
    let tiers = b.table("tiers", StringSerde, StringSerde, "tiers-store");
    let input = b.stream("in", StringSerde, StringSerde);
    let deduped: KStream<String, String> = if use_process {
        // The same logic through `process`, which may change keys: a repartition follows.
        struct Keyed;
        impl Processor<String, String, String, String> for Keyed {
            fn process(
                &mut self,
                record: Record<String, String>,
                ctx: &mut ProcessorContext<'_, String, String>,
            ) -> Result<(), ProcessError> {
                ctx.forward(record);
                Ok(())
            }
        }
        input.process("dedup", || Keyed, &["seen"])
    } else {
        input.process_values("dedup", || Dedup, &["seen"])
    };
    deduped
        .join(&tiers, |v: String, tier: String| format!("{v}|{tier}"))
        .to_with("joined", Produced::with(StringSerde, StringSerde));
    deduped.group_by_key().count("counts");
    b.build()
}

#[test]
fn process_values_needs_no_repartition_topic_where_process_does() {
    assert!(
        topology(false).unwrap().internal_topics().is_empty(),
        "process_values keeps the key: the join and the count stay in the source's sub-topology"
    );
    // `process` may change keys: the join and the grouping need a repartition topic, whose
    // serdes this topology does not give.
    let Err(err) = topology(true) else {
        panic!("a repartition without serdes must not build");
    };
    assert!(matches!(err, TopologyError::MissingSerde { .. }), "{err}");
}

#[test]
fn process_values_changes_values_with_state_at_every_factor() {
    for p in [1, 3] {
        let driver = TestDriver::builder(topology(false).unwrap())
            .parallelising_factor(p)
            .build()
            .unwrap();
        let tiers = driver.input_topic("tiers", StringSerde, StringSerde);
        let input = driver.input_topic("in", StringSerde, StringSerde);
        let joined = driver.output_topic("joined", StringSerde, StringSerde);
        tiers.pipe_input("alice".into(), "gold".into());
        tiers.pipe_input("bob".into(), "silver".into());
        for (k, v) in [
            ("alice", "a"),
            ("alice", "a"),
            ("bob", "b"),
            ("alice", "c"),
            ("bob", "b"),
        ] {
            input.pipe_input(k.into(), v.into());
        }
        let mut got = joined.read_key_values();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("alice".to_string(), "A|gold".to_string()),
                ("alice".to_string(), "C|gold".to_string()),
                ("bob".to_string(), "B|silver".to_string()),
            ],
            "P = {p}"
        );
        let counts = driver.key_value_store("counts", StringSerde, I64Serde);
        assert_eq!(counts.get(&"alice".to_string()), Some(2), "P = {p}");
        assert_eq!(counts.get(&"bob".to_string()), Some(1), "P = {p}");
    }
}

/// Punctuation reaches a fixed-key processor too (scheduled from `init`).
#[test]
fn a_fixed_key_processor_punctuates() {
    struct Ticks;
    impl FixedKeyProcessor<String, String, String> for Ticks {
        fn init(
            &mut self,
            ctx: &mut FixedKeyContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            ctx.schedule(Duration::from_millis(10), PunctuationType::StreamTime);
            Ok(())
        }
        fn process(
            &mut self,
            record: FixedKeyRecord<String, String>,
            ctx: &mut FixedKeyContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            ctx.forward(record);
            Ok(())
        }
        fn punctuate(
            &mut self,
            _kind: PunctuationType,
            _timestamp: i64,
            ctx: &mut FixedKeyContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            let ticks = ctx.get_state_store::<String, i64>("tick-count")?;
            let n = ticks.get(ctx, &"all".to_string())?.unwrap_or(0);
            ticks.put(ctx, &"all".to_string(), &(n + 1))?;
            Ok(())
        }
    }
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("tick-count"),
        StringSerde,
        I64Serde,
    ));
    b.stream("in", StringSerde, StringSerde)
        .process_values("ticks", || Ticks, &["tick-count"])
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    input.pipe_input_at("k".into(), "v".into(), 0);
    input.pipe_input_at("k".into(), "v".into(), 35);
    let ticks = driver.key_value_store("tick-count", StringSerde, I64Serde);
    // Once as stream time jumps from 0 to 35: punctuation does not catch up on the intervals
    // it skipped (as in Kafka Streams).
    assert_eq!(ticks.get(&"all".to_string()), Some(1));
    assert_eq!(
        driver
            .output_topic("out", StringSerde, StringSerde)
            .read_values(),
        vec!["v".to_string(), "v".to_string()]
    );
}
