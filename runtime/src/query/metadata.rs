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
//! # Under `group.protocol=streams`: the broker's map
//!
//! The streams group protocol (KIP-1071) carries what the topic carries: every heartbeat answer
//! whose `EndpointInformationEpoch` differs from the one the member echoed holds
//! `PartitionsByUserEndpoint`, every member's `application.server` with the partitions of its
//! active and standby tasks, as the broker assigned them. With this protocol on, that answer is
//! the map's ownership ([`EndpointMap::set_from_broker`]): a partition belongs to the endpoint
//! the broker's latest answer gives it, and a partition the broker moved changes owner with
//! the answer that says so, without waiting for the new owner to publish. Until the first
//! answer the map knows no owner (and is not [`EndpointMap::caught_up`]).
//!
//! The topic keeps running under this protocol, for two things the broker does not carry: the
//! owner's parallelising factor of each partition (a key's range, [`KeyQueryMetadata::range`]),
//! read from the owner's latest entry when it claims that partition, and the uncaught-error
//! handler's shutdown requests. Its claims no longer decide an owner.
//!
//! What the map cannot tell: between a rebalance and the new owner's record (milliseconds; the
//! publisher looks every [`PUBLISH_EVERY`]) a key's owner is stale; the stale owner answers
//! 404-moved (with the owner it knows) or 503 (owner unknown), never a value of a partition it
//! does not run. Partitions owned by instances without `application.server` stay with their
//! last published owner, which answers the same way.

use std::collections::{BTreeMap, BTreeSet};
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
    /// instance, or under `group.protocol=streams` those of its active tasks as the broker
    /// assigned them (a factor of 0: the owner has not published its factor yet).
    pub partitions: Vec<OwnedPartition>,
    /// Partitions of its standby and warm-up tasks (Kafka Streams' `standbyTopicPartitions`;
    /// under `group.protocol=streams` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub standby_partitions: Vec<TopicPartitionName>,
    /// The stores of the sub-topologies of those partitions (filled by the runtime).
    pub stores: Vec<String>,
    /// Where its ownership comes from.
    pub ownership: Ownership,
    /// The broker's endpoint epoch of the answer the ownership comes from (under
    /// `group.protocol=streams`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_epoch: Option<i32>,
    /// Offset of its latest record in the endpoints topic (0: none read).
    pub offset: u64,
    /// Its incarnation (new at each start; 0: no record read).
    pub incarnation: u64,
    /// Its sequence number.
    pub sequence: u64,
}

/// Where an endpoint map's ownership comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ownership {
    /// The endpoints topic's claims (`group.protocol` classic or consumer).
    Topic,
    /// The streams group's heartbeat answers (`group.protocol=streams`).
    Broker,
}

/// A partition by topic name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TopicPartitionName {
    /// The topic (resolved name).
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

/// One endpoint's partitions in the broker's map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerEndpoint {
    /// Partitions of its active tasks: (topic, partition).
    pub active: BTreeSet<(String, u32)>,
    /// Partitions of its standby and warm-up tasks.
    pub standby: BTreeSet<(String, u32)>,
}

/// The broker's map (`PartitionsByUserEndpoint`) at one endpoint epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct BrokerMap {
    epoch: i32,
    by_server: BTreeMap<String, BrokerEndpoint>,
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

/// The entries of every published instance, applied in the topic's offset order, and under
/// `group.protocol=streams` the broker's map (see the module doc for the rules).
#[derive(Debug, Default)]
pub struct EndpointMap {
    /// By `application.server`: the latest entry and its offset.
    entries: BTreeMap<String, (Entry, u64)>,
    /// Whether the reader has read up to the end of the topic as it was when it started.
    caught_up: bool,
    /// Ownership comes from the broker (`group.protocol=streams`), not from the topic.
    from_broker: bool,
    /// The broker's latest map; `None` until its first answer.
    broker: Option<BrokerMap>,
}

impl EndpointMap {
    /// A map whose ownership comes from the streams group's heartbeat answers
    /// ([`Self::set_from_broker`]) instead of the topic's claims.
    pub fn from_broker() -> Self {
        EndpointMap {
            from_broker: true,
            ..Self::default()
        }
    }

    /// Where this map's ownership comes from.
    pub fn ownership(&self) -> Ownership {
        match self.from_broker {
            true => Ownership::Broker,
            false => Ownership::Topic,
        }
    }

    /// Replaces the broker's map with the one of a heartbeat answer at endpoint epoch `epoch`
    /// (by `application.server`, several members of one endpoint already merged).
    pub fn set_from_broker(&mut self, epoch: i32, by_server: BTreeMap<String, BrokerEndpoint>) {
        self.broker = Some(BrokerMap { epoch, by_server });
    }

    /// The broker's endpoint epoch of the map in use (`None` before its first answer, or when
    /// ownership comes from the topic).
    pub fn endpoint_epoch(&self) -> Option<i32> {
        self.broker.as_ref().map(|b| b.epoch)
    }

    /// The factor `server`'s latest entry gives `topic`-`partition`, when it claims it.
    fn published_factor(&self, server: &str, topic: &str, partition: u32) -> Option<usize> {
        let (entry, _) = self.entries.get(server)?;
        entry
            .partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
            .map(|p| p.factor)
    }

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

    /// Whether the map has read every record that was in the topic at start, and under
    /// `group.protocol=streams` has the broker's map.
    pub fn caught_up(&self) -> bool {
        self.caught_up && (!self.from_broker || self.broker.is_some())
    }

    /// The owner of `topic`-`partition` (the latest claim, or the broker's assignment under
    /// `group.protocol=streams`) and its factor there (`None`: not published yet).
    pub fn owner(&self, topic: &str, partition: u32) -> Option<(&str, Option<usize>)> {
        if self.from_broker {
            let broker = self.broker.as_ref()?;
            let key = (topic.to_string(), partition);
            let (server, _) = broker
                .by_server
                .iter()
                .find(|(_, e)| e.active.contains(&key))?;
            return Some((
                server.as_str(),
                self.published_factor(server, topic, partition),
            ));
        }
        self.entries
            .iter()
            .filter_map(|(server, (e, offset))| {
                e.partitions
                    .iter()
                    .find(|p| p.topic == topic && p.partition == partition)
                    .map(|p| (*offset, server.as_str(), p.factor))
            })
            .max_by_key(|(offset, _, _)| *offset)
            .map(|(_, s, f)| (s, Some(f)))
    }

    /// Every published instance with the partitions it owns (claims lost to later records of
    /// others left out), in `application.server` order.
    pub fn instances(&self) -> Vec<StreamsMetadata> {
        if self.from_broker {
            return self.broker_instances();
        }
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
                standby_partitions: Vec::new(),
                stores: Vec::new(),
                ownership: Ownership::Topic,
                endpoint_epoch: None,
                offset: *offset,
                incarnation: e.incarnation,
                sequence: e.sequence,
            })
            .collect()
    }

    /// Every endpoint of the broker's map, with what the topic says of it (factors, offset).
    fn broker_instances(&self) -> Vec<StreamsMetadata> {
        let Some(broker) = &self.broker else {
            return Vec::new();
        };
        broker
            .by_server
            .iter()
            .map(|(server, e)| {
                let published = self.entries.get(server);
                StreamsMetadata {
                    server: server.clone(),
                    partitions: e
                        .active
                        .iter()
                        .map(|(topic, partition)| OwnedPartition {
                            topic: topic.clone(),
                            partition: *partition,
                            factor: self
                                .published_factor(server, topic, *partition)
                                .unwrap_or(0),
                        })
                        .collect(),
                    standby_partitions: e
                        .standby
                        .iter()
                        .map(|(topic, partition)| TopicPartitionName {
                            topic: topic.clone(),
                            partition: *partition,
                        })
                        .collect(),
                    stores: Vec::new(),
                    ownership: Ownership::Broker,
                    endpoint_epoch: Some(broker.epoch),
                    offset: published.map_or(0, |(_, o)| *o),
                    incarnation: published.map_or(0, |(e, _)| e.incarnation),
                    sequence: published.map_or(0, |(e, _)| e.sequence),
                }
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
        assert_eq!(m.owner("t", 2), Some(("b:1", Some(2))));
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
        assert_eq!(m.owner("t", 4), Some(("a:1", Some(2))));
        assert_eq!(m.owner("t", 5), Some(("c:1", Some(2))));
        m.apply(4, "b:1", entry("b:1", 1, 2, &[2, 3, 5]));
        assert_eq!(m.owner("t", 5), Some(("b:1", Some(2))));
        let c = m.instances().into_iter().find(|i| i.server == "c:1");
        assert_eq!(c.expect("c is still listed").partitions, vec![]);
        // c restarts under the same application.server: its new incarnation replaces the entry.
        m.apply(5, "c:1", entry("c:1", 2, 1, &[]));
        m.apply(6, "c:1", entry("c:1", 2, 2, &[5]));
        assert_eq!(m.owner("t", 5), Some(("c:1", Some(2))));
        // A tombstone (clean stop) removes the instance and its claims.
        m.apply(7, "c:1", None);
        assert_eq!(m.owner("t", 5), Some(("b:1", Some(2))));
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

    fn broker(active: &[(&str, &[u32])]) -> BTreeMap<String, BrokerEndpoint> {
        active
            .iter()
            .map(|(server, parts)| {
                let e = BrokerEndpoint {
                    active: parts.iter().map(|p| ("t".to_string(), *p)).collect(),
                    standby: BTreeSet::new(),
                };
                (server.to_string(), e)
            })
            .collect()
    }

    /// Under `group.protocol=streams` the broker's latest answer decides the owner, whatever
    /// the topic claims, and a moved partition changes owner with the answer that moves it.
    #[test]
    fn the_broker_map_decides_owners_and_a_moved_partition_follows_it() {
        let mut m = EndpointMap::from_broker();
        m.set_caught_up();
        // The topic says a owns everything (a stale claim); the broker has not answered yet.
        m.apply(0, "a:1", entry("a:1", 1, 1, &[0, 1, 2, 3]));
        assert_eq!(owners(&m, 4), vec![None; 4]);
        assert!(
            !m.caught_up(),
            "not caught up before the broker's first map"
        );
        assert!(m.instances().is_empty());
        m.set_from_broker(1, broker(&[("a:1", &[0, 1]), ("b:1", &[2, 3])]));
        assert!(m.caught_up());
        assert_eq!(m.endpoint_epoch(), Some(1));
        // a's factor comes from its entry; b has not published: its factor is unknown.
        assert_eq!(m.owner("t", 0), Some(("a:1", Some(2))));
        assert_eq!(m.owner("t", 2), Some(("b:1", None)));
        let all = m.instances();
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|i| i.ownership == Ownership::Broker));
        assert_eq!(all[1].partitions[0].factor, 0, "not published yet");
        assert_eq!(all[0].endpoint_epoch, Some(1));
        // The broker moves partition 1 to b: the next answer says so.
        m.set_from_broker(2, broker(&[("a:1", &[0]), ("b:1", &[1, 2, 3])]));
        assert_eq!(
            owners(&m, 4),
            vec![
                Some("a:1".into()),
                Some("b:1".into()),
                Some("b:1".into()),
                Some("b:1".into())
            ]
        );
        // b leaves the group: a's later topic claims do not matter, the broker's map does.
        m.set_from_broker(3, broker(&[("a:1", &[0, 1, 2, 3])]));
        assert_eq!(owners(&m, 4), vec![Some("a:1".to_string()); 4]);
        assert_eq!(m.instances().len(), 1);
        assert_eq!(m.owner("other", 0), None);
    }

    #[test]
    fn a_default_map_takes_ownership_from_the_topic() {
        let m = EndpointMap::default();
        assert_eq!(m.ownership(), Ownership::Topic);
        assert_eq!(m.endpoint_epoch(), None);
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
