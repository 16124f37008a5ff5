//! Exactness scenarios on the TestDriver: every record applied to state once, no matter how the
//! topology feeds its ranges (several inputs, several repartition topics, punctuations).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use rill::prelude::*;

/// Two input topics merged, re-keyed and counted: the repartitioned records of `a` and `c`
/// carry the same upstream (partition, range, offset), yet are different records.
#[test]
fn merged_inputs_are_counted_once_each_through_a_repartition_topic() {
    let builder = StreamsBuilder::new();
    let a = builder.stream("a", StringSerde, StringSerde);
    let c = builder.stream("c", StringSerde, StringSerde);
    a.merge(&c)
        .group_by(
            |_k, v: &String| v.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("counts");
    for p in [1, 4] {
        let driver = TestDriver::builder(builder.build().unwrap())
            .parallelising_factor(p)
            .build()
            .unwrap();
        let (ta, tc) = (
            driver.input_topic("a", StringSerde, StringSerde),
            driver.input_topic("c", StringSerde, StringSerde),
        );
        for i in 0..10 {
            ta.pipe_input(format!("k{i}"), "word".to_string());
            tc.pipe_input(format!("k{i}"), "word".to_string());
        }
        let counts = driver.key_value_store("counts", StringSerde, I64Serde);
        assert_eq!(counts.get(&"word".to_string()), Some(20), "P = {p}");
    }
}

/// One upstream sub-topology writes two repartition topics that one downstream sub-topology
/// reads: origins of the two topics interleave and must be de-duplicated per topic.
#[test]
fn two_repartition_topics_into_one_range_are_counted_once_each() {
    let builder = StreamsBuilder::new();
    let s = builder.stream("in", StringSerde, StringSerde);
    let by_value = s
        .select_key(|_k, v: &String| v.clone())
        .repartition(Repartitioned::with(StringSerde, StringSerde).with_name("by-value"));
    let again = s
        .select_key(|_k, v: &String| v.clone())
        .repartition(Repartitioned::with(StringSerde, StringSerde).with_name("by-value-2"));
    by_value.merge(&again).group_by_key().count("counts");
    let driver = TestDriver::builder(builder.build().unwrap())
        .parallelising_factor(2)
        .build()
        .unwrap();
    let t = driver.input_topic("in", StringSerde, StringSerde);
    for i in 0..10 {
        t.pipe_input(format!("k{i}"), "w".to_string());
    }
    let counts = driver.key_value_store("counts", StringSerde, I64Serde);
    assert_eq!(counts.get(&"w".to_string()), Some(20));
}

/// Wall-clock punctuation that forwards into a repartition topic: its outputs must be counted.
#[test]
fn wall_clock_punctuation_outputs_pass_through_a_repartition_topic() {
    static TICKS: AtomicI64 = AtomicI64::new(0);
    struct Ticker;
    impl Processor<String, String, String, String> for Ticker {
        fn init(
            &mut self,
            ctx: &mut ProcessorContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            ctx.schedule(Duration::from_millis(10), PunctuationType::WallClockTime);
            Ok(())
        }
        fn process(
            &mut self,
            record: Record<String, String>,
            ctx: &mut ProcessorContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            ctx.forward(record);
            Ok(())
        }
        fn punctuate(
            &mut self,
            _kind: PunctuationType,
            timestamp: i64,
            ctx: &mut ProcessorContext<'_, String, String>,
        ) -> Result<(), ProcessError> {
            TICKS.fetch_add(1, Ordering::SeqCst);
            ctx.forward(
                Record::new("tick".to_string(), "tick".to_string()).with_timestamp(timestamp),
            );
            Ok(())
        }
    }
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .process("ticker", || Ticker, &[])
        .group_by(
            |_k, v: &String| v.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("counts");
    let driver = TestDriver::builder(builder.build().unwrap())
        .build()
        .unwrap();
    let t = driver.input_topic("in", StringSerde, StringSerde);
    for i in 0..5 {
        t.pipe_input(format!("k{i}"), "x".to_string());
    }
    for _ in 0..4 {
        driver
            .advance_wall_clock_time(Duration::from_millis(10))
            .unwrap();
    }
    let counts = driver.key_value_store("counts", StringSerde, I64Serde);
    assert_eq!(counts.get(&"x".to_string()), Some(5));
    let ticks = TICKS.load(Ordering::SeqCst);
    assert!(ticks >= 2, "the punctuation fired {ticks} times");
    assert_eq!(counts.get(&"tick".to_string()), Some(ticks));
}

/// Emits the stream time at each stream-time punctuation (every 10 ms of event time).
struct Clock;

impl Processor<String, String, String, String> for Clock {
    fn init(&mut self, ctx: &mut ProcessorContext<'_, String, String>) -> Result<(), ProcessError> {
        ctx.schedule(Duration::from_millis(10), PunctuationType::StreamTime);
        Ok(())
    }
    fn process(
        &mut self,
        _record: Record<String, String>,
        _ctx: &mut ProcessorContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        Ok(())
    }
    fn punctuate(
        &mut self,
        _kind: PunctuationType,
        timestamp: i64,
        ctx: &mut ProcessorContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        ctx.forward(Record::new("tick".to_string(), timestamp.to_string()));
        Ok(())
    }
}

fn clock_topology() -> Topology {
    let builder = StreamsBuilder::new();
    builder.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("unused"),
        StringSerde,
        StringSerde,
    ));
    builder
        .stream("in", StringSerde, StringSerde)
        .process("clock", || Clock, &["unused"])
        .to_with("ticks", Produced::with(StringSerde, StringSerde));
    builder.build().unwrap()
}

/// Issue 10, item 8: stream time is committed with the range, so a restart fires stream-time
/// punctuations at the same records as an uninterrupted run.
#[test]
fn stream_time_punctuation_fires_at_the_same_records_across_a_restart() {
    let times = [5i64, 12, 13, 27, 31, 44, 45, 58];
    let uninterrupted: Vec<String> = {
        let driver = TestDriver::new(clock_topology()).unwrap();
        let input = driver.input_topic("in", StringSerde, StringSerde);
        for t in times {
            input.pipe_input_at("k".into(), "v".into(), t);
        }
        driver
            .output_topic("ticks", StringSerde, StringSerde)
            .read_values()
    };
    assert!(!uninterrupted.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let mut restarted = Vec::new();
    for part in [&times[..3], &times[3..]] {
        let driver = TestDriver::builder(clock_topology())
            .state_dir(dir.path())
            .build()
            .unwrap();
        let input = driver.input_topic("in", StringSerde, StringSerde);
        for &t in part {
            input.pipe_input_at("k".into(), "v".into(), t);
        }
        restarted.extend(
            driver
                .output_topic("ticks", StringSerde, StringSerde)
                .read_values(),
        );
        driver.close().unwrap();
    }
    assert_eq!(restarted, uninterrupted);
}
