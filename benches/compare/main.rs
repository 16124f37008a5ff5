//! Side-by-side benchmarks: rill, Kafka Streams 4.4.0, Confluent Parallel Consumer and a bare
//! rdkafka loop, on the same local broker, the same input and the same measurement.
//!
//! Run it through `scripts/bench [--quick]`, which builds the Java peers (benches/peers/), starts
//! the broker (`scripts/kafka`) and calls `cargo bench --workspace --bench compare -- ARGS`.
//!
//! Arguments: `--quick` (small inputs, one run, no warm-up), `--scenarios s1,s3` (a subset),
//! `--runs N`, `--report-only` (regenerate BENCHMARKS.md and the SVG from benches/results/*.json).
//! Environment: `RILL_TEST_BOOTSTRAP` (the broker, as for the broker tests), `RILL_BENCH_PEERS` (where the peer jars are,
//! default benches/peers), `RILL_BENCH_SET` (`key=value,...` extra rill config for experiments,
//! added to every rill system's own), `RILL_BENCH_SYSTEMS` (the systems to run, `;`-separated:
//! `=name` picks that name, anything else every name containing it), `RILL_BENCH_S1_RECORDS` (S1's
//! input, 10,000 records by default; more for steady-state development runs), `RILL_BENCH_LOG` (the rill child's log filter, `RILL_LOG` syntax, `warn`
//! by default; its log is `benches/results/tmp/<run>.log`), `RILL_BENCH_BARE_LINGER` (the bare
//! loop's producer `linger.ms`, 5 as rill's by default; for latency experiments).
//! Before each run the orchestrator `sync`s, so that what the previous run left dirty in the
//! page cache is not written back during the next one.
//!
//! Every system under test runs as a child process (this binary with `--child rill|bare`, or
//! `java -jar` of a peer) with a fresh consumer group. The orchestrator measures from outside:
//! - throughput (S1-S3): from the first record the child consumed (it prints `FIRST <micros>`)
//!   to the moment the expected output is on the output topic (S1: the orchestrator has read the
//!   expected count of output records, since a run takes tens of ms; S3: the output topic's high
//!   watermarks, polled every 20 ms, reach the expected count; S2: every key's latest count read back equals the truth;
//!   S5: every (key, window)'s final count read back equals the truth);
//! - CPU: utime + stime of the child (/proc/PID/stat) over that same interval;
//! - peak RSS: VmHWM of the child (/proc/PID/status), read just before it is killed;
//! - latency (S4): the produce time is the first 16 digits of each value; latency is the time the
//!   orchestrator's reader receives the output record minus that.

#[path = "../common/mod.rs"]
mod common;

mod chart;
mod child;
mod measure;
mod report;
mod scenarios;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, Runtime};
use serde::{Deserialize, Serialize};

use chart::*;
use child::*;
use common::{input_producer, send};
use measure::*;
use report::*;
use scenarios::*;

pub(crate) const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Linux's USER_HZ: the unit of utime/stime in /proc/PID/stat.
pub(crate) const TICKS_PER_S: f64 = 100.0;
pub(crate) const WORDS: [&str; 16] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi",
];

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// xorshift64*: deterministic input contents without a rand dependency.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// S3/S4 value: 16-digit produce time (micros; 0 where unused) and five words.
pub(crate) fn words_value(rng: &mut Rng, ts: u64) -> String {
    let mut v = format!("{ts:016}");
    for _ in 0..5 {
        v.push(' ');
        v.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    v
}

/// The S3/S4 filter, the same in every system.
pub(crate) fn passes(v: &str) -> bool {
    !v.contains("omicron")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let a = arg_map(&args[i + 2..]);
        match args.get(i + 1).map(String::as_str) {
            Some("rill") => child_rill(&a),
            Some("bare") => child_bare(&a),
            other => panic!("unknown child {other:?}"),
        }
        return;
    }
    let results_dir = Path::new(ROOT).join("benches").join("results");
    let tmp = results_dir.join("tmp");
    fs::create_dir_all(&tmp).expect("results dir");
    if args.iter().any(|a| a == "--report-only") {
        report(&results_dir);
        return;
    }
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let quick = args.iter().any(|a| a == "--quick");
    let runs = value("--runs")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 });
    let wanted = value("--scenarios").unwrap_or_else(|| "s1,s2,s3,s4,s4-2k,s5,s6".into());
    let ctx = Ctx {
        bootstrap: common::bootstrap(),
        peers: std::env::var("RILL_BENCH_PEERS").map_or_else(
            |_| Path::new(ROOT).join("benches").join("peers"),
            PathBuf::from,
        ),
        tmp,
        quick,
    };
    for sc in [Sc::S1, Sc::S2, Sc::S3, Sc::S4, Sc::S4Low, Sc::S5, Sc::S6] {
        if !wanted.split(',').any(|w| w.trim() == sc.id()) {
            continue;
        }
        let result = run_scenario(&ctx, sc, runs);
        let json = serde_json::to_string_pretty(&result).expect("json");
        fs::write(results_dir.join(format!("{}.json", sc.id())), json).expect("write json");
        report(&results_dir);
    }
}
