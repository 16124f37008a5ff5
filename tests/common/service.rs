//! The wordcount example run as a child process, as an operator runs the service.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{bootstrap, long, produce, read_until, Input};

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
        let state_dir = dir.join(format!("{name}-state"));
        Service {
            binary: wordcount_binary(),
            args: vec![
                "--input".into(),
                input.into(),
                "--output".into(),
                output.into(),
            ],
            env: [
                ("RILL_BOOTSTRAP_SERVERS", bootstrap()),
                ("RILL_APPLICATION_ID", app.to_string()),
                ("RILL_STATE_DIR", state_dir.display().to_string()),
                ("RILL_PARALLELISING_FACTOR", "4".into()),
                ("RILL_COMMIT_INTERVAL_MS", "200".into()),
                ("RILL_METRICS_ADDR", "off".into()),
                // Static membership: a restarted instance takes its partitions back at once.
                ("RILL_KAFKA_GROUP_INSTANCE_ID", format!("{app}-{name}")),
                ("RILL_KAFKA_SESSION_TIMEOUT_MS", "6000".into()),
                ("RILL_LOG", "info".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            log: dir.join(format!("{name}.log")),
            state_dir,
        }
    }

    /// Starts the process.
    pub fn spawn(&self) -> Child {
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
            .expect("spawn the example")
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

fn strip_ansi(s: &str) -> String {
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

/// Input lines in `batches` batches of `per_batch`, with the word counts they add up to.
pub fn lines(batches: usize, per_batch: usize) -> (Vec<Vec<Input>>, HashMap<String, i64>) {
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
        "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon",
    ];
    let mut truth: HashMap<String, i64> = HashMap::new();
    let batches = (0..batches)
        .map(|b| {
            (0..per_batch)
                .map(|i| {
                    let n = b * per_batch + i;
                    let line: Vec<&str> = (0..(n % 4 + 1))
                        .map(|j| words[(n * 5 + j * 7) % words.len()])
                        .collect();
                    for w in &line {
                        *truth.entry(w.to_string()).or_default() += 1;
                    }
                    (None, line.join(" ").into_bytes())
                })
                .collect()
        })
        .collect();
    (batches, truth)
}

/// Produces the batches to `topic`, `pause` apart, on a thread.
pub fn feed(topic: &str, batches: Vec<Vec<Input>>, pause: Duration) -> std::thread::JoinHandle<()> {
    let topic = topic.to_string();
    std::thread::spawn(move || {
        for batch in batches {
            produce(&topic, &batch);
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
    let expected: HashMap<Vec<u8>, Vec<u8>> = truth
        .iter()
        .map(|(w, n)| (w.as_bytes().to_vec(), n.to_be_bytes().to_vec()))
        .collect();
    // Stop early only on the exact answer; an over-count never matches and times out.
    let (latest, _) = read_until(output, timeout, |l| *l == expected);
    latest
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), long(v)))
        .collect()
}
