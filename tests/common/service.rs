//! The wordcount example run as a child process, as an operator runs the service.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{long, Cluster, Input};

/// The wordcount example binary, built next to the tests by `cargo test`.
pub fn wordcount_binary() -> PathBuf {
    example_binary("wordcount")
}

/// The binary of example `name`, built next to the tests by `cargo test`.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds the examples",
        bin.display()
    );
    bin
}

/// One wordcount instance (or of another example: see `binary`): its settings, state dir and
/// log file.
pub struct Service {
    /// The example binary it runs (default: wordcount).
    pub binary: PathBuf,
    /// Environment of the process (RILL_* settings).
    pub env: Vec<(String, String)>,
    /// Arguments (topics).
    pub args: Vec<String>,
    /// Where its stderr goes (appended across restarts).
    pub log: PathBuf,
    /// Its state dir.
    pub state_dir: PathBuf,
}

impl Service {
    /// An instance of application `app` reading `input` and writing `output`, with state and log
    /// under `dir`; `name` tells instances apart (static membership id, file names).
    pub fn new(app: &str, name: &str, input: &str, output: &str, dir: &Path) -> Self {
        Self::on(&Cluster::test(), app, name, input, output, dir)
    }

    /// [`Service::new`] against `cluster`: its `kafka` settings become `RILL_KAFKA_*` variables.
    pub fn on(
        cluster: &Cluster,
        app: &str,
        name: &str,
        input: &str,
        output: &str,
        dir: &Path,
    ) -> Self {
        let state_dir = dir.join(format!("{name}-state"));
        let mut service = Service {
            binary: wordcount_binary(),
            args: vec![
                "--input".into(),
                input.into(),
                "--output".into(),
                output.into(),
            ],
            env: [
                ("RILL_BOOTSTRAP_SERVERS", cluster.bootstrap.clone()),
                ("RILL_APPLICATION_ID", app.to_string()),
                ("RILL_STATE_DIR", state_dir.display().to_string()),
                ("RILL_PARALLELISING_FACTOR", "4".into()),
                ("RILL_COMMIT_INTERVAL_MS", "200".into()),
                ("RILL_METRICS_ADDR", "off".into()),
                // Static membership: a restarted instance takes its partitions back at once.
                ("RILL_KAFKA_GROUP_INSTANCE_ID", format!("{app}-{name}")),
                ("RILL_KAFKA_SESSION_TIMEOUT_MS", "6000".into()),
                // Tests read the per-partition assignment and restore lines (debug).
                (
                    "RILL_LOG",
                    "info,rill_runtime::kafka::rebalance=debug,rill_runtime::engine::restore=debug"
                        .into(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            log: dir.join(format!("{name}.log")),
            state_dir,
        };
        for (k, v) in &cluster.kafka {
            service.set(&format!("kafka.{k}"), v);
        }
        service
    }

    /// Sets config `key` through its `RILL_*` variable (replacing an earlier value).
    pub fn set(&mut self, key: &str, value: &str) {
        let var = format!("RILL_{}", key.to_ascii_uppercase().replace('.', "_"));
        self.env.retain(|(k, _)| *k != var);
        self.env.push((var, value.to_string()));
    }

    /// Serves the HTTP endpoint on a free local address (`metrics.addr`); returns the address.
    pub fn serve_http(&mut self) -> std::net::SocketAddr {
        let addr = free_addr();
        self.set("metrics.addr", &addr.to_string());
        addr
    }

    /// Removes config `key`'s `RILL_*` variable.
    pub fn unset(&mut self, key: &str) {
        let var = format!("RILL_{}", key.to_ascii_uppercase().replace('.', "_"));
        self.env.retain(|(k, _)| *k != var);
    }

    /// The whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Starts the process; it is killed when the handle drops (a failing test leaves no
    /// service running).
    pub fn spawn(&self) -> ServiceChild {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        Command::new(&self.binary)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .map(ServiceChild)
            .expect("spawn the example")
    }

    /// Starts the process and SIGKILLs and restarts it `kills` times, each after `min_ms` plus
    /// up to `spread_ms` more (random); panics if it exits by itself. Returns the last start.
    pub fn spawn_and_kill(
        &self,
        rng: &mut Rng,
        kills: usize,
        min_ms: u64,
        spread_ms: u64,
    ) -> ServiceChild {
        let mut child = self.spawn();
        for k in 0..kills {
            std::thread::sleep(Duration::from_millis(min_ms + rng.next() % spread_ms));
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the service exited by itself ({status}) before kill {k}; log:\n{}",
                    self.log_tail(40)
                );
            }
            kill(&mut child);
            child = self.spawn();
        }
        child
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut lines: Vec<&str> = text.lines().rev().take(n).collect();
        lines.reverse();
        lines.join("\n")
    }

    /// Changelog records its restores read, summed over its log (the `restored from
    /// changelogs` lines).
    pub fn restored_records(&self) -> u64 {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("restored from changelogs"))
            .filter_map(|l| {
                let plain = strip_ansi(l);
                let at = plain.find(" records=")? + " records=".len();
                plain[at..].split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum()
    }
}

/// `s` without terminal colour codes.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A running service process, SIGKILLed and reaped on drop unless it has exited already.
pub struct ServiceChild(pub Child);

impl std::ops::Deref for ServiceChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ServiceChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ServiceChild {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Ends a child with SIGTERM and returns whether it exited 0.
pub fn terminate(child: &mut Child) -> bool {
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .is_ok_and(|s| s.success());
    sent && child.wait().is_ok_and(|s| s.success())
}

/// Ends a child with SIGKILL.
pub fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
}

/// A small deterministic generator (xorshift), seeded from the clock and printed for replay.
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock; prints the seed under `what`.
    pub fn from_clock(what: &str) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        println!("{what} seed {seed}");
        Rng(seed)
    }

    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The words of input line `n` (1 to 4 of 20 words), the same on every call.
pub fn line(n: usize) -> Vec<&'static str> {
    const WORDS: [&str; 20] = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
        "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon",
    ];
    (0..(n % 4 + 1))
        .map(|j| WORDS[(n * 5 + j * 7) % WORDS.len()])
        .collect()
}

/// Input lines in `batches` batches of `per_batch`, with the word counts they add up to.
pub fn lines(batches: usize, per_batch: usize) -> (Vec<Vec<Input>>, HashMap<String, i64>) {
    let mut truth: HashMap<String, i64> = HashMap::new();
    let batches = (0..batches)
        .map(|b| {
            (0..per_batch)
                .map(|i| {
                    let words = line(b * per_batch + i);
                    for w in &words {
                        *truth.entry(w.to_string()).or_default() += 1;
                    }
                    (None, words.join(" ").into_bytes())
                })
                .collect()
        })
        .collect();
    (batches, truth)
}

/// Produces the batches to `topic` of the test broker, `pause` apart, on a thread.
pub fn feed(topic: &str, batches: Vec<Vec<Input>>, pause: Duration) -> std::thread::JoinHandle<()> {
    feed_to(&Cluster::test(), topic, batches, pause)
}

/// Produces the batches to `topic` of `cluster`, `pause` apart, on a thread.
pub fn feed_to(
    cluster: &Cluster,
    topic: &str,
    batches: Vec<Vec<Input>>,
    pause: Duration,
) -> std::thread::JoinHandle<()> {
    let (cluster, topic) = (cluster.clone(), topic.to_string());
    std::thread::spawn(move || {
        for batch in batches {
            cluster.produce(&topic, &batch);
            std::thread::sleep(pause);
        }
    })
}

/// Waits until `output` holds exactly `truth` (latest count per word) or `timeout` passes;
/// returns the counts seen last.
pub fn final_counts(
    output: &str,
    truth: &HashMap<String, i64>,
    timeout: Duration,
) -> HashMap<String, i64> {
    final_counts_on(&Cluster::test(), output, truth, timeout)
}

/// [`final_counts`] on `cluster`.
pub fn final_counts_on(
    cluster: &Cluster,
    output: &str,
    truth: &HashMap<String, i64>,
    timeout: Duration,
) -> HashMap<String, i64> {
    let expected: HashMap<Vec<u8>, Vec<u8>> = truth
        .iter()
        .map(|(w, n)| (w.as_bytes().to_vec(), n.to_be_bytes().to_vec()))
        .collect();
    // Stop early only on the exact answer; an over-count never matches and times out.
    let (latest, _) = cluster.read_until(output, timeout, |l| *l == expected);
    latest
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), long(v)))
        .collect()
}

/// A free local address for a child's `metrics.addr` (bound and released: a small race that
/// only a concurrent bind of the same port would lose).
pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
}

/// Whether `/ready` at `addr` answers 200 within `within`.
pub fn ready_within(addr: std::net::SocketAddr, within: Duration) -> bool {
    eventually(within, || {
        super::http::status(addr, "/ready", Duration::from_secs(1)) == Some(200)
    })
}

/// Polls `f` every 100 ms until it holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Input that keeps flowing through a fault: a thread sends a batch of lines every `pause` from
/// one producer (librdkafka queues what it cannot send while the broker is away) until stopped.
pub struct Feeder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<HashMap<String, i64>>,
}

impl Feeder {
    /// Starts sending `per_batch` lines to `topic` of `cluster` every `pause`.
    pub fn start(cluster: &Cluster, topic: &str, per_batch: usize, pause: Duration) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (cluster, topic, stop2) = (cluster.clone(), topic.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let producer = cluster.producer();
            let mut truth: HashMap<String, i64> = HashMap::new();
            let mut n = 0;
            while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                for _ in 0..per_batch {
                    let words = line(n);
                    for w in &words {
                        *truth.entry(w.to_string()).or_default() += 1;
                    }
                    let text = words.join(" ");
                    super::producer::send(&producer, &topic, None, text.as_bytes()).expect("send");
                    n += 1;
                }
                std::thread::sleep(pause);
            }
            // Up to a minute for what was queued while the broker was away.
            super::producer::flush(&producer).expect("flush the fed input");
            truth
        });
        Feeder { stop, thread }
    }

    /// Stops sending, waits until everything sent is acknowledged; returns the word counts of
    /// everything sent.
    pub fn finish(self) -> HashMap<String, i64> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("feeder thread")
    }
}
