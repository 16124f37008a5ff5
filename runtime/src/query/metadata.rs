//! Which instance owns which partitions: the endpoint map every instance of an application
//! keeps, what `application.server` publishes into it, and the answers built from it
//! ([`KeyQueryMetadata`], [`StreamsMetadata`], Kafka Streams' names).
//!
//! # The channel: a compacted topic, `<application.id>-endpoints`
//!
//! Every instance with `application.server` set writes one record to the internal topic
//! `<application.id>-endpoints` (one partition, `cleanup.policy=compact`) whenever the tasks it
//! runs change (an assignment, a revocation, a live factor change), keyed by its
//! `application.server`; the value ([`Entry`]) lists the input partitions it owns (with each
//! task's parallelising factor), an incarnation (new at each start) and a sequence number (per
//! incarnation). At a clean stop it writes a tombstone. Every instance (with
//! `application.server` or not) reads the topic from its beginning with a plain consumer
//! (`assign`, no group) and applies the records in offset order to its [`EndpointMap`].
//!
//! Why a topic and not the consumer group: Kafka Streams carries `application.server` in the
//! classic protocol's subscription userdata, which librdkafka does not let an application
//! write or read (its assignors are built in), and the broker-side assignment of KIP-848
//! (`group.protocol=consumer`) has no userdata at all; describing the group gives members and
//! their partitions but no endpoint either. A topic works the same under both protocols, needs
//! nothing but the ACLs rill's other internal topics need, and compaction keeps one record per
//! instance, so a new instance reads a few records to know everything.
//!
//! # Ordering and stale entries
//!
//! The topic has one partition, so its offsets order every record of every instance:
//!
//! - of one instance, the latest record wins (a tombstone removes the instance); a record of the
//!   same incarnation with a sequence number not above the one applied is ignored (a duplicate);
//! - a partition belongs to the instance whose latest record claiming it comes **last** in the
//!   topic: an entry whose partitions another instance claims later loses them. An instance
//!   that died without its tombstone (SIGKILL) keeps its entry until a restart under the same
//!   `application.server` replaces it, but every partition it owned passes to whoever the group
//!   gives it next as soon as that instance publishes.
//! - This instance's own engine overrides the map for itself: a partition it runs is local
//!   whatever the map says, and a partition the map gives it but it does not run has an unknown
//!   owner (it was revoked and the next owner has not published yet, or has no
//!   `application.server`).
//!
//! What the map cannot tell: between a rebalance and the new owner's record (milliseconds; the
//! publisher looks every [`PUBLISH_EVERY`]) a key's owner is stale; the stale owner answers
//! 404-moved (with the owner it knows) or 503 (owner unknown), never a value of a partition it
//! does not run. Partitions owned by instances without `application.server` stay with their
//! last published owner, which answers the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use rill_topology::{key_hash, range_of, KeyRange};
use serde::{Deserialize, Serialize};

/// How often the publisher compares the tasks this instance runs with what it published last.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Version of [`Entry`]'s encoding.
pub const ENTRY_VERSION: u32 = 1;

/// The name of the endpoints topic of `application_id`.
pub fn endpoints_topic(application_id: &str) -> String {
    format!("{application_id}-endpoints")
}

/// The partition of a record with serialized key `key` among `partitions`, as Kafka's default
/// partitioner and rill's sinks choose it (murmur2, [`rill_topology::kafka_partition`]).
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    rill_topology::kafka_partition(key, partitions)
}

/// One owned input partition of an [`Entry`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OwnedPartition {
    /// The topic (resolved name).
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The parallelising factor of its task on the owner.
    pub factor: usize,
}

/// What one instance publishes (JSON, keyed by its `application.server`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// [`ENTRY_VERSION`].
    pub version: u32,
    /// `application.server`.
    pub server: String,
    /// New at each start of the instance.
    pub incarnation: u64,
    /// Increases with each record of one incarnation.
    pub sequence: u64,
    /// The input partitions whose tasks the instance runs.
    pub partitions: Vec<OwnedPartition>,
}

/// One instance as the endpoint map knows it (Kafka Streams' `StreamsMetadata`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamsMetadata {
    /// `application.server` (Kafka Streams' `hostInfo`).
    pub server: String,
    /// The partitions it owns: claimed by its latest record and by no later record of another
    /// instance.
    pub partitions: Vec<OwnedPartition>,
    /// The stores of the sub-topologies of those partitions (filled by the runtime).
    pub stores: Vec<String>,
    /// Offset of its latest record in the endpoints topic.
    pub offset: u64,
    /// Its incarnation (new at each start).
    pub incarnation: u64,
    /// Its sequence number.
    pub sequence: u64,
}

/// Where a key of a store lives (Kafka Streams' `KeyQueryMetadata`, plus rill's key range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyQueryMetadata {
    /// The store.
    pub store: String,
    /// The store's sub-topology's input topic the partition is of.
    pub topic: String,
    /// The partition of the key (where the store's input puts it; see
    /// [`super::StoreSource::kafka_partitioned`]).
    pub partition: u32,
    /// The owner's `application.server` (Kafka Streams' `activeHost`); `None` when unknown or
    /// when the owner is this instance without `application.server`.
    pub active_host: Option<String>,
    /// Whether this instance owns the partition.
    pub local: bool,
    /// The key's routing hash.
    pub key_hash: u64,
    /// The owner's parallelising factor of the partition's task, when known.
    pub factor: Option<usize>,
    /// The key's range `range_of(key_hash, factor)` (index and bounds), when the factor is known.
    pub range: Option<(usize, KeyRange)>,
}

impl KeyQueryMetadata {
    /// The metadata of a key with routing hash `hash` in `partition`, owned by `active_host`
    /// (or here when `local`) at `factor`.
    pub fn new(
        store: &str,
        topic: &str,
        key: &[u8],
        partition: u32,
        owner: (Option<String>, bool),
        factor: Option<usize>,
    ) -> Self {
        let hash = key_hash(key);
        KeyQueryMetadata {
            store: store.to_string(),
            topic: topic.to_string(),
            partition,
            active_host: owner.0,
            local: owner.1,
            key_hash: hash,
            factor,
            range: factor.filter(|f| *f > 0).map(|f| {
                let i = range_of(hash, f);
                (i, KeyRange::nth(i, f))
            }),
        }
    }
}

/// The entries of every published instance, applied in the topic's offset order (see the
/// module doc for the rules).
#[derive(Debug, Default)]
pub struct EndpointMap {
    /// By `application.server`: the latest entry and its offset.
    entries: BTreeMap<String, (Entry, u64)>,
    /// Whether the reader has read up to the end of the topic as it was when it started.
    caught_up: bool,
}

impl EndpointMap {
    /// Applies the record at `offset` keyed `server` (`None`: a tombstone). Records must come
    /// in offset order.
    pub fn apply(&mut self, offset: u64, server: &str, value: Option<Entry>) {
        match value {
            None => {
                self.entries.remove(server);
            }
            Some(entry) => {
                if let Some((old, _)) = self.entries.get(server) {
                    if old.incarnation == entry.incarnation && entry.sequence <= old.sequence {
                        return;
                    }
                }
                self.entries.insert(server.to_string(), (entry, offset));
            }
        }
    }

    /// Marks the map as read up to the end of the topic as it was at start.
    pub fn set_caught_up(&mut self) {
        self.caught_up = true;
    }

    /// Whether the map has read every record that was in the topic at start.
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// The owner of `topic`-`partition` (the latest claim) and its factor there.
    pub fn owner(&self, topic: &str, partition: u32) -> Option<(&str, usize)> {
        self.entries
            .iter()
            .filter_map(|(server, (e, offset))| {
                e.partitions
                    .iter()
                    .find(|p| p.topic == topic && p.partition == partition)
                    .map(|p| (*offset, server.as_str(), p.factor))
            })
            .max_by_key(|(offset, _, _)| *offset)
            .map(|(_, s, f)| (s, f))
    }

    /// Every published instance with the partitions it owns (claims lost to later records of
    /// others left out), in `application.server` order.
    pub fn instances(&self) -> Vec<StreamsMetadata> {
        self.entries
            .iter()
            .map(|(server, (e, offset))| StreamsMetadata {
                server: server.clone(),
                partitions: e
                    .partitions
                    .iter()
                    .filter(|p| self.owner(&p.topic, p.partition).map(|(s, _)| s) == Some(server))
                    .cloned()
                    .collect(),
                stores: Vec::new(),
                offset: *offset,
                incarnation: e.incarnation,
                sequence: e.sequence,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(server: &str, incarnation: u64, sequence: u64, parts: &[u32]) -> Option<Entry> {
        Some(Entry {
            version: ENTRY_VERSION,
            server: server.into(),
            incarnation,
            sequence,
            partitions: parts
                .iter()
                .map(|p| OwnedPartition {
                    topic: "t".into(),
                    partition: *p,
                    factor: 2,
                })
                .collect(),
        })
    }

    fn owners(m: &EndpointMap, n: u32) -> Vec<Option<String>> {
        (0..n)
            .map(|p| m.owner("t", p).map(|(s, _)| s.to_string()))
            .collect()
    }

    #[test]
    fn a_later_claim_takes_the_partition_from_an_earlier_entry() {
        let mut m = EndpointMap::default();
        m.apply(0, "a:1", entry("a:1", 1, 1, &[0, 1, 2, 3]));
        assert_eq!(owners(&m, 4), vec![Some("a:1".to_string()); 4]);
        // b joins; a's revocation record comes after b's claim.
        m.apply(1, "b:1", entry("b:1", 1, 1, &[2, 3]));
        assert_eq!(m.owner("t", 2), Some(("b:1", 2)));
        m.apply(2, "a:1", entry("a:1", 1, 2, &[0, 1]));
        assert_eq!(
            owners(&m, 4),
            vec![
                Some("a:1".into()),
                Some("a:1".into()),
                Some("b:1".into()),
                Some("b:1".into())
            ]
        );
        let all = m.instances();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].partitions.len(), 2);
        assert_eq!(all[1].partitions.len(), 2);
        assert_eq!(m.owner("other", 0), None);
    }

    /// A SIGKILLed instance's entry stays, but loses each partition another instance claims
    /// later; its unclaimed partitions stay with it (the stale owner answers moved or 503).
    #[test]
    fn a_dead_instance_keeps_only_what_nobody_claimed_since() {
        let mut m = EndpointMap::default();
        m.apply(0, "a:1", entry("a:1", 1, 1, &[0, 1]));
        m.apply(1, "b:1", entry("b:1", 1, 1, &[2, 3]));
        m.apply(2, "c:1", entry("c:1", 1, 1, &[4, 5]));
        // c dies; a and b take its partitions, one after the other.
        m.apply(3, "a:1", entry("a:1", 1, 2, &[0, 1, 4]));
        assert_eq!(m.owner("t", 4), Some(("a:1", 2)));
        assert_eq!(m.owner("t", 5), Some(("c:1", 2)));
        m.apply(4, "b:1", entry("b:1", 1, 2, &[2, 3, 5]));
        assert_eq!(m.owner("t", 5), Some(("b:1", 2)));
        let c = m.instances().into_iter().find(|i| i.server == "c:1");
        assert_eq!(c.expect("c is still listed").partitions, vec![]);
        // c restarts under the same application.server: its new incarnation replaces the entry.
        m.apply(5, "c:1", entry("c:1", 2, 1, &[]));
        m.apply(6, "c:1", entry("c:1", 2, 2, &[5]));
        assert_eq!(m.owner("t", 5), Some(("c:1", 2)));
        // A tombstone (clean stop) removes the instance and its claims.
        m.apply(7, "c:1", None);
        assert_eq!(m.owner("t", 5), Some(("b:1", 2)));
        assert_eq!(m.instances().len(), 2);
    }

    #[test]
    fn a_duplicate_or_older_record_of_one_incarnation_is_ignored() {
        let mut m = EndpointMap::default();
        m.apply(0, "a:1", entry("a:1", 7, 3, &[0]));
        m.apply(1, "a:1", entry("a:1", 7, 2, &[1]));
        m.apply(2, "a:1", entry("a:1", 7, 3, &[1]));
        assert_eq!(owners(&m, 2), vec![Some("a:1".into()), None]);
        // Another incarnation starts its own sequence.
        m.apply(3, "a:1", entry("a:1", 8, 1, &[1]));
        assert_eq!(owners(&m, 2), vec![None, Some("a:1".into())]);
    }

    #[test]
    fn key_metadata_names_the_range_of_the_key_at_the_owner_factor() {
        let md = KeyQueryMetadata::new("s", "t", b"kafka", 3, (Some("a:1".into()), false), Some(4));
        let (i, r) = md.range.expect("a range");
        assert_eq!(i, range_of(key_hash(b"kafka"), 4));
        assert!(r.contains(key_hash(b"kafka")));
        let unknown = KeyQueryMetadata::new("s", "t", b"kafka", 3, (None, false), None);
        assert_eq!(unknown.range, None);
    }
}
