//! Store writes not caused by a record of the written key (a punctuator that rewrites every key,
//! a downstream write of a window that emit-final released while handling another key's record)
//! land in the range of the key they write: after live splits and merges each key is read by its
//! owner, exactly once, with the right value.

use std::time::Duration;

use rill::prelude::*;
use rill::topology::key_hash;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A key whose routing hash lies in the lower (`upper == false`) or upper half of the hash space.
fn key_in_half(upper: bool) -> String {
    (0..)
        .map(|i| format!("key{i}"))
        .find(|k| (key_hash(k.as_bytes()) >= 1 << 63) == upper)
        .unwrap_or_default()
}

/// Adds each record's value to its key's total and forwards the total; every 10 ms of wall-clock
/// time rounds every total up to a multiple of 10 (a punctuator that rewrites every key, the
/// same way however often it fires).
struct ScaledTotals;

impl Processor<String, i64, String, i64> for ScaledTotals {
    fn init(&mut self, ctx: &mut ProcessorContext<'_, String, i64>) -> Result<(), ProcessError> {
        ctx.schedule(ms(10), PunctuationType::WallClockTime);
        Ok(())
    }

    fn process(
        &mut self,
        record: Record<String, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let key = record
            .key
            .clone()
            .ok_or_else(|| ProcessError::User("no key".into()))?;
        let store = ctx.get_state_store::<String, i64>("totals")?;
        let total = store.get(ctx, &key)?.unwrap_or(0) + record.value;
        store.put(ctx, &key, &total)?;
        ctx.forward(record.with_key_value(Some(key), total));
        Ok(())
    }

    fn punctuate(
        &mut self,
        _kind: PunctuationType,
        _timestamp: i64,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let store = ctx.get_state_store::<String, i64>("totals")?;
        for entry in store.all(ctx)? {
            let (k, v) = entry?;
            store.put(ctx, &k, &((v + 9) / 10 * 10))?;
        }
        Ok(())
    }
}

#[test]
fn a_punctuators_rewrites_stay_with_their_keys_across_a_split_and_a_merge() {
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("totals"),
        StringSerde,
        I64Serde,
    ));
    b.stream("in", StringSerde, I64Serde)
        .process("scaled", || ScaledTotals, &["totals"])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, I64Serde);
    let out = driver.output_topic("out", StringSerde, I64Serde);
    let totals = driver.key_value_store("totals", StringSerde, I64Serde);
    let keys: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
    let upper = keys
        .iter()
        .filter(|k| key_hash(k.as_bytes()) >= 1 << 63)
        .count();
    assert!(upper > 0 && upper < keys.len(), "keys in both halves");
    // Each step: one record per key, then the punctuator; the expected total after the record.
    for (step, p, expected) in [(0, 1, 1), (1, 2, 11), (2, 1, 21)] {
        if step > 0 {
            driver.set_parallelising_factor(p).unwrap();
        }
        for k in &keys {
            input.pipe_input(k.clone(), 1);
        }
        let mut read = out.read_key_values();
        read.sort();
        let mut want: Vec<(String, i64)> = keys.iter().map(|k| (k.clone(), expected)).collect();
        want.sort();
        assert_eq!(read, want, "totals after step {step} at P = {p}");
        // Twice: the first tick after (re)starting the processors only schedules the next.
        driver.advance_wall_clock_time(ms(10)).unwrap();
        driver.advance_wall_clock_time(ms(10)).unwrap();
        // Every key once, in every range together (`range` keeps duplicates of other ranges).
        let stored = totals.range(&"k".to_string(), &"l".to_string());
        let want: Vec<(String, i64)> = {
            let mut w: Vec<(String, i64)> =
                keys.iter().map(|k| (k.clone(), expected + 9)).collect();
            w.sort();
            w
        };
        assert_eq!(
            stored, want,
            "the store after the punctuation of step {step}"
        );
        for k in &keys {
            assert_eq!(totals.get(k), Some(expected + 9), "`{k}` read by its owner");
        }
    }
}

/// Adds up the final counts of each key's windows in a store keyed by the key, forwarding the
/// sum (a downstream write of what emit-final releases).
struct FinalTotals;

impl Processor<Windowed<String>, i64, String, i64> for FinalTotals {
    fn process(
        &mut self,
        record: Record<Windowed<String>, i64>,
        ctx: &mut ProcessorContext<'_, String, i64>,
    ) -> Result<(), ProcessError> {
        let key = record
            .key
            .clone()
            .ok_or_else(|| ProcessError::User("no key".into()))?
            .key;
        let store = ctx.get_state_store::<String, i64>("final-totals")?;
        let total = store.get(ctx, &key)?.unwrap_or(0) + record.value;
        store.put(ctx, &key, &total)?;
        ctx.forward(record.with_key_value(Some(key), total));
        Ok(())
    }
}

#[test]
fn a_window_released_for_another_key_is_written_downstream_in_its_keys_range() {
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("final-totals"),
        StringSerde,
        I64Serde,
    ));
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_with_no_grace(ms(10)))
        .count("counts")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()).with_name("final"))
        .to_stream()
        .process("add-finals", || FinalTotals, &["final-totals"])
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let driver = TestDriver::new(b.build().unwrap()).unwrap();
    let input = driver.input_topic("in", StringSerde, StringSerde);
    let out = driver.output_topic("out", StringSerde, I64Serde);
    let totals = driver.key_value_store("final-totals", StringSerde, I64Serde);
    let (lo, hi) = (key_in_half(false), key_in_half(true));
    let at = |k: &String, t: i64| input.pipe_input_at(k.clone(), "x".into(), t);
    at(&lo, 1);
    at(&hi, 2);
    // `lo`'s record closes [0,10) of both keys: `hi`'s final count is written while handling it.
    at(&lo, 10);
    let mut read = out.read_key_values();
    read.sort();
    let mut want = vec![(lo.clone(), 1), (hi.clone(), 1)];
    want.sort();
    assert_eq!(read, want, "[0,10) of both keys, once");
    driver.set_parallelising_factor(2).unwrap();
    at(&hi, 12);
    at(&lo, 13);
    // Each range closes its keys' [10,20) (`lo`'s by the partition's time); ranges run apart.
    at(&hi, 20);
    at(&lo, 20);
    let mut read = out.read_key_values();
    read.sort();
    let mut want = vec![(hi.clone(), 2), (lo.clone(), 3)];
    want.sort();
    assert_eq!(
        read, want,
        "[10,20) of each key, added to the [0,10) total its owner holds"
    );
    driver.set_parallelising_factor(1).unwrap();
    let stored = totals.range(&String::new(), &"~".to_string());
    let mut want = vec![(lo.clone(), 3), (hi.clone(), 2)];
    want.sort();
    assert_eq!(stored, want, "each key once after the merge");
    // Both keys' [20,30) close with `lo`'s record, in the one range again.
    at(&lo, 30);
    let mut read = out.read_key_values();
    read.sort();
    let mut want = vec![(lo.clone(), 4), (hi.clone(), 3)];
    want.sort();
    assert_eq!(read, want, "[20,30) of both keys after the merge");
    assert_eq!(totals.get(&hi), Some(3));
}
