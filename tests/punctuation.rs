//! Punctuation schedules (Kafka Streams' `schedule` returning a `Cancellable`): scheduled from
//! `init` and from `process`, each cancellable through its handle, told apart by
//! `ctx.punctuation()` when several fire.

use std::time::Duration;

use rill::prelude::*;

/// Forwards `a@t` / `b@t` for its two `init` schedules (10 ms and 25 ms of stream time), and a
/// one-shot `c@t` for a schedule a `start-c` record makes (it cancels itself when it fires); a
/// `cancel-a` record cancels the 10 ms schedule.
#[derive(Default)]
struct Reminders {
    a: Option<Cancellable>,
    b: Option<Cancellable>,
    c: Option<Cancellable>,
}

impl Processor<String, String, String, String> for Reminders {
    fn init(&mut self, ctx: &mut ProcessorContext<'_, String, String>) -> Result<(), ProcessError> {
        self.a = Some(ctx.schedule(Duration::from_millis(10), PunctuationType::StreamTime));
        self.b = Some(ctx.schedule(Duration::from_millis(25), PunctuationType::StreamTime));
        Ok(())
    }

    fn process(
        &mut self,
        record: Record<String, String>,
        ctx: &mut ProcessorContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        match record.value.as_str() {
            "cancel-a" => {
                if let Some(a) = &self.a {
                    a.cancel();
                }
            }
            "start-c" => {
                self.c = Some(ctx.schedule(Duration::from_millis(5), PunctuationType::StreamTime))
            }
            _ => {}
        }
        Ok(())
    }

    fn punctuate(
        &mut self,
        _kind: PunctuationType,
        timestamp: i64,
        ctx: &mut ProcessorContext<'_, String, String>,
    ) -> Result<(), ProcessError> {
        let fired = ctx.punctuation();
        let name = if fired == self.a {
            "a"
        } else if fired == self.b {
            "b"
        } else if fired.is_some() && fired == self.c {
            if let Some(c) = self.c.take() {
                c.cancel();
            }
            "c"
        } else {
            return Err(ProcessError::User(
                format!("unknown schedule {fired:?}").into(),
            ));
        };
        ctx.forward(
            Record::new("k".to_string(), format!("{name}@{timestamp}")).with_timestamp(timestamp),
        );
        Ok(())
    }
}

fn fired(records: &[(&str, i64)]) -> Vec<String> {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .process("reminders", Reminders::default, &[])
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let d = TestDriver::new(b.build().unwrap()).unwrap();
    let input = d.input_topic("in", StringSerde, StringSerde);
    for (v, t) in records {
        input.pipe_input_at("k".into(), v.to_string(), *t);
    }
    d.output_topic("out", StringSerde, StringSerde)
        .read_values()
}

#[test]
fn schedules_are_told_apart_and_cancelled_by_their_handles() {
    let out = fired(&[
        ("x", 0),
        ("x", 20),
        ("cancel-a", 30),
        ("x", 50),
        ("start-c", 51),
        ("x", 57),
        ("x", 70),
    ]);
    // Stream-time punctuations fire at multiples of their interval once stream time passes
    // them, after the record that moved it (Kafka Streams: process, then punctuate), once per
    // record however many intervals it passed: a is due at 10 and fires at 20; the record at
    // 30 cancels it before its punctuation; b fires at 30 (due 25) and 50; c, scheduled at 51,
    // is due at 55 and fires once, at 57.
    assert_eq!(out, ["a@20", "b@30", "b@50", "c@57"]);
}
