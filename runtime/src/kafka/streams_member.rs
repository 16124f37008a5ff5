//! An instance as a member of a streams group (`group.protocol=streams`, KIP-1071): it joins
//! with its topology, heartbeats on the source loop's thread, turns the active tasks the broker
//! assigns into the input partitions to assign or revoke, and commits offsets at its member
//! epoch.
//!
//! The broker assigns a task to this member only once its previous owner reported it revoked,
//! so the member reconciles in two steps, as Kafka Streams' client does: each heartbeat answer
//! that carries a new target is turned into a [`Change`] (revocations first, then assignments);
//! the source loop applies it (draining and committing what is revoked) and the next heartbeat,
//! sent at once, reports the tasks owned then. A member the broker fenced (an unknown member or
//! a stale epoch, after a pause longer than the session) loses its tasks without committing and
//! joins again.
//!
//! Endpoints: the member echoes the endpoint epoch of the last map it applied (-1 at first and
//! after a rejoin, so the broker sends the whole map), and every map an answer carries replaces
//! the ownership of the interactive-query routing's endpoint map ([`StreamsMember::route_with`];
//! see [`crate::query::metadata`]).
//!
//! The coordinator connection is secured as `kafka.security.protocol` and `kafka.sasl.*` say
//! ([`super::wire_security`]); a refused authentication stops the member with an error.
//!
//! Not here yet (issue 44): standby and warm-up tasks (every heartbeat reports none). Under
//! `exactly_once_v2` a transaction's offsets are sent as this member (`kafka::transaction`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::streams_group::{
    Endpoint, EndpointPartitions, Heartbeat, HeartbeatResponse, OffsetToCommit, StreamsGroupClient,
    StreamsGroupError, TaskIds, TopologyDescription,
};
use super::wire_security::WireSecurity;
use crate::engine::TopicPartition;
use crate::query::metadata::{BrokerEndpoint, EndpointMap};

/// The endpoint epoch a member sends before it has a map: the broker's differs, so it answers
/// with the whole map.
const NO_ENDPOINT_EPOCH: i32 = -1;

/// Time allowed for one request to the coordinator.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The heartbeat interval until the broker names one.
const FIRST_INTERVAL: Duration = Duration::from_millis(500);
/// Wait before reconnecting after a failed heartbeat.
const RETRY: Duration = Duration::from_millis(500);
/// Kafka's `UNKNOWN_MEMBER_ID`.
const UNKNOWN_MEMBER_ID: i16 = 25;
/// Kafka's `FENCED_MEMBER_EPOCH`.
const FENCED_MEMBER_EPOCH: i16 = 110;
/// Kafka's error codes a heartbeat retries on another connection: `REQUEST_TIMED_OUT`,
/// `NETWORK_EXCEPTION`, `COORDINATOR_LOAD_IN_PROGRESS` (a fresh broker), `COORDINATOR_NOT_AVAILABLE`,
/// `NOT_COORDINATOR` (the coordinator moved).
const RETRIABLE: [i16; 5] = [7, 13, 14, 15, 16];

/// What the source loop does with its partitions after a heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Partitions to drain, commit and unassign (or drop without committing when `lost`).
    pub revoke: Vec<TopicPartition>,
    /// Partitions to assign.
    pub assign: Vec<TopicPartition>,
    /// The member was fenced: `revoke` holds every partition, and nothing of them commits.
    pub lost: bool,
}

/// Who a member is and how it reaches its group.
pub struct Membership {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The group: the application id.
    pub group: String,
    /// The member id. One kept across restarts (the service keeps it in the state dir) makes a
    /// restarted instance rejoin as the member it was, so its tasks come back at once instead
    /// of after the session of a vanished member.
    pub member_id: String,
    /// `group.instance.id`, for static membership.
    pub instance_id: Option<String>,
    /// `application.server`.
    pub endpoint: Option<Endpoint>,
    /// How long the coordinator waits for a revocation.
    pub rebalance_timeout: Duration,
    /// TLS and SASL on the coordinator connection (the `kafka.*` settings librdkafka uses).
    pub security: WireSecurity,
}

/// One instance's membership in its application's streams group.
pub struct StreamsMember {
    bootstrap: String,
    group: String,
    member_id: String,
    /// `group.instance.id` (static membership): a member that leaves with it keeps its tasks
    /// for the session, for the restart that rejoins under it.
    instance_id: Option<String>,
    process_id: String,
    endpoint: Option<Endpoint>,
    rebalance_timeout: Duration,
    security: WireSecurity,
    topology: TopologyDescription,
    /// Input topics (resolved names) of each sub-topology, by its id: a task `(id, p)` is
    /// partition `p` of each.
    topics: BTreeMap<String, Vec<String>>,
    /// The coordinator connection; `None` after a failure (reconnected at the next heartbeat).
    client: Option<StreamsGroupClient>,
    /// 0 until joined; the broker's epoch afterwards.
    epoch: i32,
    /// Active tasks owned: assigned to the consumer and the engine.
    owned: BTreeSet<(String, i32)>,
    /// The tasks the broker assigned last, not applied yet.
    pending: Option<BTreeSet<(String, i32)>>,
    interval: Duration,
    /// When the next heartbeat is due.
    due: Instant,
    /// When a heartbeat last got an answer (a member silent for longer than the session is
    /// fenced by the broker: its tasks are treated as lost).
    answered: Instant,
    /// The endpoint epoch of the last map applied, echoed in every heartbeat.
    endpoint_epoch: i32,
    /// The interactive-query routing's map, whose ownership the broker's maps replace.
    endpoints: Option<Arc<RwLock<EndpointMap>>>,
}

/// The broker's `PartitionsByUserEndpoint` by `application.server`, the entries of one endpoint
/// merged (one entry per member: an instance could run several).
pub fn endpoints_by_server(list: &[EndpointPartitions]) -> BTreeMap<String, BrokerEndpoint> {
    let mut out: BTreeMap<String, BrokerEndpoint> = BTreeMap::new();
    for e in list {
        let entry = out.entry(e.endpoint.server()).or_default();
        for (into, from) in [
            (&mut entry.active, &e.active),
            (&mut entry.standby, &e.standby),
        ] {
            for (topic, partitions) in from {
                // A negative partition is no partition: skipped, not wrapped.
                into.extend(
                    partitions
                        .iter()
                        .filter_map(|p| u32::try_from(*p).ok())
                        .map(|p| (topic.clone(), p)),
                );
            }
        }
    }
    out
}

impl StreamsMember {
    /// A new member id.
    pub fn new_member_id() -> String {
        format!("rill-{:016x}", crate::engine::ids::random_id())
    }

    /// A member as `who` says, with the application's `topology` and the input topics of each
    /// sub-topology by id.
    pub fn new(
        who: Membership,
        topology: TopologyDescription,
        topics: BTreeMap<String, Vec<String>>,
    ) -> Self {
        StreamsMember {
            bootstrap: who.bootstrap,
            group: who.group,
            process_id: format!("rill-process-{:016x}", crate::engine::ids::random_id()),
            member_id: who.member_id,
            instance_id: who.instance_id,
            endpoint: who.endpoint,
            rebalance_timeout: who.rebalance_timeout,
            security: who.security,
            topology,
            topics,
            client: None,
            epoch: 0,
            owned: BTreeSet::new(),
            pending: None,
            interval: FIRST_INTERVAL,
            due: Instant::now(),
            answered: Instant::now(),
            endpoint_epoch: NO_ENDPOINT_EPOCH,
            endpoints: None,
        }
    }

    /// Makes every endpoint map the broker sends decide the owners in `map` (interactive-query
    /// routing under this protocol).
    pub fn route_with(&mut self, map: Arc<RwLock<EndpointMap>>) {
        self.endpoints = Some(map);
    }

    /// Applies the endpoint map of answer `r`, if it carries one. The epoch is echoed only once
    /// its map is applied: an answer with a new epoch and no map makes the broker send it again.
    fn apply_endpoints(&mut self, r: &HeartbeatResponse) {
        let Some(list) = &r.partitions_by_endpoint else {
            return;
        };
        let by_server = endpoints_by_server(list);
        tracing::debug!(epoch = r.endpoint_information_epoch, endpoints = ?by_server.keys().collect::<Vec<_>>(), "streams group endpoint map");
        if let Some(map) = &self.endpoints {
            map.write()
                .set_from_broker(r.endpoint_information_epoch, by_server);
        }
        self.endpoint_epoch = r.endpoint_information_epoch;
    }

    /// The member epoch (0 while joining).
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// (group, member id, member epoch).
    pub fn identity(&self) -> (String, String, i32) {
        (self.group.clone(), self.member_id.clone(), self.epoch)
    }

    /// The partitions of `tasks`.
    fn partitions(&self, tasks: &BTreeSet<(String, i32)>) -> BTreeSet<TopicPartition> {
        tasks
            .iter()
            .flat_map(|(sub, p)| {
                self.topics
                    .get(sub)
                    .into_iter()
                    .flatten()
                    .map(move |t| TopicPartition::new(t.clone(), *p as u32))
            })
            .collect()
    }

    /// Heartbeats when one is due and returns what to change; `session` bounds how long the
    /// member may go without an answer before it counts its tasks as lost.
    pub fn turn(&mut self, session: Duration) -> Result<Option<Change>, StreamsGroupError> {
        if Instant::now() < self.due {
            return Ok(None);
        }
        let answer = self.heartbeat();
        let outcome = match &answer {
            Ok(_) => "ok",
            Err(StreamsGroupError::Broker { .. }) => "refused",
            Err(_) => "failed",
        };
        metrics::counter!(crate::metrics::STREAMS_HEARTBEATS, "outcome" => outcome).increment(1);
        match answer {
            Ok(r) => {
                self.answered = Instant::now();
                self.epoch = r.member_epoch;
                metrics::gauge!(crate::metrics::STREAMS_MEMBER_EPOCH)
                    .set(f64::from(r.member_epoch));
                self.interval = Duration::from_millis(r.heartbeat_interval_ms.max(100) as u64);
                self.due = Instant::now() + self.interval;
                if let Some(status) = r.status.as_ref().filter(|s| !s.is_empty()) {
                    tracing::debug!(?status, "streams group status");
                }
                self.apply_endpoints(&r);
                if let Some(active) = &r.active_tasks {
                    let target: BTreeSet<(String, i32)> = active
                        .iter()
                        .flat_map(|t| t.partitions.iter().map(|p| (t.subtopology.clone(), *p)))
                        .collect();
                    if target != self.owned {
                        self.pending = Some(target);
                    }
                }
                Ok(self.take_change())
            }
            Err(StreamsGroupError::Broker { code, message, .. })
                if code == UNKNOWN_MEMBER_ID || code == FENCED_MEMBER_EPOCH =>
            {
                tracing::warn!(
                    code,
                    ?message,
                    "fenced out of the streams group: its tasks are lost; joining again"
                );
                Ok(Some(self.rejoin()))
            }
            Err(e @ StreamsGroupError::Broker { code, .. }) if !RETRIABLE.contains(&code) => Err(e),
            // Wrong credentials stay wrong: stop, saying which settings to check.
            Err(e @ StreamsGroupError::Authentication { .. }) => Err(e),
            Err(e) => {
                // The coordinator moved or the connection broke: reconnect, unless silent for
                // longer than the session (the broker fenced us meanwhile).
                self.client = None;
                self.due = Instant::now() + RETRY;
                if self.answered.elapsed() > session {
                    tracing::warn!(error = %e, "no heartbeat answer for longer than the session: the tasks are lost; joining again");
                    return Ok(Some(self.rejoin()));
                }
                tracing::debug!(error = %e, "streams group heartbeat failed (retrying)");
                Ok(None)
            }
        }
    }

    /// Forgets the membership: every owned task is lost, the next heartbeat joins anew.
    fn rejoin(&mut self) -> Change {
        let lost = std::mem::take(&mut self.owned);
        self.pending = None;
        self.epoch = 0;
        // A new member gets the whole map again.
        self.endpoint_epoch = NO_ENDPOINT_EPOCH;
        self.client = None;
        self.due = Instant::now();
        Change {
            revoke: self.partitions(&lost).into_iter().collect(),
            assign: Vec::new(),
            lost: true,
        }
    }

    /// The change towards the pending target: revocations first; assignments once nothing
    /// remains to revoke (the broker hands a task over only after its owner reported it gone).
    fn take_change(&mut self) -> Option<Change> {
        let target = self.pending.take()?;
        let gone: BTreeSet<(String, i32)> = self.owned.difference(&target).cloned().collect();
        let new: BTreeSet<(String, i32)> = target.difference(&self.owned).cloned().collect();
        let kept = self.partitions(&target);
        let change = Change {
            // A partition read by a kept task stays (sub-topologies share no inputs, but be safe).
            revoke: self
                .partitions(&gone)
                .into_iter()
                .filter(|tp| !kept.contains(tp))
                .collect(),
            assign: self.partitions(&new).into_iter().collect(),
            lost: false,
        };
        self.owned = target;
        metrics::gauge!(crate::metrics::STREAMS_TASKS, "kind" => "active")
            .set(self.owned.len() as f64);
        // Report the tasks owned now at once.
        self.due = Instant::now();
        (!change.revoke.is_empty() || !change.assign.is_empty()).then_some(change)
    }

    fn client(&mut self) -> Result<&mut StreamsGroupClient, StreamsGroupError> {
        if self.client.is_none() {
            self.client = Some(StreamsGroupClient::connect(
                &self.bootstrap,
                &self.group,
                REQUEST_TIMEOUT,
                &self.security,
            )?);
        }
        self.client.as_mut().ok_or_else(|| StreamsGroupError::Io {
            addr: self.bootstrap.clone(),
            source: std::io::Error::other("no coordinator connection"),
        })
    }

    fn heartbeat(&mut self) -> Result<HeartbeatResponse, StreamsGroupError> {
        let joining = self.epoch == 0;
        let tasks = |owned: &BTreeSet<(String, i32)>| {
            let mut by_sub: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for (sub, p) in owned {
                by_sub.entry(sub.clone()).or_default().push(*p);
            }
            by_sub
                .into_iter()
                .map(|(subtopology, partitions)| TaskIds {
                    subtopology,
                    partitions,
                })
                .collect::<Vec<_>>()
        };
        let heartbeat = Heartbeat {
            group_id: self.group.clone(),
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            endpoint_information_epoch: self.endpoint_epoch,
            instance_id: self.instance_id.clone(),
            rebalance_timeout_ms: if joining {
                i32::try_from(self.rebalance_timeout.as_millis()).unwrap_or(i32::MAX)
            } else {
                -1
            },
            topology: joining.then(|| self.topology.clone()),
            // The broker wants the three lists together; no standby or warm-up tasks yet.
            active_tasks: Some(tasks(&self.owned)),
            standby_tasks: Some(Vec::new()),
            warmup_tasks: Some(Vec::new()),
            process_id: joining.then(|| self.process_id.clone()),
            user_endpoint: if joining { self.endpoint.clone() } else { None },
            shutdown_application: false,
        };
        self.client()?.heartbeat(&heartbeat)
    }

    /// Commits `offsets` at the member epoch; a partition the coordinator refuses (a stale
    /// epoch: the member was fenced) comes back with its error code.
    pub fn commit(
        &mut self,
        offsets: &[OffsetToCommit],
    ) -> Result<Vec<(String, i32, i16)>, StreamsGroupError> {
        let (group, member, epoch) = (self.group.clone(), self.member_id.clone(), self.epoch);
        let r = self
            .client()
            .and_then(|c| c.commit_offsets(&group, &member, epoch, offsets));
        let moved = |answers: &Vec<(String, i32, i16)>| {
            answers.iter().any(|(_, _, code)| RETRIABLE.contains(code))
        };
        if r.as_ref().map_or(true, moved) {
            // Reconnect (to the coordinator as it is now) for the next commit.
            self.client = None;
        }
        r
    }

    /// Leaves the group: with epoch -1 the broker reassigns the tasks at once; a static member
    /// (`group.instance.id`) leaves with -2 and keeps them for its session, for the restart that
    /// rejoins under that id. Best effort.
    pub fn leave(&mut self) {
        if self.epoch <= 0 {
            return;
        }
        self.epoch = if self.instance_id.is_some() { -2 } else { -1 };
        self.owned.clear();
        if let Err(e) = self.heartbeat() {
            tracing::debug!(error = %e, "leaving the streams group failed (the session expires instead)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, active: &[i32], standby: &[i32]) -> EndpointPartitions {
        EndpointPartitions {
            endpoint: Endpoint {
                host: host.into(),
                port: 80,
            },
            active: vec![("t".into(), active.to_vec())],
            standby: vec![("t".into(), standby.to_vec())],
        }
    }

    /// One entry per member: two members of one instance share its endpoint, and their
    /// partitions are merged; a negative partition (malformed) is no partition.
    #[test]
    fn the_entries_of_one_endpoint_are_merged() {
        let by_server = endpoints_by_server(&[
            entry("a", &[0], &[2]),
            entry("b", &[1, -1], &[]),
            entry("a", &[3], &[]),
        ]);
        let parts = |s: &BTreeSet<(String, u32)>| s.iter().map(|(_, p)| *p).collect::<Vec<_>>();
        assert_eq!(by_server.len(), 2);
        assert_eq!(parts(&by_server["a:80"].active), vec![0, 3]);
        assert_eq!(parts(&by_server["a:80"].standby), vec![2]);
        assert_eq!(parts(&by_server["b:80"].active), vec![1]);
    }
}
