//! The child processes the orchestrator runs as systems under test: the rill runner and the bare
//! rdkafka consume-and-produce loop (this binary with `--child rill|bare`).

use super::*;

pub(crate) static FIRST: AtomicBool = AtomicBool::new(false);

pub(crate) fn first_seen() {
    if !FIRST.load(Ordering::Relaxed) && !FIRST.swap(true, Ordering::SeqCst) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "FIRST {}", now_us());
        let _ = out.flush();
    }
}

pub(crate) fn sleep_of(v: &str) -> u64 {
    v.split(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn arg_map(args: &[String]) -> BTreeMap<String, String> {
    args.chunks(2)
        .filter_map(|c| match c {
            [k, v] => Some((k.trim_start_matches("--").to_string(), v.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn child_rill(a: &BTreeMap<String, String>) {
    let (input, output) = (&a["input"], &a["output"]);
    let set = std::env::var("RILL_BENCH_SET").unwrap_or_default();
    // `bench.async=true` (not a rill key): S1's sleep awaited in an async stage.
    let asynchronous = set.split(',').any(|kv| kv.trim() == "bench.async=true");
    let builder = StreamsBuilder::new();
    let s = builder
        .stream(input, StringSerde, StringSerde)
        .peek(|_, _| first_seen());
    match a["scenario"].as_str() {
        "s1" if asynchronous => s
            .map_values_async(|v: String| async move {
                io_call(Duration::from_micros(sleep_of(&v))).await;
                Ok(v)
            })
            .to_with(output, Produced::with(StringSerde, StringSerde)),
        "s1" => s
            .map_values(|v: String| {
                std::thread::sleep(Duration::from_micros(sleep_of(&v)));
                v
            })
            .to_with(output, Produced::with(StringSerde, StringSerde)),
        "s2" => s.group_by_key().count("counts").to_stream().to(output),
        "s5" => s
            .group_by_key()
            .windowed_by(TimeWindows::of_size_and_grace(
                Duration::from_millis(S5_WINDOW_MS as u64),
                Duration::from_millis(S5_GRACE_MS as u64),
            ))
            .count("counts")
            .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
            .to_stream()
            .flat_map(|k: Option<Windowed<String>>, n: i64| {
                k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
            })
            .to_with(output, Produced::with(StringSerde, I64Serde)),
        "s6" => {
            let table = builder.table(
                &format!("{input}-table"),
                StringSerde,
                StringSerde,
                "customers",
            );
            s.left_join(&table, |amount: String, tier: Option<String>| {
                format!("{amount}|{}", tier.as_deref().unwrap_or("none"))
            })
            .to_with(output, Produced::with(StringSerde, StringSerde))
        }
        _ => s
            .filter(|_, v: &String| passes(v))
            .map_values(|v: String| v.to_ascii_uppercase())
            .to_with(output, Produced::with(StringSerde, StringSerde)),
    }
    let mut cfg = ConfigBuilder::new()
        .set("application.id", &a["app"])
        .set("bootstrap.servers", &a["bootstrap"])
        .set("parallelising.factor", &a["p"])
        .set("state.dir", &a["state"])
        .set("metrics.addr", "off");
    if let Some(t) = a.get("threads") {
        cfg = cfg.set("worker.threads", t);
    }
    for kv in set.split(',') {
        if let Some((k, v)) = kv.split_once('=').filter(|(k, _)| !k.starts_with("bench.")) {
            cfg = cfg.set(k.trim(), v.trim());
        }
    }
    let config = cfg.build().expect("rill config");
    // To stderr: the run's log under benches/results/tmp (stdout talks to the orchestrator).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = Runtime::new(builder.build().expect("topology"), config).expect("runtime");
    let running = runtime.start().expect("start");
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if running.is_finished() {
            eprintln!("rill runtime stopped");
            std::process::exit(1);
        }
    }
}

/// The ceiling: consume, filter + map, produce, with rill's producer settings; `--threads N`
/// runs N such loops, each with its own consumer (one group: the partitions are shared out) and
/// its own producer.
pub(crate) fn child_bare(a: &BTreeMap<String, String>) {
    let threads: usize = a.get("threads").and_then(|t| t.parse().ok()).unwrap_or(1);
    let loops: Vec<_> = (0..threads)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || bare_loop(&a))
        })
        .collect();
    for l in loops {
        let _ = l.join();
    }
}

fn bare_loop(a: &BTreeMap<String, String>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &a["bootstrap"])
        .set("group.id", &a["app"])
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("fetch.wait.max.ms", "10")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("consumer");
    consumer
        .subscribe(&[a["input"].as_str()])
        .expect("subscribe");
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &a["bootstrap"])
        .set("enable.idempotence", "true")
        .set(
            "linger.ms",
            std::env::var("RILL_BENCH_BARE_LINGER").unwrap_or("5".into()),
        )
        .set("compression.type", "lz4")
        .set("partitioner", "murmur2_random")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("producer");
    let output = a["output"].as_str();
    loop {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        first_seen();
        let Some(v) = m.payload_view::<str>().and_then(Result::ok) else {
            continue;
        };
        if !passes(v) {
            continue;
        }
        let up = v.to_ascii_uppercase();
        let mut r = BaseRecord::to(output).payload(up.as_str());
        if let Some(k) = m.key() {
            r = r.key(k);
        }
        while let Err((_, back)) = producer.send(r) {
            r = back;
            producer.poll(Duration::from_millis(1));
        }
    }
}

/// S1's simulated I/O call for async stages: ready `d` after it starts, to within the OS timer's
/// slack. Not `tokio::time::sleep`: that rounds up to the next millisecond tick (+0.5-1 ms per
/// call, ~+45 % on S1's 2.5 ms average), which no real I/O completion would add.
pub(crate) fn io_call(d: Duration) -> IoCall {
    IoCall(Instant::now() + d)
}

/// A pending simulated I/O call (see [`io_call`]).
pub(crate) struct IoCall(Instant);

impl std::future::Future for IoCall {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if Instant::now() >= self.0 {
            return std::task::Poll::Ready(());
        }
        // A spurious re-poll arms again: the extra wake is harmless.
        io_timer().arm(self.0, cx.waker().clone());
        std::task::Poll::Pending
    }
}

/// One thread that wakes simulated I/O calls at their deadlines.
struct IoTimer {
    /// Armed calls, earliest first. The timer thread waits on `armed` until the earliest is due
    /// or an earlier one is armed (it is notified then).
    queue: Mutex<std::collections::BinaryHeap<std::cmp::Reverse<Armed>>>,
    armed: std::sync::Condvar,
}

struct Armed(Instant, u64, std::task::Waker);

impl PartialEq for Armed {
    fn eq(&self, o: &Self) -> bool {
        (self.0, self.1) == (o.0, o.1)
    }
}
impl Eq for Armed {}
impl PartialOrd for Armed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Armed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(o.0, o.1))
    }
}

fn io_timer() -> &'static IoTimer {
    static TIMER: std::sync::OnceLock<&'static IoTimer> = std::sync::OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static IoTimer = Box::leak(Box::new(IoTimer {
            queue: Mutex::new(std::collections::BinaryHeap::new()),
            armed: std::sync::Condvar::new(),
        }));
        std::thread::spawn(move || t.run());
        t
    })
}

impl IoTimer {
    fn arm(&self, at: Instant, waker: std::task::Waker) {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let mut q = self.queue.lock().unwrap();
        let earliest = q.peek().is_none_or(|e| at < e.0 .0);
        q.push(std::cmp::Reverse(Armed(
            at,
            SEQ.fetch_add(1, Ordering::Relaxed),
            waker,
        )));
        if earliest {
            self.armed.notify_one();
        }
    }

    fn run(&self) {
        let mut q = self.queue.lock().unwrap();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while q.peek().is_some_and(|e| e.0 .0 <= now) {
                due.push(q.pop().unwrap().0 .2);
            }
            if !due.is_empty() {
                drop(q);
                due.into_iter().for_each(std::task::Waker::wake);
                q = self.queue.lock().unwrap();
                continue;
            }
            q = match q.peek().map(|e| e.0 .0 - now) {
                Some(wait) => self.armed.wait_timeout(q, wait).unwrap().0,
                None => self.armed.wait(q).unwrap(),
            };
        }
    }
}
