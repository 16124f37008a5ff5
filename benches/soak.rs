//! Soak (issue 18, case 7): two wordcount instances of one application for an hour at a steady
//! input rate, one of them restarted (SIGTERM, start again) every ten minutes, the other running
//! all along through every rebalance this causes. Every ten seconds it samples each instance's
//! resident memory, open file descriptors and threads; at the end it checks the final counts
//! against the ground truth and prints the figures benches/results/ANALYSIS.md quotes.
//!
//! ```sh
//! cargo build --release --example wordcount
//! RILL_BROKER_PORT=9392 RILL_BROKER_CONTROLLER_PORT=9393 scripts/kafka start
//! RILL_TEST_BOOTSTRAP=127.0.0.1:9392 cargo bench --bench soak
//! ```
//! `RILL_SOAK_SECONDS` (3600), `RILL_SOAK_RATE` (input lines per second, 5000) and
//! `RILL_SOAK_RESTART_SECONDS` (600) change the shape; a line holds 1-5 words of a
//! 2,000-word vocabulary. `RILL_SOAK_MAX_OPEN_FILES` sets both instances'
//! `rocksdb.max.open.files` (unset: the default, every SST file open).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{bootstrap, input_producer, send, stamp};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::ClientConfig;

type Error = Box<dyn std::error::Error + Send + Sync>;

const VOCABULARY: u64 = 2_000;
const PARTITIONS: i32 = 4;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The release build of the wordcount example, next to this bench's own binary.
fn wordcount_binary() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("no target dir")?
        .join("examples")
        .join("wordcount");
    if !bin.exists() {
        return Err(format!(
            "{} is missing: run `cargo build --release --example wordcount` first",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// One sample of a process.
#[derive(Clone, Copy)]
struct Sample {
    /// Seconds since the soak started.
    at: f64,
    rss_mib: f64,
    /// Open file descriptors, and how many of them are RocksDB SST files.
    fds: usize,
    sst_fds: usize,
    threads: usize,
}

/// One wordcount instance: how to start it, and the process while it runs.
struct Instance {
    name: &'static str,
    command: Command,
    child: Option<Child>,
    /// Samples of its current process.
    samples: Vec<Sample>,
    /// RSS (MiB) of each process of this instance when it was stopped.
    rss_at_stop: Vec<f64>,
}

impl Instance {
    fn new(
        name: &'static str,
        binary: &Path,
        app: &str,
        topics: (&str, &str),
        dir: &Path,
    ) -> Result<Self, Error> {
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let mut command = Command::new(binary);
        command
            .args(["--input", topics.0, "--output", topics.1])
            .env("RILL_BOOTSTRAP_SERVERS", bootstrap())
            .env("RILL_APPLICATION_ID", app)
            .env("RILL_STATE_DIR", dir.join(format!("{name}-state")))
            .env("RILL_PARALLELISING_FACTOR", "4")
            .env("RILL_METRICS_ADDR", "off")
            .env("RILL_KAFKA_GROUP_INSTANCE_ID", format!("{app}-{name}"))
            .env("RILL_LOG", "info")
            .envs(
                std::env::var("RILL_SOAK_MAX_OPEN_FILES")
                    .ok()
                    .map(|n| ("RILL_ROCKSDB_MAX_OPEN_FILES", n)),
            )
            .stdout(log.try_clone()?)
            .stderr(log);
        // The service reads every RILL_* variable as a config key and refuses unknown ones.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RILL_SOAK_") {
                command.env_remove(name);
            }
        }
        Ok(Instance {
            name,
            command,
            child: None,
            samples: Vec::new(),
            rss_at_stop: Vec::new(),
        })
    }

    fn start(&mut self) -> Result<(), Error> {
        self.child = Some(self.command.spawn()?);
        Ok(())
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(&mut self) -> Result<(), Error> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(sample) = self.sample_of(child.id(), 0.0) {
            self.rss_at_stop.push(sample.rss_mib);
        }
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("{} exited with {status} on SIGTERM", self.name).into());
        }
        Ok(())
    }

    fn sample_of(&self, pid: u32, at: f64) -> Option<Sample> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        };
        let targets: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()?
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .collect();
        let sst_fds = targets
            .iter()
            .filter(|t| t.extension().is_some_and(|x| x == "sst"))
            .count();
        Some(Sample {
            at,
            rss_mib: field("VmRSS:")? / 1024.0,
            fds: targets.len(),
            sst_fds,
            threads: field("Threads:")? as usize,
        })
    }

    fn sample(&mut self, at: f64) -> Result<(), Error> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait()? {
            return Err(format!("{} stopped by itself: {status}", self.name).into());
        }
        let pid = child.id();
        if let Some(sample) = self.sample_of(pid, at) {
            self.samples.push(sample);
        }
        Ok(())
    }
}

/// Produces `rate` lines per second to `topic` until `stop`; returns the ground truth.
fn produce(
    topic: String,
    rate: u64,
    stop: Arc<AtomicBool>,
) -> Result<(HashMap<String, i64>, u64), Error> {
    let producer = input_producer(&bootstrap(), 20)?;
    let mut truth: HashMap<String, i64> = HashMap::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let tick = Duration::from_millis(100);
    let per_tick = (rate / 10).max(1);
    let started = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::SeqCst) {
        for _ in 0..per_tick {
            let words: Vec<String> = (0..1 + next() % 5)
                .map(|_| format!("w{}", next() % VOCABULARY))
                .collect();
            for w in &words {
                *truth.entry(w.clone()).or_default() += 1;
            }
            send(&producer, &topic, None, words.join(" ").as_bytes())?;
        }
        sent += per_tick;
        let due = started + tick * u32::try_from(sent / per_tick)?;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60))?;
    Ok((truth, sent))
}

/// Reads `topic` until the latest count of every word equals `truth`, or `timeout`.
fn counts_reach(
    topic: &str,
    truth: &HashMap<String, i64>,
    timeout: Duration,
) -> Result<bool, Error> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("soak-reader-{}", stamp()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut latest: HashMap<String, i64> = HashMap::new();
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let word = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let count = m
                .payload()
                .and_then(|v| <[u8; 8]>::try_from(v).ok())
                .map_or(-1, i64::from_be_bytes);
            latest.insert(word, count);
            if latest.len() == truth.len() && latest == *truth {
                return Ok(true);
            }
        }
    }
    let wrong = truth
        .iter()
        .filter(|(w, n)| latest.get(*w) != Some(n))
        .count();
    println!("after {timeout:?}: {wrong} of {} words differ", truth.len());
    Ok(false)
}

fn create_topics(names: &[&str]) -> Result<(), Error> {
    for name in names {
        let status = Command::new("scripts/kafka")
            .args(["admin", "--create", "--topic", name, "--partitions"])
            .arg(PARTITIONS.to_string())
            .env(
                "RILL_BROKER_PORT",
                bootstrap().rsplit(':').next().unwrap_or("9092"),
            )
            .status()?;
        if !status.success() {
            return Err(format!("could not create topic {name}").into());
        }
    }
    Ok(())
}

/// (first, max, last) of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    (
        values.first().copied().unwrap_or(0.0),
        max,
        values.last().copied().unwrap_or(0.0),
    )
}

fn main() -> Result<(), Error> {
    let seconds = setting("RILL_SOAK_SECONDS", 3600);
    let rate = setting("RILL_SOAK_RATE", 5000);
    let restart_every = setting("RILL_SOAK_RESTART_SECONDS", 600);
    let binary = wordcount_binary()?;
    let id = stamp();
    let (input, output, app) = (
        format!("soak-in-{id}"),
        format!("soak-out-{id}"),
        format!("soak-{id}"),
    );
    create_topics(&[&input, &output])?;
    let dir = tempfile::tempdir()?;
    println!(
        "soak: {seconds} s at {rate} lines/s, instance a restarted every {restart_every} s, \
         b never; logs and state under {}",
        dir.path().display()
    );
    let mut a = Instance::new("a", &binary, &app, (&input, &output), dir.path())?;
    let mut b = Instance::new("b", &binary, &app, (&input, &output), dir.path())?;
    a.start()?;
    b.start()?;
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (topic, stop) = (input.clone(), stop.clone());
        std::thread::spawn(move || produce(topic, rate, stop))
    };
    let started = Instant::now();
    let mut next_restart = restart_every;
    let mut restarts = 0;
    let mut last_print = 0u64;
    while started.elapsed().as_secs() < seconds {
        std::thread::sleep(Duration::from_secs(10));
        let at = started.elapsed().as_secs_f64();
        a.sample(at)?;
        b.sample(at)?;
        if at as u64 / 60 > last_print {
            last_print = at as u64 / 60;
            let show = |i: &Instance| {
                i.samples.last().map_or(String::from("-"), |s| {
                    format!(
                        "{:.0} MiB {} fds ({} SST) {} threads",
                        s.rss_mib, s.fds, s.sst_fds, s.threads
                    )
                })
            };
            println!("{:>5.0} s  a: {}  b: {}", at, show(&a), show(&b));
        }
        if at as u64 >= next_restart && (at as u64) < seconds {
            let t = Instant::now();
            a.stop()?;
            a.start()?;
            restarts += 1;
            println!(
                "{at:>5.0} s  restarted a (stopped in {:.1} s)",
                t.elapsed().as_secs_f64()
            );
            next_restart += restart_every;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (truth, lines) = feeder.join().map_err(|_| "the producer panicked")??;
    let t = Instant::now();
    let exact = counts_reach(&output, &truth, Duration::from_secs(600))?;
    let caught_up = t.elapsed();
    a.stop()?;
    b.stop()?;

    // b after its first ten minutes (start-up and first restores done) against the rest.
    let b_warm: Vec<Sample> = b
        .samples
        .iter()
        .filter(|s| s.at >= restart_every as f64)
        .copied()
        .collect();
    let rss: Vec<f64> = b_warm.iter().map(|s| s.rss_mib).collect();
    let fds: Vec<f64> = b_warm.iter().map(|s| s.fds as f64).collect();
    let ssts: Vec<f64> = b_warm.iter().map(|s| s.sst_fds as f64).collect();
    let others: Vec<f64> = b_warm.iter().map(|s| (s.fds - s.sst_fds) as f64).collect();
    let threads: Vec<f64> = b_warm.iter().map(|s| s.threads as f64).collect();
    let (rss0, rss_max, rss_last) = spread(&rss);
    let (fd0, fd_max, fd_last) = spread(&fds);
    let (sst0, sst_max, sst_last) = spread(&ssts);
    let (other0, other_max, other_last) = spread(&others);
    let (th0, th_max, th_last) = spread(&threads);
    println!("--");
    println!(
        "{lines} lines in {seconds} s ({:.0}/s), {restarts} restarts of a; final counts {} \
         ({} words), {:.1} s after the input stopped",
        lines as f64 / seconds as f64,
        if exact { "EXACT" } else { "WRONG" },
        truth.len(),
        caught_up.as_secs_f64()
    );
    println!(
        "b (never restarted), from {restart_every} s on: RSS first {rss0:.0} MiB, max {rss_max:.0}, \
         last {rss_last:.0} ({:+.1}% last vs first); fds first {fd0:.0}, max {fd_max:.0}, last \
         {fd_last:.0} (RocksDB SST files first {sst0:.0}, max {sst_max:.0}, last {sst_last:.0}; \
         the others first {other0:.0}, max {other_max:.0}, last {other_last:.0}); threads first \
         {th0:.0}, max {th_max:.0}, last {th_last:.0}",
        (rss_last / rss0 - 1.0) * 100.0
    );
    // The instantaneous figures swing with each rebalance (b holds all partitions while a is
    // down, half of them otherwise), so growth shows in the peaks of each restart period.
    let periods: Vec<Vec<Sample>> = b_warm
        .chunk_by(|x, y| (x.at as u64) / restart_every == (y.at as u64) / restart_every)
        .map(<[Sample]>::to_vec)
        .collect();
    // A last period cut short by the end (often a single sample) has no peak to compare.
    let full = periods.first().map_or(0, Vec::len);
    let periods: Vec<Vec<Sample>> = periods
        .into_iter()
        .filter(|p| 2 * p.len() >= full)
        .collect();
    let peak = |period: &[Sample], f: fn(&Sample) -> f64| {
        period.iter().map(f).fold(f64::MIN, f64::max).round() as i64
    };
    let peaks = |f: fn(&Sample) -> f64| periods.iter().map(|p| peak(p, f)).collect::<Vec<_>>();
    let rss_peaks = peaks(|s| s.rss_mib);
    println!(
        "b, peaks per {restart_every} s period: RSS (MiB) {rss_peaks:?} ({:+.1}% last vs first); \
         fds {:?}; of them not SST files {:?}; threads {:?}",
        match (rss_peaks.first(), rss_peaks.last()) {
            (Some(&first), Some(&last)) => (last as f64 / first as f64 - 1.0) * 100.0,
            _ => 0.0,
        },
        peaks(|s| s.fds as f64),
        peaks(|s| (s.fds - s.sst_fds) as f64),
        peaks(|s| s.threads as f64),
    );
    println!(
        "a, RSS at each stop (MiB): {:?}",
        a.rss_at_stop
            .iter()
            .map(|r| r.round() as i64)
            .collect::<Vec<_>>()
    );
    if !exact {
        return Err("the final counts are not exact".into());
    }
    Ok(())
}
