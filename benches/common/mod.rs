//! Helpers shared by the benchmarks that talk to a broker.
#![allow(dead_code, unused_imports)]

#[path = "../../tests/common/producer.rs"]
pub mod producer;

pub use producer::{input_producer, send};

/// The broker to benchmark against, from `RILL_TEST_BOOTSTRAP`.
pub fn bootstrap() -> String {
    std::env::var("RILL_TEST_BOOTSTRAP")
        .expect("set RILL_TEST_BOOTSTRAP to a broker (scripts/kafka start)")
}

/// Nanoseconds since the epoch, to make names unique.
pub fn stamp() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// CPU seconds this process has used (user + system), from /proc/self/stat.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<u64>() as f64 / 100.0
}
