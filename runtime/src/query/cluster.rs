//! The owner of a key across the instances of an application: this instance's engine for the
//! partitions it runs, the endpoint map ([`super::metadata`]) for the others.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use super::http::{Locate, Owner, ScanPlan};
use super::metadata::{partition_for, EndpointMap, KeyQueryMetadata, StreamsMetadata};
use super::{EngineAccess, QueryError};
use crate::engine::TaskId;

/// Where the records of a store come from: its sub-topology's input topics (co-partitioned:
/// one partition count).
#[derive(Clone, Debug)]
pub struct StoreSource {
    /// The sub-topology that owns the store.
    pub sub_topology: usize,
    /// Its input topics (resolved names), the first one names the partition in answers.
    pub topics: Vec<String>,
    /// Their partition count.
    pub partitions: u32,
    /// Whether its records are partitioned as Kafka's default partitioner does (a user topic
    /// among the inputs), rather than by rill's key hash (repartition topics read alone).
    pub kafka_partitioned: bool,
}

/// Who owns what, for this instance: the [`Locate`] of the query routes once the endpoints
/// channel runs, and what [`crate::RunningRuntime::query_metadata_for_key`] answers from.
pub struct Cluster {
    me: Option<String>,
    map: Arc<RwLock<EndpointMap>>,
    /// Set once the topics' partition counts are known.
    stores: OnceLock<BTreeMap<String, StoreSource>>,
    engine: OnceLock<Arc<dyn EngineAccess>>,
}

impl Cluster {
    /// The view of an instance published as `me` (`application.server`, if set).
    pub fn new(me: Option<String>) -> Self {
        Cluster {
            me,
            map: Arc::new(RwLock::new(EndpointMap::default())),
            stores: OnceLock::new(),
            engine: OnceLock::new(),
        }
    }

    /// The view of an instance published as `me` whose owners come from the streams group's
    /// heartbeat answers (`group.protocol=streams`; see [`super::metadata`]).
    pub fn with_broker_ownership(me: Option<String>) -> Self {
        Cluster {
            map: Arc::new(RwLock::new(EndpointMap::from_broker())),
            ..Self::new(me)
        }
    }

    /// Where each store's records come from (once the partition counts are known).
    pub fn set_stores(&self, stores: BTreeMap<String, StoreSource>) {
        let _ = self.stores.set(stores);
    }

    fn stores(&self) -> Result<&BTreeMap<String, StoreSource>, QueryError> {
        self.stores.get().ok_or(QueryError::NotRunning)
    }

    /// The endpoint map the reader of the endpoints topic fills (and, under
    /// `group.protocol=streams`, the streams group member).
    pub fn map(&self) -> &Arc<RwLock<EndpointMap>> {
        &self.map
    }

    /// Checks local ownership against `engine` from now on.
    pub fn serve(&self, engine: Arc<dyn EngineAccess>) {
        let _ = self.engine.set(engine);
    }

    /// This instance's `application.server`.
    pub fn me(&self) -> Option<&str> {
        self.me.as_deref()
    }

    fn source(&self, store: &str) -> Result<&StoreSource, QueryError> {
        let stores = self.stores()?;
        stores.get(store).ok_or_else(|| QueryError::UnknownStore {
            store: store.to_string(),
            known: stores.keys().cloned().collect(),
        })
    }

    /// The factor of task (`sub_topology`, `partition`) when this instance runs it.
    fn local_factor(
        &self,
        sub_topology: usize,
        partition: u32,
    ) -> Result<Option<usize>, QueryError> {
        let Some(access) = self.engine.get() else {
            return Ok(None);
        };
        let mut factor = None;
        access.with_engine(&mut |e| {
            factor = e
                .factors()
                .get(&TaskId {
                    sub_topology,
                    partition,
                })
                .copied();
        })?;
        Ok(factor)
    }

    /// Where serialized `key` of `store` lives: its partition, the instance that owns it (this
    /// one when it runs the partition, else the endpoint map's latest claim), its key range at
    /// the owner's factor.
    pub fn key_metadata(&self, store: &str, key: &[u8]) -> Result<KeyQueryMetadata, QueryError> {
        let source = self.source(store)?;
        let topic = source.topics.first().map_or("", String::as_str);
        let partition = match source.kafka_partitioned {
            true => partition_for(key, source.partitions),
            false => crate::engine::internal_partition_of(key, source.partitions, false),
        };
        if let Some(factor) = self.local_factor(source.sub_topology, partition)? {
            return Ok(KeyQueryMetadata::new(
                store,
                topic,
                key,
                partition,
                (self.me.clone(), true),
                Some(factor),
            ));
        }
        let map = self.map.read();
        let owner = map
            .owner(topic, partition)
            // The map may still name this instance for a partition it gave away.
            .filter(|(server, _)| Some(*server) != self.me.as_deref());
        Ok(KeyQueryMetadata::new(
            store,
            topic,
            key,
            partition,
            (owner.map(|(s, _)| s.to_string()), false),
            owner.and_then(|(_, f)| f),
        ))
    }

    /// Every published instance with the partitions and stores it owns (Kafka Streams'
    /// `allMetadata`).
    pub fn all_metadata(&self) -> Vec<StreamsMetadata> {
        let mut all = self.map.read().instances();
        let Ok(stores) = self.stores() else {
            return all;
        };
        for instance in &mut all {
            instance.stores = stores
                .iter()
                .filter(|(_, s)| {
                    instance
                        .partitions
                        .iter()
                        .any(|p| s.topics.contains(&p.topic))
                })
                .map(|(name, _)| name.clone())
                .collect();
        }
        all
    }

    /// Whether the endpoint map has read the whole topic once.
    pub fn caught_up(&self) -> bool {
        self.map.read().caught_up()
    }
}

impl Locate for Cluster {
    fn owner(&self, store: &str, key: &[u8]) -> Owner {
        // An unknown store, or an engine that does not answer: read here, which says why.
        let Ok(md) = self.key_metadata(store, key) else {
            return Owner::Local(None);
        };
        match (md.local, md.active_host) {
            (true, _) => Owner::Local(Some(md.partition)),
            (false, Some(server)) => Owner::Elsewhere {
                server,
                partition: md.partition,
            },
            (false, None) => Owner::Unknown {
                partition: md.partition,
            },
        }
    }

    fn me(&self) -> Option<String> {
        self.me.clone()
    }

    fn scan_plan(&self, store: &str) -> ScanPlan {
        let Ok(source) = self.source(store) else {
            return ScanPlan::default();
        };
        let topic = source.topics.first().map_or("", String::as_str);
        // Asked before the map's lock is taken: the engine's lock is never held inside it.
        let remote: Vec<u32> = (0..source.partitions)
            .filter(|p| {
                self.local_factor(source.sub_topology, *p)
                    .ok()
                    .flatten()
                    .is_none()
            })
            .collect();
        let map = self.map.read();
        let mut plan = ScanPlan::default();
        for partition in remote {
            match map
                .owner(topic, partition)
                .filter(|(server, _)| Some(*server) != self.me.as_deref())
            {
                Some((server, _)) if !plan.others.iter().any(|o| o == server) => {
                    plan.others.push(server.to_string())
                }
                Some(_) => {}
                None => plan.unknown.push(partition),
            }
        }
        plan
    }

    fn metadata(&self) -> Option<(bool, Vec<StreamsMetadata>)> {
        Some((self.caught_up(), self.all_metadata()))
    }
}
