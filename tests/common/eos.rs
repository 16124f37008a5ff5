//! What a `read_committed` reader of wordcount's output sees under `exactly_once_v2`: each word's
//! counts once each and never going back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;

use super::{long, unique, Cluster};

/// Reads `topic` with `read_committed` on a thread, from the start, keeping every (word, count)
/// in the order it is read (one word lives in one partition, so that is the order written), and
/// when each was read.
pub struct Watcher {
    seen: Arc<Mutex<Vec<(String, i64, Instant)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts reading `topic` of `cluster`.
    pub fn start(cluster: &Cluster, topic: &str) -> Self {
        let consumer: BaseConsumer = cluster
            .client()
            .set("group.id", unique("eos-reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    let word = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                    let count = long(m.payload().unwrap_or_default());
                    s.lock().expect("seen").push((word, count, Instant::now()));
                }
            }
        });
        Watcher {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The latest count per word.
    pub fn latest(&self) -> HashMap<String, i64> {
        self.seen
            .lock()
            .expect("seen")
            .iter()
            .map(|(w, n, _)| (w.clone(), *n))
            .collect()
    }

    /// Waits until the latest counts equal `truth` (or `timeout`); returns them.
    pub fn wait_for(
        &self,
        truth: &HashMap<String, i64>,
        timeout: Duration,
    ) -> HashMap<String, i64> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && self.latest() != *truth {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.latest()
    }

    /// The longest time between two records read from `from` to `to` (and from the last one
    /// before `from`): how long the output stood still.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let seen = self.seen.lock().expect("seen");
        let mut last = seen
            .iter()
            .rev()
            .map(|(_, _, t)| *t)
            .find(|t| *t <= from)
            .unwrap_or(from);
        let mut longest = Duration::ZERO;
        for t in seen
            .iter()
            .map(|(_, _, t)| *t)
            .filter(|t| *t > from && *t <= to)
        {
            longest = longest.max(t - last);
            last = t;
        }
        longest.max(to.saturating_duration_since(last))
    }

    /// Stops reading; returns every (word, count) read.
    pub fn finish(mut self) -> Vec<(String, i64)> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("reader");
        }
        std::mem::take(&mut *self.seen.lock().expect("seen"))
            .into_iter()
            .map(|(w, n, _)| (w, n))
            .collect()
    }
}

/// Every word's counts in the order read: strictly increasing, or the message names the first
/// word that repeats or goes back.
pub fn check_each_count_once(seen: &[(String, i64)]) {
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (word, count) in seen {
        if let Some(prev) = last.insert(word, *count) {
            assert!(
                *count > prev,
                "`{word}` read with count {count} after {prev}: an output was committed twice, \
                 or one of rolled-back work became visible"
            );
        }
    }
}
