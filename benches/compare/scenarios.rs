//! The scenarios S1-S6 (S4 at two rates): their inputs, one throughput or latency run, and a scenario's runs over
//! every system.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Sc {
    S1,
    S2,
    S3,
    S4,
    /// S4 at a tenth of the rate, where the machine is not saturated.
    S4Low,
    S5,
    S6,
}

/// S5: window size and grace (ms), and how far event time advances per input record (records
/// per ms).
pub(crate) const S5_WINDOW_MS: i64 = 60_000;
pub(crate) const S5_GRACE_MS: i64 = 10_000;
const S5_RECORDS_PER_MS: i64 = 4;
/// S5: keys whose records close every window (one per key range of P = 8 in each partition).
const S5_CLOSERS: usize = 8;

impl Sc {
    pub(crate) fn id(self) -> &'static str {
        match self {
            Sc::S1 => "s1",
            Sc::S2 => "s2",
            Sc::S3 => "s3",
            Sc::S4 => "s4",
            Sc::S4Low => "s4-2k",
            Sc::S5 => "s5",
            Sc::S6 => "s6",
        }
    }
    pub(crate) fn title(self) -> &'static str {
        match self {
            Sc::S1 => "S1 I/O-bound: a 0-5 ms sleep per record, 1 partition",
            Sc::S2 => "S2 CPU-bound stateful: count by key, 4 partitions",
            Sc::S3 => "S3 stateless filter + map to a sink, 4 partitions",
            Sc::S4 => "S4 latency at a fixed 20k records/s (S3's topology)",
            Sc::S4Low => {
                "S4 latency at a fixed 2k records/s (S3's topology, an unsaturated machine)"
            }
            Sc::S5 => "S5 windowed count: 60 s tumbling windows, emit final, 4 partitions",
            Sc::S6 => {
                "S6 stream-table join: orders left-joined with a customer table, 4 partitions"
            }
        }
    }
    pub(crate) fn systems(self) -> Vec<System> {
        let rill = |name: &str, p, threads| {
            System::new(
                name,
                Kind::Rill {
                    p,
                    threads,
                    set: "",
                },
            )
        };
        let streams = |name: &str, eos| System::new(name, Kind::Streams { threads: 4, eos });
        let rill_eos = |name: &str| {
            System::new(
                name,
                Kind::Rill {
                    p: 1,
                    threads: None,
                    set: "processing.guarantee=exactly_once_v2",
                },
            )
        };
        match self {
            Sc::S1 => {
                let rill_async = |name: &str, p, set| {
                    System::new(
                        name,
                        Kind::Rill {
                            p,
                            threads: None,
                            set,
                        },
                    )
                };
                let pc = |name: &str, concurrency, order| {
                    System::new(name, Kind::ParallelConsumer { concurrency, order })
                };
                vec![
                    rill("rill P=1", 1, Some(64)),
                    rill("rill P=16", 16, Some(64)),
                    rill("rill P=64", 64, Some(64)),
                    rill_async(
                        "rill async P=1, in flight 64",
                        1,
                        "bench.async=true,async.max.in.flight=64",
                    ),
                    rill_async(
                        "rill async P=1, in flight 1000",
                        1,
                        "bench.async=true,async.max.in.flight=1000",
                    ),
                    rill_async(
                        "rill async P=16, in flight 64",
                        16,
                        "bench.async=true,async.max.in.flight=64",
                    ),
                    rill_async(
                        "rill async P=16, in flight 1000",
                        16,
                        "bench.async=true,async.max.in.flight=1000",
                    ),
                    rill_async(
                        "rill async unordered P=1, in flight 1000",
                        1,
                        "bench.async=true,async.max.in.flight=1000,processing.order=unordered",
                    ),
                    System::new(
                        "Kafka Streams",
                        Kind::Streams {
                            threads: 1,
                            eos: false,
                        },
                    ),
                    pc("Parallel Consumer", 64, "KEY"),
                    pc("Parallel Consumer KEY, 256", 256, "KEY"),
                    pc("Parallel Consumer KEY, 1000", 1000, "KEY"),
                    pc("Parallel Consumer UNORDERED, 64", 64, "UNORDERED"),
                    pc("Parallel Consumer UNORDERED, 256", 256, "UNORDERED"),
                    pc("Parallel Consumer UNORDERED, 1000", 1000, "UNORDERED"),
                ]
            }
            Sc::S2 => vec![
                rill("rill P=1", 1, None),
                streams("Kafka Streams", false),
                rill_eos("rill P=1 EOS"),
                streams("Kafka Streams EOS", true),
            ],
            Sc::S5 | Sc::S6 => vec![rill("rill P=1", 1, None), streams("Kafka Streams", false)],
            Sc::S3 => vec![
                System::new("bare rdkafka loop", Kind::Bare { threads: 1 }),
                // One loop per input partition: the fastest hand-written program here.
                System::new("bare rdkafka loop, 4 threads", Kind::Bare { threads: 4 }),
                rill("rill P=1", 1, None),
                streams("Kafka Streams", false),
            ],
            Sc::S4 | Sc::S4Low => vec![
                System::new("broker round trip", Kind::Direct),
                System::new("bare rdkafka loop", Kind::Bare { threads: 1 }),
                rill("rill P=1", 1, None),
                // librdkafka leaves Nagle's algorithm on by default; rill does not turn it off
                // (yet). This variant shows what that costs in latency.
                System::new(
                    "rill P=1, Nagle off",
                    Kind::Rill {
                        p: 1,
                        threads: None,
                        set: "kafka.socket.nagle.disable=true",
                    },
                ),
                streams("Kafka Streams", false),
                rill_eos("rill P=1 EOS"),
                streams("Kafka Streams EOS", true),
            ],
        }
    }
    /// Whether the scenario measures latency at a fixed rate (S4) rather than throughput.
    pub(crate) fn is_latency(self) -> bool {
        matches!(self, Sc::S4 | Sc::S4Low)
    }
    pub(crate) fn reference(self) -> &'static str {
        match self {
            Sc::S1 => "rill P=64",
            _ => "rill P=1",
        }
    }
}

/// The input of one scenario, produced once.
pub(crate) struct Input {
    pub(crate) topic: String,
    pub(crate) partitions: u32,
    pub(crate) records: u64,
    /// S1, S3: output records expected. S2: the number of keys. S5: keys x windows.
    pub(crate) expected: u64,
    /// S2: the final count of each key. S5: of each (key, window), at key * windows + window.
    pub(crate) truth: Vec<i64>,
    /// S5: the start of the first window and the number of windows.
    pub(crate) windows: (i64, usize),
    pub(crate) params: BTreeMap<String, String>,
}

pub(crate) fn produce_input(ctx: &Ctx, sc: Sc, stamp: u64) -> Input {
    let topic = format!("bench-{}-in-{stamp}", sc.id());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ sc as u64);
    let mut params = BTreeMap::new();
    let p = input_producer(&ctx.bootstrap, 20).expect("producer");
    let input = match sc {
        Sc::S1 => {
            let n = if ctx.quick {
                2_000
            } else {
                std::env::var("RILL_BENCH_S1_RECORDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(10_000)
            };
            create(ctx, &topic, 1);
            let mut total_us = 0;
            for i in 0..n {
                let us = rng.below(5_001);
                total_us += us;
                let v = format!("{us} payload-{i:08}-{}", "x".repeat(40));
                send(
                    &p,
                    &topic,
                    Some(format!("k{i:05}").as_bytes()),
                    v.as_bytes(),
                )
                .expect("send");
            }
            params.insert("records".into(), n.to_string());
            params.insert("distinct keys".into(), n.to_string());
            params.insert(
                "sleep per record".into(),
                "uniform 0-5000 us, carried in the value".into(),
            );
            params.insert(
                "sum of sleeps".into(),
                format!("{:.1} s", total_us as f64 / 1e6),
            );
            Input {
                topic: topic.clone(),
                partitions: 1,
                records: n,
                expected: n,
                truth: vec![],
                windows: (0, 0),
                params,
            }
        }
        Sc::S2 => {
            let (n, keys) = if ctx.quick {
                (400_000u64, 100_000u64)
            } else {
                (2_000_000, 100_000)
            };
            create(ctx, &topic, 4);
            let mut truth = vec![0i64; keys as usize];
            for i in 0..n {
                let k = rng.below(keys);
                truth[k as usize] += 1;
                send(
                    &p,
                    &topic,
                    Some(format!("key-{k:06}").as_bytes()),
                    format!("v{i}").as_bytes(),
                )
                .expect("send");
            }
            params.insert("records".into(), n.to_string());
            params.insert("keys".into(), format!("{keys} (uniform random)"));
            Input {
                topic: topic.clone(),
                partitions: 4,
                records: n,
                expected: keys,
                truth,
                windows: (0, 0),
                params,
            }
        }
        Sc::S5 => s5_input(ctx, &topic, &p, &mut rng, &mut params),
        Sc::S3 => {
            let n = if ctx.quick { 400_000u64 } else { 2_000_000 };
            create(ctx, &topic, 4);
            let mut pass = 0;
            for i in 0..n {
                let v = words_value(&mut rng, 0);
                pass += passes(&v) as u64;
                send(
                    &p,
                    &topic,
                    Some(format!("key-{:05}", i % 10_000).as_bytes()),
                    v.as_bytes(),
                )
                .expect("send");
            }
            params.insert("records".into(), n.to_string());
            params.insert("records passing the filter".into(), pass.to_string());
            Input {
                topic: topic.clone(),
                partitions: 4,
                records: n,
                expected: pass,
                truth: vec![],
                windows: (0, 0),
                params,
            }
        }
        Sc::S6 => s6_input(ctx, &topic, &p, &mut rng, &mut params),
        Sc::S4 | Sc::S4Low => unreachable!("S4 produces during each run"),
    };
    p.flush(Duration::from_secs(120)).expect("flush input");
    input
}

/// S5's input: `n` clicks of `keys` users whose event time advances by 1 ms every
/// [`S5_RECORDS_PER_MS`] records, 10% of them up to 5 s late (within grace, so every system and
/// every P counts them: lateness never depends on how stream time is kept), then one record per
/// partition and key range at a far later time that closes every window. Event time starts two
/// hours back, inside the broker's timestamp bounds and the topic's retention.
fn s5_input(
    ctx: &Ctx,
    topic: &str,
    p: &common::producer::InputProducer,
    rng: &mut Rng,
    params: &mut BTreeMap<String, String>,
) -> Input {
    let (n, keys) = if ctx.quick {
        (400_000u64, 10_000u64)
    } else {
        (2_000_000, 10_000)
    };
    create(ctx, topic, 4);
    let now = now_us() as i64 / 1000;
    let base = now - 7_200_000 - (now - 7_200_000).rem_euclid(S5_WINDOW_MS);
    let last = base + n as i64 / S5_RECORDS_PER_MS;
    let windows = ((last - base) / S5_WINDOW_MS + 1) as usize;
    let mut truth = vec![0i64; keys as usize * windows];
    for i in 0..n {
        let k = rng.below(keys);
        let late = if rng.below(10) == 0 {
            rng.below(5_001) as i64
        } else {
            0
        };
        let ts = (base + i as i64 / S5_RECORDS_PER_MS - late).max(base);
        truth[k as usize * windows + ((ts - base) / S5_WINDOW_MS) as usize] += 1;
        let key = format!("key-{k:05}");
        let record = BaseRecord::<[u8], [u8]>::to(topic)
            .key(key.as_bytes())
            .payload(b"click".as_slice())
            .timestamp(ts);
        common::producer::send_record(p, record).expect("send");
    }
    let closers = closer_keys();
    for partition in 0..4 {
        for key in &closers {
            let record = BaseRecord::<[u8], [u8]>::to(topic)
                .key(key.as_bytes())
                .payload(b"close".as_slice())
                .partition(partition)
                .timestamp(last + 1_000_000);
            common::producer::send_record(p, record).expect("send");
        }
    }
    params.insert("records".into(), n.to_string());
    params.insert("keys".into(), format!("{keys} (uniform random)"));
    params.insert(
        "windows".into(),
        format!(
            "tumbling {} s, grace {} s, {windows} per key; final counts only (suppress until the window closes)",
            S5_WINDOW_MS / 1000,
            S5_GRACE_MS / 1000
        ),
    );
    params.insert(
        "event time".into(),
        format!(
            "+1 ms per {S5_RECORDS_PER_MS} records; 10% of records up to 5 s late (within grace)"
        ),
    );
    let expected = truth.iter().filter(|&&t| t > 0).count() as u64;
    Input {
        topic: topic.to_string(),
        partitions: 4,
        records: n,
        expected: truth.len() as u64,
        truth,
        windows: (base, windows),
        params: {
            params.insert("windows with records".into(), expected.to_string());
            std::mem::take(params)
        },
    }
}

/// S6's inputs: the customer table `<topic>-table` (every customer once, produced first), then
/// `n` orders of random customers on `topic`. Both systems take the two topics in timestamp
/// order (`max.task.idle.ms`), so every order meets its customer; the join is a left join all
/// the same, so that the run ends when every order gave its output whatever happens.
fn s6_input(
    ctx: &Ctx,
    topic: &str,
    p: &common::producer::InputProducer,
    rng: &mut Rng,
    params: &mut BTreeMap<String, String>,
) -> Input {
    let (n, customers) = if ctx.quick {
        (400_000u64, 10_000u64)
    } else {
        (2_000_000, 10_000)
    };
    let table = format!("{topic}-table");
    create(ctx, &table, 4);
    create(ctx, topic, 4);
    for c in 0..customers {
        let tier = ["bronze", "silver", "gold", "platinum"][(c % 4) as usize];
        send(
            p,
            &table,
            Some(format!("cust-{c:05}").as_bytes()),
            tier.as_bytes(),
        )
        .expect("send");
    }
    p.flush(Duration::from_secs(120)).expect("flush the table");
    for i in 0..n {
        let c = rng.below(customers);
        let amount = format!("{}.{:02}", i % 1000, i % 100);
        send(
            p,
            topic,
            Some(format!("cust-{c:05}").as_bytes()),
            amount.as_bytes(),
        )
        .expect("send");
    }
    params.insert("orders".into(), n.to_string());
    params.insert(
        "customers".into(),
        format!("{customers}, in the table topic before the first order"),
    );
    params.insert(
        "join".into(),
        "left join of each order with its customer's tier; output value `amount|tier`".into(),
    );
    Input {
        topic: topic.to_string(),
        partitions: 4,
        records: n,
        expected: n,
        truth: vec![],
        windows: (0, 0),
        params: std::mem::take(params),
    }
}

/// One key per key range of P = [`S5_CLOSERS`] (so of every smaller power of two too).
fn closer_keys() -> Vec<String> {
    let mut by_range = BTreeMap::new();
    for i in 0.. {
        let k = format!("close-{i}");
        by_range
            .entry(rill::topology::range_of(
                rill::topology::key_hash(k.as_bytes()),
                S5_CLOSERS,
            ))
            .or_insert(k);
        if by_range.len() == S5_CLOSERS {
            break;
        }
    }
    by_range.into_values().collect()
}

/// Where an S5 output key `key-NNNNN@<window start>` sits in the truth; `None` for the closers.
pub(crate) fn s5_index(key: &[u8], (base, windows): (i64, usize)) -> Option<usize> {
    let (user, start) = std::str::from_utf8(key).ok()?.split_once('@')?;
    let k: usize = user.strip_prefix("key-")?.parse().ok()?;
    let w = (start.parse::<i64>().ok()? - base) / S5_WINDOW_MS;
    Some(k * windows + usize::try_from(w).ok().filter(|&w| w < windows)?)
}

/// One throughput run (S1-S3, S5).
pub(crate) fn throughput_run(ctx: &Ctx, sc: Sc, sys: &System, input: &Input, tag: &str) -> Run {
    let output = format!("{tag}-out");
    create(ctx, &output, input.partitions);
    let watch = reader(
        ctx,
        &output,
        input.partitions,
        &format!("{tag}-reader"),
        sys.exactly_once(),
    );
    if sc == Sc::S1 {
        // Let the reader find the new topic's leader and start fetching before the child runs:
        // otherwise its first fetch waits for a metadata refresh (~250 ms, longer than a run).
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_millis(1000) {
            let _ = watch.poll(Duration::from_millis(10));
        }
    }
    let mut h = spawn(ctx, sys, sc.id(), &input.topic, &output, tag);
    let timeout = Duration::from_secs(match (sc, ctx.quick) {
        (Sc::S1, true) => 90,
        (Sc::S1, false) => 180,
        (_, true) => 300,
        (_, false) => 900,
    });
    let start = Instant::now();
    let mut latest = vec![0i64; input.truth.len()];
    // Keys that never occur are final from the start (count 0, no output).
    let mut final_keys = input.truth.iter().filter(|&&t| t == 0).count() as u64;
    let mut fail = None;
    let mut outputs = 0u64;
    loop {
        if start.elapsed() > timeout {
            fail = Some(format!("timed out after {} s", timeout.as_secs()));
            break;
        }
        if h.exited() {
            fail = Some(format!("exited early (log: {tag}.log)"));
            break;
        }
        if sc == Sc::S2 || sc == Sc::S5 {
            // Read every count update; done when every key's (S5: window's) latest count is
            // final.
            let mut polled = 0;
            while polled < 10_000 {
                let Some(Ok(m)) = watch.poll(Duration::from_millis(10)) else {
                    break;
                };
                polled += 1;
                let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                    continue;
                };
                let idx = if sc == Sc::S5 {
                    s5_index(k, input.windows)
                } else {
                    std::str::from_utf8(&k[4..])
                        .ok()
                        .and_then(|s| s.parse::<usize>().ok())
                };
                let (Some(idx), Ok(b)) = (idx, <[u8; 8]>::try_from(v)) else {
                    continue;
                };
                let n = i64::from_be_bytes(b);
                let (was, want) = (latest[idx], input.truth[idx]);
                latest[idx] = n;
                if was != want && n == want {
                    final_keys += 1;
                } else if was == want && n != want {
                    final_keys -= 1;
                }
            }
            if final_keys == input.expected {
                break;
            }
        } else if sc == Sc::S1 {
            // S1's runs take tens of ms: count records as they arrive (the reader's fetch
            // returns as soon as there is data), not by polling watermarks every 20 ms.
            while outputs < input.expected {
                let Some(Ok(_)) = watch.poll(Duration::from_millis(1)) else {
                    break;
                };
                outputs += 1;
            }
            if outputs >= input.expected {
                break;
            }
        } else {
            if high_watermarks(&watch, &output, input.partitions) >= input.expected {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let t_done = now_us();
    let pid = h.pid();
    let cpu_done = cpu_ticks(pid).unwrap_or(0);
    let rss = peak_rss_mb(pid);
    let first = *h.first.lock().unwrap();
    h.kill();
    let _ = fs::remove_dir_all(ctx.tmp.join(format!("state-{tag}")));
    if let Some(note) = fail {
        return Run {
            note,
            peak_rss_mb: rss,
            ..Run::default()
        };
    }
    let Some((t_first, cpu_first)) = first else {
        return Run {
            note: "no FIRST line from the child".into(),
            ..Run::default()
        };
    };
    let wall = (t_done.saturating_sub(t_first)) as f64 / 1e6;
    let cpu = cpu_done.saturating_sub(cpu_first) as f64 / TICKS_PER_S;
    Run {
        ok: true,
        note: String::new(),
        records: input.records,
        wall_s: wall,
        records_per_s: input.records as f64 / wall,
        cpu_s: cpu,
        cpu_s_per_m: cpu / (input.records as f64 / 1e6),
        peak_rss_mb: rss,
        ..Run::default()
    }
}

pub(crate) fn percentile(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

/// One latency run (S4): prime, then produce at a fixed rate and time each output record.
pub(crate) fn latency_run(ctx: &Ctx, sys: &System, tag: &str, rate: u64, secs: u64) -> Run {
    // Direct: no system in between; the orchestrator's own produce-to-read floor.
    let direct = matches!(sys.kind, Kind::Direct);
    let output = format!("{tag}-out");
    let input = if direct {
        output.clone()
    } else {
        format!("{tag}-in")
    };
    create(ctx, &output, 4);
    if !direct {
        create(ctx, &input, 4);
    }
    // (produce time, latency) in microseconds.
    let latencies = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let primed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let rd = reader(
        ctx,
        &output,
        4,
        &format!("{tag}-reader"),
        sys.exactly_once(),
    );
    let (l2, p2, s2) = (latencies.clone(), primed.clone(), stop.clone());
    let out2 = output.clone();
    let reader_thread = std::thread::spawn(move || {
        let _ = &out2;
        while !s2.load(Ordering::Relaxed) {
            let Some(Ok(m)) = rd.poll(Duration::from_millis(50)) else {
                continue;
            };
            let now = now_us();
            let ts = m
                .payload()
                .and_then(|v| std::str::from_utf8(v.get(..16)?).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
            if ts == 0 {
                p2.fetch_add(1, Ordering::Relaxed);
            } else {
                l2.lock().unwrap().push((ts, now.saturating_sub(ts)));
            }
        }
    });
    let mut h = (!direct).then(|| spawn(ctx, sys, "s4", &input, &output, tag));
    let p = input_producer(&ctx.bootstrap, 0).expect("producer");
    let mut rng = Rng(0xC0FF_EE00_D15E_A5E5);
    let mut prime_pass = 0;
    for i in 0..400 {
        let v = words_value(&mut rng, 0);
        prime_pass += passes(&v) as u64;
        send(
            &p,
            &input,
            Some(format!("key-{:05}", i % 10_000).as_bytes()),
            v.as_bytes(),
        )
        .expect("send");
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    let start = Instant::now();
    let mut fail = None;
    while primed.load(Ordering::Relaxed) < prime_pass {
        if start.elapsed() > Duration::from_secs(120) || h.as_mut().is_some_and(Handle::exited) {
            fail = Some("never became ready (priming records did not come through)".to_string());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut expected = 0u64;
    let (mut cpu0, mut t0) = (0, Instant::now());
    if fail.is_none() {
        std::thread::sleep(Duration::from_secs(2));
        cpu0 = h.as_ref().and_then(|h| cpu_ticks(h.pid())).unwrap_or(0);
        t0 = Instant::now();
        let total = rate * secs;
        let mut sent = 0u64;
        while sent < total {
            let due = ((t0.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
            while sent < due {
                let v = words_value(&mut rng, now_us());
                expected += passes(&v) as u64;
                send(
                    &p,
                    &input,
                    Some(format!("key-{:05}", sent % 10_000).as_bytes()),
                    v.as_bytes(),
                )
                .expect("send");
                sent += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        p.flush(Duration::from_secs(10)).expect("flush");
        let end = Instant::now();
        while (latencies.lock().unwrap().len() as u64) < expected
            && end.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let (mut cpu, mut rss) = (0.0, 0.0);
    if let Some(h) = h {
        let pid = h.pid();
        cpu = cpu_ticks(pid).unwrap_or(0).saturating_sub(cpu0) as f64 / TICKS_PER_S;
        rss = peak_rss_mb(pid);
        h.kill();
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader_thread.join();
    let _ = fs::remove_dir_all(ctx.tmp.join(format!("state-{tag}")));
    if let Some(note) = fail {
        return Run {
            note,
            ..Run::default()
        };
    }
    let mut timed = latencies.lock().unwrap().clone();
    // The median latency per 2 s of input, to tell a steady delay from a backlog.
    timed.sort_unstable();
    if let Some(&(t0, _)) = timed.first() {
        let mut line = String::from("p50 ms per 2 s of input:");
        for chunk in timed.chunk_by(|a, b| (a.0 - t0) / 2_000_000 == (b.0 - t0) / 2_000_000) {
            let mut l: Vec<u64> = chunk.iter().map(|x| x.1).collect();
            l.sort_unstable();
            line.push_str(&format!(" {:.0}", l[l.len() / 2] as f64 / 1000.0));
        }
        eprint!("\n    {line}\n    ");
    }
    let mut lat: Vec<u64> = timed.iter().map(|x| x.1).collect();
    lat.sort_unstable();
    let got = lat.len() as u64;
    if got == 0 {
        return Run {
            note: "no output".into(),
            ..Run::default()
        };
    }
    let records = rate * secs;
    Run {
        ok: got >= expected,
        note: if got < expected {
            format!("only {got} of {expected} outputs within 60 s after the input ended")
        } else {
            String::new()
        },
        records,
        wall_s: wall,
        records_per_s: records as f64 / secs as f64,
        cpu_s: cpu,
        cpu_s_per_m: cpu / (records as f64 / 1e6),
        peak_rss_mb: rss,
        p50_ms: Some(percentile(&lat, 0.50)),
        p99_ms: Some(percentile(&lat, 0.99)),
        max_ms: Some(percentile(&lat, 1.0)),
        ..Run::default()
    }
}

/// Writes back what the previous run left dirty in the page cache (its state directory, the
/// broker's logs): its writeback would otherwise stall the broker's disk during the next
/// system's run and count against that system. How long it took.
fn settle() -> Duration {
    let started = Instant::now();
    if let Err(e) = Command::new("sync").status() {
        eprintln!("bench: sync failed: {e}");
    }
    started.elapsed()
}

pub(crate) fn load_avg() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn machine() -> String {
    let cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    let mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo");
    let java = sh("java -version 2>&1 | head -1");
    format!(
        "{} cores ({}), {mem} RAM; Apache Kafka 4.4.0 single-node KRaft broker on the same machine (scripts/kafka); {java}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu.trim()
    )
}

pub(crate) fn run_scenario(ctx: &Ctx, sc: Sc, runs: usize) -> ScenarioResult {
    let stamp = now_us();
    // RILL_BENCH_SYSTEMS: the systems to run, `;`-separated (names contain commas); `=name`
    // picks that name exactly, anything else every name containing it (development aid).
    let only = std::env::var("RILL_BENCH_SYSTEMS").unwrap_or_default();
    let picked = |name: &str| {
        only.split(';')
            .map(str::trim)
            .any(|o| match o.strip_prefix('=') {
                Some(exact) => name == exact,
                None => name.contains(o),
            })
    };
    let systems: Vec<System> = sc
        .systems()
        .into_iter()
        .filter(|s| only.is_empty() || picked(&s.name))
        .collect();
    let mut results: Vec<SystemResult> = systems
        .iter()
        .map(|s| SystemResult {
            system: s.name.clone(),
            config: s.config(),
            runs: vec![],
            median: None,
            note: ctx.unavailable(s).unwrap_or_default(),
        })
        .collect();
    let rate = if sc == Sc::S4Low { 2_000u64 } else { 20_000 };
    let secs = if ctx.quick { 10 } else { 20 };
    let mut params = BTreeMap::new();
    let input = if sc.is_latency() {
        params.insert("input rate".into(), format!("{rate} records/s"));
        params.insert("measured for".into(), format!("{secs} s per run"));
        params.insert(
            "latency".into(),
            "output received by the orchestrator minus the produce time carried in the value"
                .into(),
        );
        None
    } else {
        eprintln!("[{}] producing input...", sc.id());
        let i = produce_input(ctx, sc, stamp);
        params.extend(i.params.clone());
        Some(i)
    };
    let warmup = !ctx.quick;
    params.insert(
        "runs".into(),
        format!(
            "{runs} per system, alternating{}",
            if warmup {
                ", after one warm-up round"
            } else {
                ", no warm-up"
            }
        ),
    );
    for round in 0..runs + warmup as usize {
        for (i, sys) in systems.iter().enumerate() {
            if !results[i].note.is_empty() {
                continue;
            }
            let tag = format!(
                "bench-{}-{}-r{round}-{stamp}",
                sc.id(),
                sys.name
                    .chars()
                    .filter_map(|c| match c {
                        'a'..='z' | 'A'..='Z' | '0'..='9' => Some(c.to_ascii_lowercase()),
                        ' ' | '=' | '-' => Some('-'),
                        _ => None,
                    })
                    .collect::<String>()
            );
            eprint!("[{}] round {round} {:<20} ", sc.id(), sys.name);
            let settled = settle();
            let load_avg = load_avg();
            let mut run = match &input {
                Some(input) => throughput_run(ctx, sc, sys, input, &tag),
                None => latency_run(ctx, sys, &tag, rate, secs),
            };
            run.load_avg = load_avg;
            eprintln!(
                "{} {:>10.0} rec/s  cpu {:>6.2} s/M  rss {:>6.0} MB  p50 {:?} p99 {:?} load {:.1} \
                 sync {:.0} ms {}",
                if run.ok { "ok  " } else { "FAIL" },
                run.records_per_s,
                run.cpu_s_per_m,
                run.peak_rss_mb,
                run.p50_ms,
                run.p99_ms,
                run.load_avg,
                settled.as_secs_f64() * 1e3,
                run.note
            );
            if round >= warmup as usize {
                results[i].runs.push(run);
            }
        }
    }
    for r in &mut results {
        r.median = median(&r.runs);
    }
    ScenarioResult {
        scenario: sc.id().into(),
        title: sc.title().into(),
        mode: if ctx.quick { "quick" } else { "full" }.into(),
        date: sh("date -u +%Y-%m-%dT%H:%MZ"),
        machine: machine(),
        params,
        reference: sc.reference().into(),
        systems: results,
    }
}
