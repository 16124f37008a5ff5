//! Names for what the engine and the Kafka edge pass around.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// One partition of one topic (resolved name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// The topic's name on the broker.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

impl TopicPartition {
    /// Partition `partition` of `topic`.
    pub fn new(topic: impl Into<String>, partition: u32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Partitions listed per topic for a log line: `words[0,1,2] counts-repartition[3]`.
pub fn partition_list<'a>(partitions: impl IntoIterator<Item = &'a TopicPartition>) -> String {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for tp in partitions {
        by_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    let mut out = Vec::with_capacity(by_topic.len());
    for (topic, mut ps) in by_topic {
        ps.sort_unstable();
        let ps: Vec<String> = ps.iter().map(u32::to_string).collect();
        out.push(format!("{topic}[{}]", ps.join(",")));
    }
    out.join(" ")
}

/// A task: one sub-topology over one input partition, as in Kafka Streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// The sub-topology.
    pub sub_topology: usize,
    /// The input partition.
    pub partition: u32,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.sub_topology, self.partition)
    }
}

/// A random, non-zero id (lineages, transactional ids, streams-group member ids).
pub(crate) fn random_id() -> u64 {
    // The standard library's per-process random hasher keys, mixed with the time and a counter
    // (two calls in one nanosecond still differ).
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_list_groups_partitions_by_topic_in_order() {
        let tps = [
            TopicPartition::new("b", 2),
            TopicPartition::new("a", 1),
            TopicPartition::new("b", 0),
        ];
        assert_eq!(partition_list(&tps), "a[1] b[0,2]");
        assert_eq!(partition_list(&[]), "");
    }
}
