//! Measurement: the result records, the systems under test and how they are spawned, /proc
//! sampling of their CPU and memory, and the Kafka helpers the scenarios use.

use super::*;

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub(crate) struct Run {
    pub(crate) ok: bool,
    pub(crate) note: String,
    /// Input records the figure is over.
    pub(crate) records: u64,
    pub(crate) wall_s: f64,
    pub(crate) records_per_s: f64,
    pub(crate) cpu_s: f64,
    pub(crate) cpu_s_per_m: f64,
    pub(crate) peak_rss_mb: f64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
    /// 1-minute load average of the machine when the run started (other work shares the cores).
    #[serde(default)]
    pub(crate) load_avg: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct SystemResult {
    pub(crate) system: String,
    pub(crate) config: String,
    pub(crate) runs: Vec<Run>,
    pub(crate) median: Option<Run>,
    pub(crate) note: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct ScenarioResult {
    pub(crate) scenario: String,
    pub(crate) title: String,
    pub(crate) mode: String,
    pub(crate) date: String,
    pub(crate) machine: String,
    pub(crate) params: BTreeMap<String, String>,
    /// The rill configuration the "rill ÷ system" column divides by.
    pub(crate) reference: String,
    pub(crate) systems: Vec<SystemResult>,
}

pub(crate) fn median(runs: &[Run]) -> Option<Run> {
    let ok: Vec<&Run> = runs.iter().filter(|r| r.ok).collect();
    if ok.is_empty() {
        return None;
    }
    let med = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = ok.iter().map(|r| f(r)).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let med_opt = |f: &dyn Fn(&Run) -> Option<f64>| {
        let mut v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    Some(Run {
        ok: true,
        note: format!("median of {} run(s)", ok.len()),
        records: ok[0].records,
        wall_s: med(&|r| r.wall_s),
        records_per_s: med(&|r| r.records_per_s),
        cpu_s: med(&|r| r.cpu_s),
        cpu_s_per_m: med(&|r| r.cpu_s_per_m),
        peak_rss_mb: med(&|r| r.peak_rss_mb),
        p50_ms: med_opt(&|r| r.p50_ms),
        p99_ms: med_opt(&|r| r.p99_ms),
        max_ms: med_opt(&|r| r.max_ms),
        load_avg: med(&|r| r.load_avg),
    })
}

// ---------------------------------------------------------------------------------------------
// Systems under test.

#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// `set`: extra config, `key=value,...` (passed as RILL_BENCH_SET).
    Rill {
        p: usize,
        threads: Option<usize>,
        set: &'static str,
    },
    Bare {
        /// Loops, each with its own consumer and producer.
        threads: usize,
    },
    Streams {
        threads: usize,
        /// `processing.guarantee=exactly_once_v2`.
        eos: bool,
    },
    ParallelConsumer {
        concurrency: usize,
        /// `KEY` or `UNORDERED` (its `ProcessingOrder`).
        order: &'static str,
    },
    /// S4 only: the orchestrator produces straight to the topic it reads (no system).
    Direct,
}

#[derive(Clone, Debug)]
pub(crate) struct System {
    pub(crate) name: String,
    pub(crate) kind: Kind,
}

impl System {
    pub(crate) fn new(name: &str, kind: Kind) -> Self {
        Self {
            name: name.to_string(),
            kind,
        }
    }
    /// Whether it runs with `processing.guarantee=exactly_once_v2` (its outputs are read
    /// `read_committed`: what a consumer of an exactly-once application sees, and when).
    pub(crate) fn exactly_once(&self) -> bool {
        match &self.kind {
            Kind::Rill { set, .. } => set.contains("processing.guarantee=exactly_once_v2"),
            Kind::Streams { eos, .. } => *eos,
            _ => false,
        }
    }

    pub(crate) fn config(&self) -> String {
        match &self.kind {
            Kind::Rill { p, threads, set } => format!(
                "parallelising.factor={p}, worker.threads={}{}, other settings default",
                threads.map_or("default (cores)".to_string(), |t| t.to_string()),
                if set.is_empty() {
                    String::new()
                } else {
                    format!(", {set}")
                }
            ),
            Kind::Bare { threads } => format!("rdkafka BaseConsumer + ThreadedProducer, {threads} thread(s), each with its own consumer (one group) and producer; rill's producer settings (idempotent, linger 5 ms, lz4) and consumer fetch.wait.max.ms=10, Nagle off"),
            Kind::Streams { threads, eos } => format!(
                "kafka-streams 4.4.0, num.stream.threads={threads}, commit.interval.ms=100{}, other settings default (caching on, changelog on)",
                if *eos { ", processing.guarantee=exactly_once_v2" } else { "" }
            ),
            Kind::ParallelConsumer { concurrency, order } => {
                format!("parallel-consumer-core 0.5.3.3 (kafka-clients 3.9.1), ProcessingOrder.{order}, maxConcurrency={concurrency}, pollAndProduce")
            }
            Kind::Direct => "no system: produce to the output topic and read it back (the measurement's floor)".into(),
        }
    }
}

pub(crate) struct Ctx {
    pub(crate) bootstrap: String,
    pub(crate) peers: PathBuf,
    pub(crate) tmp: PathBuf,
    pub(crate) quick: bool,
}

impl Ctx {
    pub(crate) fn jar(&self, kind: &Kind) -> Option<PathBuf> {
        let name = match kind {
            Kind::Streams { .. } => "kafka-streams",
            Kind::ParallelConsumer { .. } => "parallel-consumer",
            _ => return None,
        };
        Some(
            self.peers
                .join(name)
                .join("target")
                .join(format!("{name}-peer.jar")),
        )
    }

    pub(crate) fn unavailable(&self, sys: &System) -> Option<String> {
        let jar = self.jar(&sys.kind)?;
        if jar.exists() {
            return None;
        }
        let log = self.tmp.join(format!(
            "{}-build.log",
            jar.parent()?.parent()?.file_name()?.to_string_lossy()
        ));
        Some(format!(
            "not run: {} was not built (Maven could not build or resolve it; log: {})",
            jar.display(),
            log.display()
        ))
    }
}

pub(crate) struct Handle {
    pub(crate) child: Child,
    pub(crate) first: Arc<Mutex<Option<(u64, u64)>>>,
}

pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

pub(crate) fn peak_rss_mb(pid: u32) -> f64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

pub(crate) fn spawn(
    ctx: &Ctx,
    sys: &System,
    scenario: &str,
    input: &str,
    output: &str,
    tag: &str,
) -> Handle {
    let state = ctx.tmp.join(format!("state-{tag}"));
    let _ = fs::remove_dir_all(&state);
    let log = fs::File::create(ctx.tmp.join(format!("{tag}.log"))).expect("child log");
    let mut cmd = match &sys.kind {
        Kind::Rill { p, threads, set } => {
            let mut c = Command::new(std::env::current_exe().expect("exe"));
            c.args(["--child", "rill", "--scenario", scenario, "--p"])
                .arg(p.to_string())
                .args(["--bootstrap", &ctx.bootstrap, "--app", tag])
                .args(["--input", input, "--output", output, "--state"])
                .arg(&state);
            if let Some(t) = threads {
                c.arg("--threads").arg(t.to_string());
            }
            // RILL_BENCH_LOG: the child's log filter (RILL_LOG syntax), warnings by default.
            c.env(
                "RILL_LOG",
                std::env::var("RILL_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            );
            // The orchestrator's own RILL_BENCH_SET (a development aid) adds to the system's.
            let extra = std::env::var("RILL_BENCH_SET").unwrap_or_default();
            let all: Vec<&str> = [*set, extra.as_str()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect();
            c.env("RILL_BENCH_SET", all.join(","));
            c
        }
        Kind::Bare { threads } => {
            let mut c = Command::new(std::env::current_exe().expect("exe"));
            c.args(["--child", "bare", "--scenario", scenario])
                .args(["--bootstrap", &ctx.bootstrap, "--app", tag])
                .args(["--input", input, "--output", output])
                .args(["--threads", &threads.to_string()]);
            c
        }
        Kind::Streams { threads, eos } => {
            let mut c = Command::new("java");
            c.arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                .arg("-jar")
                .arg(ctx.jar(&sys.kind).expect("jar"))
                .args([scenario, &ctx.bootstrap, tag, input, output])
                .arg(&state)
                .arg(threads.to_string());
            if *eos {
                c.arg("exactly_once_v2");
            }
            c
        }
        Kind::Direct => unreachable!("nothing to spawn"),
        Kind::ParallelConsumer { concurrency, order } => {
            let mut c = Command::new("java");
            c.arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                .arg("-jar")
                .arg(ctx.jar(&sys.kind).expect("jar"))
                .args([&ctx.bootstrap, tag, input, output])
                .arg(concurrency.to_string())
                .arg(order);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn system under test");
    let pid = child.id();
    let first = Arc::new(Mutex::new(None));
    let stdout = child.stdout.take().expect("stdout");
    let f2 = first.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(t) = line.strip_prefix("FIRST ") {
                let cpu = cpu_ticks(pid).unwrap_or(0);
                if let Ok(t) = t.trim().parse::<u64>() {
                    *f2.lock().unwrap() = Some((t, cpu));
                }
            }
        }
    });
    Handle { child, first }
}

impl Handle {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn create(ctx: &Ctx, topic: &str, partitions: u32) {
    create_topics(
        &client_config(&ctx.bootstrap, &BTreeMap::new()),
        &[(topic.to_string(), partitions)],
        Duration::from_secs(30),
    )
    .expect("create topic");
}

/// A consumer of all of `topic` from the start, by assignment: no group membership, so nothing
/// to rebalance when it is dropped (dropping a subscribed BaseConsumer hung in a rebalance).
/// A consumer of `topic` from the start; `read_committed` for an exactly-once system's outputs.
pub(crate) fn reader(
    ctx: &Ctx,
    topic: &str,
    partitions: u32,
    group: &str,
    read_committed: bool,
) -> BaseConsumer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &ctx.bootstrap)
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("offset");
    }
    c.assign(&tpl).expect("assign");
    c
}

pub(crate) fn high_watermarks(c: &BaseConsumer, topic: &str, partitions: u32) -> u64 {
    (0..partitions as i32)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(5))
                .map_or(0, |(_, h)| h.max(0) as u64)
        })
        .sum()
}
