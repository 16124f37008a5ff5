//! Dispatch throughput: records/s through key hashing and routing to P = 16 sub-task mailboxes,
//! with a topology that drops every record (so the figure is the engine's own cost).
//!
//! `cargo bench --bench dispatch`

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rill::prelude::*;
use rill::runtime::internals::MemorySink;
use rill::runtime::internals::{Dispatch, Engine, EngineConfig};
use rill::topology::{key_hash, range_of, RawRecord};

const RECORDS: u64 = 100_000;

fn records() -> Vec<RawRecord> {
    (0..RECORDS)
        .map(|i| RawRecord {
            key: Some(format!("key-{}", i % 10_000).into_bytes()),
            value: Some(i.to_be_bytes().to_vec()),
            timestamp: 0,
            headers: Headers::new(),
        })
        .collect()
}

fn engine(p: usize) -> Engine {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", BytesSerde, BytesSerde)
        .filter(|_k, _v| false)
        .to("out");
    let config = EngineConfig {
        parallelising_factor: p,
        worker_threads: 2,
        mailbox_capacity: 10_000,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(
        Arc::new(builder.build().expect("topology")),
        config,
        None,
        Arc::new(MemorySink::new()),
        HashMap::new(),
    )
    .expect("engine");
    e.assign("in", 0, rill::runtime::internals::Resume::default())
        .expect("assign");
    e
}

fn bench(c: &mut Criterion) {
    let input = records();
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Throughput::Elements(RECORDS));
    g.sample_size(10);
    g.bench_function("hash_and_range_of_p16", |b| {
        b.iter(|| {
            input
                .iter()
                .map(|r| range_of(key_hash(r.key.as_deref().unwrap_or_default()), 16))
                .sum::<usize>()
        })
    });
    for p in [1usize, 16] {
        g.bench_function(format!("engine_p{p}"), |b| {
            b.iter_batched(
                || (engine(p), input.clone()),
                |(mut e, input)| {
                    for (offset, r) in input.into_iter().enumerate() {
                        let mut r = r;
                        while let Dispatch::Full(back) =
                            e.dispatch("in", 0, offset as u64, r).expect("dispatch")
                        {
                            r = back;
                            std::thread::yield_now();
                        }
                    }
                    assert!(e.wait_idle(Duration::from_secs(60)));
                    e
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
