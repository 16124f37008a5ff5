//! The client side of the streams group protocol (KIP-1071, `group.protocol=streams`): the
//! broker assigns a streams application's tasks (active, standby, warm-up) and distributes every
//! member's `application.server` endpoint.
//!
//! librdkafka does not speak this protocol, so rill speaks it itself, over one TCP connection
//! to the group coordinator (inside TLS and authenticated with SASL as the `kafka.*` settings
//! say: [`super::wire_security`]): `FindCoordinator` (v4) to find it, then
//! `StreamsGroupHeartbeat` (v0) to join (member epoch 0, with the topology), to heartbeat (the
//! epoch the broker gave, the tasks owned) and to leave (epoch -1), and `OffsetCommit` (v9) to
//! commit offsets fenced by the member epoch. The messages follow the
//! JSON schemas of apache/kafka (`clients/src/main/resources/common/message/`): flexible
//! versions, so compact strings and arrays and tagged fields.
//!
//! Status (issue 44): the runtime runs on it (`kafka::streams_member`), tested against the
//! broker (`tests/kafka_streams_group.rs`); each answer's endpoint map (`PartitionsByUserEndpoint`
//! at `EndpointInformationEpoch`) routes interactive queries. No standbys yet.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use rill_topology::{Topic, Topology};

use super::wire_security::{authenticate, Stream, WireSecurity};
use crate::engine::changelog::changelog_topic;

/// `FindCoordinator`'s API key.
const FIND_COORDINATOR: i16 = 10;
/// `OffsetCommit`'s API key.
const OFFSET_COMMIT: i16 = 8;
/// `StreamsGroupHeartbeat`'s API key.
const STREAMS_GROUP_HEARTBEAT: i16 = 88;
/// `SaslHandshake`'s API key (v1: not a flexible version).
const SASL_HANDSHAKE: i16 = 17;
/// `SaslAuthenticate`'s API key (v2: flexible).
const SASL_AUTHENTICATE: i16 = 36;
/// Longest a response may be (a guard against a peer that is not a Kafka broker).
const MAX_RESPONSE: usize = 64 << 20;

/// Why a call of the streams group protocol failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamsGroupError {
    /// The connection failed.
    #[error("streams group protocol: cannot talk to {addr}: {source}; check bootstrap.servers and that the broker runs")]
    Io {
        /// The broker.
        addr: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The broker's answer did not decode.
    #[error("streams group protocol: malformed {what} from {addr}: {detail}; the broker may not support KIP-1071 (Apache Kafka 4.2 or later has it)")]
    Malformed {
        /// The message.
        what: &'static str,
        /// The broker.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The TLS handshake failed.
    #[error("streams group protocol: TLS with {addr} failed: {detail}; check kafka.ssl.ca.location and that the listener speaks kafka.security.protocol")]
    Tls {
        /// The broker.
        addr: String,
        /// Why.
        detail: String,
    },
    /// SASL authentication failed.
    #[error("streams group protocol: cannot authenticate to Kafka at {addr} with {mechanism}: {detail}; check kafka.sasl.mechanism, kafka.sasl.username and kafka.sasl.password")]
    Authentication {
        /// The broker.
        addr: String,
        /// The mechanism.
        mechanism: &'static str,
        /// Why (never the password).
        detail: String,
    },
    /// The broker answered with an error code.
    #[error("streams group protocol: {api} failed with error {code}{}", message.as_ref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Broker {
        /// The call.
        api: &'static str,
        /// Kafka's error code.
        code: i16,
        /// The broker's message, if any.
        message: Option<String>,
    },
}

/// A topic the broker creates or checks for the group (Kafka's `TopicInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    /// The topic.
    pub name: String,
    /// Its partition count (0: the broker decides, as for changelogs).
    pub partitions: i32,
    /// Its replication factor (0: the broker's default).
    pub replication_factor: i16,
    /// Topic configs.
    pub configs: Vec<(String, String)>,
}

/// Source topics that must be co-partitioned (indexes into the sub-topology's lists).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopartitionGroup {
    /// Indexes into [`Subtopology::source_topics`].
    pub source_topics: Vec<i16>,
    /// Indexes into [`Subtopology::repartition_source_topics`].
    pub repartition_source_topics: Vec<i16>,
}

/// One sub-topology as the broker sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subtopology {
    /// Its id (rill's index, as a string).
    pub id: String,
    /// The user topics it reads.
    pub source_topics: Vec<String>,
    /// The repartition topics it writes.
    pub repartition_sink_topics: Vec<String>,
    /// The repartition topics it reads.
    pub repartition_source_topics: Vec<TopicInfo>,
    /// Its stores' changelogs.
    pub state_changelog_topics: Vec<TopicInfo>,
    /// Its co-partitioned inputs.
    pub copartition_groups: Vec<CopartitionGroup>,
}

/// The topology a member sends when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyDescription {
    /// Its epoch (the same for every member of one version of the application).
    pub epoch: i32,
    /// Its sub-topologies.
    pub subtopologies: Vec<Subtopology>,
}

impl TopologyDescription {
    /// The description of `topology` of application `application_id`; `partitions` holds the
    /// partition count of each internal topic (resolved names), as the runtime creates them.
    pub fn of(
        topology: &Topology,
        application_id: &str,
        partitions: &BTreeMap<String, u32>,
    ) -> Self {
        let info = |name: String, n: i32| TopicInfo {
            name,
            partitions: n,
            replication_factor: 0,
            configs: Vec::new(),
        };
        let subtopologies = topology
            .sub_topologies()
            .iter()
            .map(|st| {
                let (mut sources, mut repartitions) = (Vec::new(), Vec::new());
                for (t, _) in &st.sources {
                    let name = t.resolve(application_id);
                    match t {
                        Topic::External(_) => sources.push(name),
                        Topic::Internal(_) => {
                            let n = partitions.get(&name).copied().unwrap_or(0) as i32;
                            repartitions.push(info(name, n));
                        }
                    }
                }
                let copartition_groups = if st.sources.len() > 1 {
                    vec![CopartitionGroup {
                        source_topics: (0..sources.len() as i16).collect(),
                        repartition_source_topics: (0..repartitions.len() as i16).collect(),
                    }]
                } else {
                    Vec::new()
                };
                Subtopology {
                    id: st.id.to_string(),
                    source_topics: sources,
                    repartition_sink_topics: st
                        .sinks
                        .iter()
                        .filter(|t| t.is_internal())
                        .map(|t| t.resolve(application_id))
                        .collect(),
                    repartition_source_topics: repartitions,
                    state_changelog_topics: st
                        .logged
                        .iter()
                        .map(|s| info(changelog_topic(application_id, s), 0))
                        .collect(),
                    copartition_groups,
                }
            })
            .collect();
        TopologyDescription {
            epoch: 0,
            subtopologies,
        }
    }
}

/// Tasks of one sub-topology: its id and the partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaskIds {
    /// The sub-topology's id.
    pub subtopology: String,
    /// The partitions.
    pub partitions: Vec<i32>,
}

/// A member's endpoint (`application.server`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Host.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl Endpoint {
    /// `host:port` as `application.server` spells it (an IPv6 host in brackets).
    pub fn server(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }
}

/// One heartbeat (`StreamsGroupHeartbeatRequest` v0); `None` fields mean "unchanged".
#[derive(Clone, Debug, Default)]
pub struct Heartbeat {
    /// The group: the application id.
    pub group_id: String,
    /// The member's id, chosen by the member for its whole life.
    pub member_id: String,
    /// 0 to join, the broker's epoch afterwards, -1 to leave, -2 for a static member that
    /// will rejoin.
    pub member_epoch: i32,
    /// The endpoint epoch last received (-1: none yet, so the broker sends every endpoint).
    pub endpoint_information_epoch: i32,
    /// `group.instance.id` (static membership).
    pub instance_id: Option<String>,
    /// How long the coordinator waits for a revocation (-1: unchanged).
    pub rebalance_timeout_ms: i32,
    /// The topology: only when joining.
    pub topology: Option<TopologyDescription>,
    /// Active tasks owned.
    pub active_tasks: Option<Vec<TaskIds>>,
    /// Standby tasks owned.
    pub standby_tasks: Option<Vec<TaskIds>>,
    /// Warm-up tasks owned.
    pub warmup_tasks: Option<Vec<TaskIds>>,
    /// The process (one per instance).
    pub process_id: Option<String>,
    /// `application.server`.
    pub user_endpoint: Option<Endpoint>,
    /// Ask every member to shut down.
    pub shutdown_application: bool,
}

/// Partitions an endpoint's member materializes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPartitions {
    /// The member's endpoint.
    pub endpoint: Endpoint,
    /// (topic, partitions) of its active tasks.
    pub active: Vec<(String, Vec<i32>)>,
    /// (topic, partitions) of its standby tasks.
    pub standby: Vec<(String, Vec<i32>)>,
}

/// The broker's answer to a heartbeat (`StreamsGroupHeartbeatResponse` v0); `None`: unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatResponse {
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// The broker's message.
    pub error_message: Option<String>,
    /// The member id.
    pub member_id: String,
    /// The member epoch.
    pub member_epoch: i32,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: i32,
    /// The lag a warm-up may have and count as caught up.
    pub acceptable_recovery_lag: i32,
    /// How often to send task offsets.
    pub task_offset_interval_ms: i32,
    /// Group status codes with their detail (1: missing source topics, 3: missing internal
    /// topics, 4: shutdown requested, ...).
    pub status: Option<Vec<(i8, String)>>,
    /// Active tasks assigned.
    pub active_tasks: Option<Vec<TaskIds>>,
    /// Standby tasks assigned.
    pub standby_tasks: Option<Vec<TaskIds>>,
    /// Warm-up tasks assigned.
    pub warmup_tasks: Option<Vec<TaskIds>>,
    /// The group's endpoint epoch: the member echoes it in its next heartbeat, and the broker
    /// sends [`Self::partitions_by_endpoint`] again only once the group's differs.
    pub endpoint_information_epoch: i32,
    /// Every member's endpoint with its partitions (one entry per member: several may name one
    /// endpoint); `None`: unchanged since the epoch the member echoed.
    pub partitions_by_endpoint: Option<Vec<EndpointPartitions>>,
}

/// Encodes flexible-version Kafka fields.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn i8(&mut self, v: i8) {
        self.0.push(v as u8);
    }
    fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn uvarint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn string(&mut self, s: &str) {
        self.uvarint(s.len() as u64 + 1);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.uvarint(0),
        }
    }
    fn array<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) {
        self.uvarint(items.len() as u64 + 1);
        for i in items {
            each(self, i);
        }
    }
    fn nullable_array<T>(&mut self, items: Option<&[T]>, each: impl FnMut(&mut Self, &T)) {
        match items {
            Some(items) => self.array(items, each),
            None => self.uvarint(0),
        }
    }
    /// No tagged fields.
    fn tags(&mut self) {
        self.uvarint(0);
    }
    fn topic_info(&mut self, t: &TopicInfo) {
        self.string(&t.name);
        self.i32(t.partitions);
        self.i16(t.replication_factor);
        self.array(&t.configs, |w, (k, v)| {
            w.string(k);
            w.string(v);
            w.tags();
        });
        self.tags();
    }
    fn task_ids(&mut self, t: &TaskIds) {
        self.string(&t.subtopology);
        self.array(&t.partitions, |w, p| w.i32(*p));
        self.tags();
    }
}

/// Decodes flexible-version Kafka fields.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let end =
            end.ok_or_else(|| format!("{n} bytes needed at {} of {}", self.pos, self.buf.len()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn i8(&mut self) -> Result<i8, String> {
        Ok(self.fixed::<1>()?[0] as i8)
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.fixed()?))
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.fixed()?))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.fixed()?))
    }
    fn uvarint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.fixed::<1>()?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint longer than 64 bits".into())
    }
    fn nullable_string(&mut self) -> Result<Option<String>, String> {
        match self.uvarint()? {
            0 => Ok(None),
            n => {
                let bytes = self.take(n as usize - 1)?;
                String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|e| e.to_string())
            }
        }
    }
    fn string(&mut self) -> Result<String, String> {
        self.nullable_string()?
            .ok_or_else(|| "null where a string must be".to_string())
    }
    fn nullable_array<T>(
        &mut self,
        mut each: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Option<Vec<T>>, String> {
        match self.uvarint()? {
            0 => Ok(None),
            n => (0..n - 1)
                .map(|_| each(self))
                .collect::<Result<_, _>>()
                .map(Some),
        }
    }
    fn array<T>(
        &mut self,
        each: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        self.nullable_array(each)?
            .ok_or_else(|| "null where an array must be".to_string())
    }
    /// Skips tagged fields (none is read).
    fn tags(&mut self) -> Result<(), String> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.take(size)?;
        }
        Ok(())
    }
    fn task_ids(&mut self) -> Result<TaskIds, String> {
        let subtopology = self.string()?;
        let partitions = self.array(|r| r.i32())?;
        self.tags()?;
        Ok(TaskIds {
            subtopology,
            partitions,
        })
    }
    fn endpoint(&mut self) -> Result<Endpoint, String> {
        let host = self.string()?;
        let port = self.u16()?;
        self.tags()?;
        Ok(Endpoint { host, port })
    }
    fn topic_partitions(&mut self) -> Result<(String, Vec<i32>), String> {
        let topic = self.string()?;
        let partitions = self.array(|r| r.i32())?;
        self.tags()?;
        Ok((topic, partitions))
    }
}

impl Heartbeat {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.string(&self.group_id);
        w.string(&self.member_id);
        w.i32(self.member_epoch);
        w.i32(self.endpoint_information_epoch);
        w.nullable_string(self.instance_id.as_deref());
        w.nullable_string(None); // rack id
        w.i32(self.rebalance_timeout_ms);
        match &self.topology {
            None => w.i8(-1),
            Some(t) => {
                w.i8(1);
                w.i32(t.epoch);
                w.array(&t.subtopologies, |w, s| {
                    w.string(&s.id);
                    w.array(&s.source_topics, |w, t| w.string(t));
                    w.array::<String>(&[], |w, t| w.string(t)); // source topic regexes
                    w.array(&s.state_changelog_topics, Writer::topic_info);
                    w.array(&s.repartition_sink_topics, |w, t| w.string(t));
                    w.array(&s.repartition_source_topics, Writer::topic_info);
                    w.array(&s.copartition_groups, |w, g| {
                        w.array(&g.source_topics, |w, i| w.i16(*i));
                        w.array::<i16>(&[], |w, i| w.i16(*i)); // regexes
                        w.array(&g.repartition_source_topics, |w, i| w.i16(*i));
                        w.tags();
                    });
                    w.tags();
                });
                w.tags();
            }
        }
        w.nullable_array(self.active_tasks.as_deref(), Writer::task_ids);
        w.nullable_array(self.standby_tasks.as_deref(), Writer::task_ids);
        w.nullable_array(self.warmup_tasks.as_deref(), Writer::task_ids);
        w.nullable_string(self.process_id.as_deref());
        match &self.user_endpoint {
            None => w.i8(-1),
            Some(e) => {
                w.i8(1);
                w.string(&e.host);
                w.u16(e.port);
                w.tags();
            }
        }
        w.nullable_array::<(String, String)>(None, |_, _| {}); // client tags
        w.nullable_array::<()>(None, |_, _| {}); // task offsets
        w.nullable_array::<()>(None, |_, _| {}); // task end offsets
        w.i8(i8::from(self.shutdown_application));
        w.tags();
        w.0
    }
}

impl HeartbeatResponse {
    fn decode(body: &[u8]) -> Result<Self, String> {
        let mut r = Reader { buf: body, pos: 0 };
        let _throttle = r.i32()?;
        let error_code = r.i16()?;
        let error_message = r.nullable_string()?;
        let member_id = r.string()?;
        let member_epoch = r.i32()?;
        let heartbeat_interval_ms = r.i32()?;
        let acceptable_recovery_lag = r.i32()?;
        let task_offset_interval_ms = r.i32()?;
        let status = r.nullable_array(|r| {
            let code = r.i8()?;
            let detail = r.string()?;
            r.tags()?;
            Ok((code, detail))
        })?;
        let active_tasks = r.nullable_array(Reader::task_ids)?;
        let standby_tasks = r.nullable_array(Reader::task_ids)?;
        let warmup_tasks = r.nullable_array(Reader::task_ids)?;
        let endpoint_information_epoch = r.i32()?;
        let partitions_by_endpoint = r.nullable_array(|r| {
            let endpoint = r.endpoint()?;
            let active = r.array(Reader::topic_partitions)?;
            let standby = r.array(Reader::topic_partitions)?;
            r.tags()?;
            Ok(EndpointPartitions {
                endpoint,
                active,
                standby,
            })
        })?;
        r.tags()?;
        // Left-over bytes mean a field was missed: everything after it was read wrongly.
        if r.pos != body.len() {
            return Err(format!(
                "{} bytes left after the last field",
                body.len() - r.pos
            ));
        }
        Ok(HeartbeatResponse {
            error_code,
            error_message,
            member_id,
            member_epoch,
            heartbeat_interval_ms,
            acceptable_recovery_lag,
            task_offset_interval_ms,
            status,
            active_tasks,
            standby_tasks,
            warmup_tasks,
            endpoint_information_epoch,
            partitions_by_endpoint,
        })
    }
}

/// One connection to a broker (inside TLS and authenticated as `kafka.*` says): framed
/// requests with header v2 (v1 for the non-flexible `SaslHandshake`), responses with header v1
/// (v0).
struct Connection {
    stream: Stream,
    addr: String,
    correlation: i32,
}

impl Connection {
    fn open(
        addr: &str,
        timeout: Duration,
        security: &WireSecurity,
    ) -> Result<Self, StreamsGroupError> {
        let io = |source| StreamsGroupError::Io {
            addr: addr.to_string(),
            source,
        };
        let mut last = std::io::Error::other("no address");
        let mut tcp = None;
        for a in addr.to_socket_addrs().map_err(io)? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(stream) => {
                    tcp = Some(stream);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = tcp.ok_or_else(|| io(last))?;
        tcp.set_read_timeout(Some(timeout)).map_err(io)?;
        tcp.set_write_timeout(Some(timeout)).map_err(io)?;
        // The host as the certificate must name it: `addr` without its port or brackets.
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let stream = security
            .wrap(tcp, host)
            .map_err(|detail| StreamsGroupError::Tls {
                addr: addr.to_string(),
                detail,
            })?;
        let mut conn = Connection {
            stream,
            addr: addr.to_string(),
            correlation: 0,
        };
        if let Some(sasl) = security.sasl() {
            conn.authenticate(sasl)?;
        }
        Ok(conn)
    }

    /// `SaslHandshake` v1 naming the mechanism, then its conversation in `SaslAuthenticate` v2
    /// requests.
    fn authenticate(&mut self, sasl: &super::wire_security::Sasl) -> Result<(), StreamsGroupError> {
        let mechanism = sasl.mechanism.name();
        let refused = |addr: &str, detail: String| StreamsGroupError::Authentication {
            addr: addr.to_string(),
            mechanism,
            detail,
        };
        let mut w = Writer::default();
        w.i16(mechanism.len() as i16);
        w.0.extend_from_slice(mechanism.as_bytes());
        let body = self.call_as(SASL_HANDSHAKE, 1, &w.0, false)?;
        let mut r = Reader { buf: &body, pos: 0 };
        let code = r.i16().map_err(|d| refused(&self.addr, d))?;
        if code != 0 {
            // 33: UNSUPPORTED_SASL_MECHANISM; the broker lists the ones it has (int16 strings).
            let mut enabled = Vec::new();
            if let Ok(n) = r.i32() {
                for _ in 0..n.max(0) {
                    let Ok(len) = r.i16() else { break };
                    let Ok(name) = r.take(len.max(0) as usize) else {
                        break;
                    };
                    enabled.push(String::from_utf8_lossy(name).into_owned());
                }
            }
            return Err(refused(
                &self.addr,
                format!(
                    "the broker refused the mechanism (error {code}; it has {})",
                    enabled.join(", ")
                ),
            ));
        }
        let addr = self.addr.clone();
        authenticate(sasl, |message| {
            let mut w = Writer::default();
            w.uvarint(message.len() as u64 + 1);
            w.0.extend_from_slice(message);
            w.tags();
            let body = self
                .call(SASL_AUTHENTICATE, 2, &w.0)
                .map_err(|e| e.to_string())?;
            let mut r = Reader { buf: &body, pos: 0 };
            let code = r.i16()?;
            let message = r.nullable_string()?;
            if code != 0 {
                return Err(message.unwrap_or_else(|| format!("error {code}")));
            }
            let n = r.uvarint()?;
            let bytes = r.take(n.saturating_sub(1) as usize)?;
            Ok(bytes.to_vec())
        })
        .map_err(|detail| refused(&addr, detail))
    }

    /// Sends a request of `api` at `version` (a flexible version) and returns the response's
    /// body.
    fn call(&mut self, api: i16, version: i16, body: &[u8]) -> Result<Vec<u8>, StreamsGroupError> {
        self.call_as(api, version, body, true)
    }

    /// [`Self::call`] for a `flexible` version or not (request header v2 or v1, response
    /// header v1 or v0).
    fn call_as(
        &mut self,
        api: i16,
        version: i16,
        body: &[u8],
        flexible: bool,
    ) -> Result<Vec<u8>, StreamsGroupError> {
        self.correlation = self.correlation.wrapping_add(1);
        let mut w = Writer::default();
        w.i16(api);
        w.i16(version);
        w.i32(self.correlation);
        // The client id of headers v1 and v2 is a classic nullable string (int16 length).
        let client = b"rill";
        w.i16(client.len() as i16);
        w.0.extend_from_slice(client);
        if flexible {
            w.tags();
        }
        w.0.extend_from_slice(body);
        let io = |source| StreamsGroupError::Io {
            addr: self.addr.clone(),
            source,
        };
        let mut frame = (w.0.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&w.0);
        self.stream.write_all(&frame).map_err(io)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(io)?;
        let size = i32::from_be_bytes(size);
        let malformed = |detail: String| StreamsGroupError::Malformed {
            what: "response",
            addr: self.addr.clone(),
            detail,
        };
        if size < 4 || size as usize > MAX_RESPONSE {
            return Err(malformed(format!("a response of {size} bytes")));
        }
        let mut response = vec![0u8; size as usize];
        self.stream.read_exact(&mut response).map_err(io)?;
        let mut r = Reader {
            buf: &response,
            pos: 0,
        };
        let correlation = r.i32().map_err(malformed)?;
        if correlation != self.correlation {
            return Err(malformed(format!(
                "correlation id {correlation}, expected {}",
                self.correlation
            )));
        }
        if flexible {
            r.tags().map_err(malformed)?;
        }
        Ok(response[r.pos..].to_vec())
    }
}

/// One offset to commit: topic, partition, the next offset to read, metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetToCommit {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to read.
    pub offset: i64,
    /// Kept with the offset (rill's per-range progress).
    pub metadata: Option<String>,
}

/// A member's connection to its streams group's coordinator.
pub struct StreamsGroupClient {
    coordinator: Connection,
}

impl StreamsGroupClient {
    /// Finds the coordinator of `group` through the first of `bootstrap` (comma-separated
    /// `host:port`) that answers, and connects to it.
    pub fn connect(
        bootstrap: &str,
        group: &str,
        timeout: Duration,
        security: &WireSecurity,
    ) -> Result<Self, StreamsGroupError> {
        let mut last = None;
        for broker in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
        {
            match Self::via(broker, group, timeout, security) {
                Ok(c) => return Ok(c),
                // Wrong credentials or certificates are wrong at every broker.
                Err(e @ StreamsGroupError::Authentication { .. }) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StreamsGroupError::Io {
            addr: bootstrap.to_string(),
            source: std::io::Error::other("bootstrap.servers is empty"),
        }))
    }

    fn via(
        broker: &str,
        group: &str,
        timeout: Duration,
        security: &WireSecurity,
    ) -> Result<Self, StreamsGroupError> {
        let mut conn = Connection::open(broker, timeout, security)?;
        let mut w = Writer::default();
        w.i8(0); // key type: group
        w.array(&[group], |w, g| w.string(g));
        w.tags();
        let body = conn.call(FIND_COORDINATOR, 4, &w.0)?;
        let malformed = |detail: String| StreamsGroupError::Malformed {
            what: "FindCoordinator response",
            addr: broker.to_string(),
            detail,
        };
        let mut r = Reader { buf: &body, pos: 0 };
        let _throttle = r.i32().map_err(malformed)?;
        let coordinators = r
            .array(|r| {
                let _key = r.string()?;
                let _node = r.i32()?;
                let host = r.string()?;
                let port = r.i32()?;
                let code = r.i16()?;
                let message = r.nullable_string()?;
                r.tags()?;
                Ok((host, port, code, message))
            })
            .map_err(malformed)?;
        let (host, port, code, message) = coordinators
            .into_iter()
            .next()
            .ok_or_else(|| malformed("no coordinator".into()))?;
        if code != 0 {
            return Err(StreamsGroupError::Broker {
                api: "FindCoordinator",
                code,
                message,
            });
        }
        Ok(StreamsGroupClient {
            coordinator: Connection::open(&format!("{host}:{port}"), timeout, security)?,
        })
    }

    /// Commits `offsets` for `group` as member `member_id` at `member_epoch` (`OffsetCommit`
    /// v9, the first version a member of a KIP-848-style group may use): the coordinator
    /// refuses a stale epoch, as it refuses a stale generation in the classic protocol. Returns
    /// each partition's error code (0: committed).
    pub fn commit_offsets(
        &mut self,
        group: &str,
        member_id: &str,
        member_epoch: i32,
        offsets: &[OffsetToCommit],
    ) -> Result<Vec<(String, i32, i16)>, StreamsGroupError> {
        let mut by_topic: BTreeMap<&str, Vec<&OffsetToCommit>> = BTreeMap::new();
        for o in offsets {
            by_topic.entry(&o.topic).or_default().push(o);
        }
        let topics: Vec<(&str, Vec<&OffsetToCommit>)> = by_topic.into_iter().collect();
        let mut w = Writer::default();
        w.string(group);
        w.i32(member_epoch);
        w.string(member_id);
        w.nullable_string(None); // group instance id
        w.array(&topics, |w, (topic, partitions)| {
            w.string(topic);
            w.array(partitions, |w, o| {
                w.i32(o.partition);
                w.0.extend_from_slice(&o.offset.to_be_bytes());
                w.i32(-1); // leader epoch
                w.nullable_string(o.metadata.as_deref());
                w.tags();
            });
            w.tags();
        });
        w.tags();
        let body = self.coordinator.call(OFFSET_COMMIT, 9, &w.0)?;
        let mut r = Reader { buf: &body, pos: 0 };
        let decoded = (|| {
            let _throttle = r.i32()?;
            let topics = r.array(|r| {
                let topic = r.string()?;
                let partitions = r.array(|r| {
                    let partition = r.i32()?;
                    let code = r.i16()?;
                    r.tags()?;
                    Ok((partition, code))
                })?;
                r.tags()?;
                Ok((topic, partitions))
            })?;
            r.tags()?;
            Ok::<_, String>(topics)
        })();
        let topics = decoded.map_err(|detail| StreamsGroupError::Malformed {
            what: "OffsetCommit response",
            addr: self.coordinator.addr.clone(),
            detail,
        })?;
        Ok(topics
            .into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |(p, c)| (t.clone(), p, c)))
            .collect())
    }

    /// Sends `heartbeat` and returns the broker's answer; an error code in it is returned as
    /// [`StreamsGroupError::Broker`].
    pub fn heartbeat(
        &mut self,
        heartbeat: &Heartbeat,
    ) -> Result<HeartbeatResponse, StreamsGroupError> {
        let body = self
            .coordinator
            .call(STREAMS_GROUP_HEARTBEAT, 0, &heartbeat.encode())?;
        let response =
            HeartbeatResponse::decode(&body).map_err(|detail| StreamsGroupError::Malformed {
                what: "StreamsGroupHeartbeat response",
                addr: self.coordinator.addr.clone(),
                detail,
            })?;
        if response.error_code != 0 {
            return Err(StreamsGroupError::Broker {
                api: "StreamsGroupHeartbeat",
                code: response.error_code,
                message: response.error_message,
            });
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_compact_fields_round_trip() {
        let mut w = Writer::default();
        for v in [0u64, 1, 127, 128, 300, 16_383, 16_384, u32::MAX as u64] {
            w.uvarint(v);
        }
        w.string("streams");
        w.nullable_string(None);
        w.array(&[3i32, -1], |w, p| w.i32(*p));
        w.nullable_array::<i32>(None, |w, p| w.i32(*p));
        w.tags();
        let mut r = Reader { buf: &w.0, pos: 0 };
        for v in [0u64, 1, 127, 128, 300, 16_383, 16_384, u32::MAX as u64] {
            assert_eq!(r.uvarint().unwrap(), v);
        }
        assert_eq!(r.string().unwrap(), "streams");
        assert_eq!(r.nullable_string().unwrap(), None);
        assert_eq!(r.array(|r| r.i32()).unwrap(), vec![3, -1]);
        assert_eq!(r.nullable_array(|r| r.i32()).unwrap(), None);
        r.tags().unwrap();
        assert_eq!(r.pos, w.0.len());
        assert!(r.i8().is_err(), "reading past the end is an error");
    }

    #[test]
    fn a_response_decodes_field_by_field() {
        let mut w = Writer::default();
        w.i32(0);
        w.i16(0);
        w.nullable_string(None);
        w.string("m-1");
        w.i32(3);
        w.i32(5000);
        w.i32(1000);
        w.i32(60_000);
        w.array(&[(3i8, "missing internal topics")], |w, (c, d)| {
            w.i8(*c);
            w.string(d);
            w.tags();
        });
        let tasks = [TaskIds {
            subtopology: "0".into(),
            partitions: vec![0, 2],
        }];
        w.nullable_array(Some(&tasks[..]), Writer::task_ids);
        w.nullable_array::<TaskIds>(None, Writer::task_ids);
        w.nullable_array(Some(&[][..]), Writer::task_ids);
        w.i32(7); // endpoint information epoch
                  // Two members of one process share an endpoint: two entries.
        let entries = [
            ("10.0.0.1", 8080, vec![("in", vec![0i32, 2])], vec![]),
            (
                "10.0.0.2",
                8080,
                vec![("in", vec![1])],
                vec![("in", vec![0])],
            ),
            ("10.0.0.1", 8080, vec![("in", vec![3])], vec![]),
        ];
        w.array(&entries, |w, (host, port, active, standby)| {
            w.string(host);
            w.u16(*port);
            w.tags();
            for list in [active, standby] {
                w.array(list, |w, (t, ps)| {
                    w.string(t);
                    w.array(ps, |w, p| w.i32(*p));
                    w.tags();
                });
            }
            w.tags();
        });
        w.tags();
        let r = HeartbeatResponse::decode(&w.0).unwrap();
        assert_eq!(r.member_id, "m-1");
        assert_eq!(r.member_epoch, 3);
        assert_eq!(r.heartbeat_interval_ms, 5000);
        assert_eq!(r.status, Some(vec![(3, "missing internal topics".into())]));
        assert_eq!(r.active_tasks, Some(tasks.to_vec()));
        assert_eq!(r.standby_tasks, None);
        assert_eq!(r.warmup_tasks, Some(Vec::new()));
        assert_eq!(r.endpoint_information_epoch, 7);
        let endpoints = r.partitions_by_endpoint.unwrap();
        assert_eq!(endpoints.len(), 3);
        assert_eq!(endpoints[0].endpoint.server(), "10.0.0.1:8080");
        assert_eq!(endpoints[0].active, vec![("in".to_string(), vec![0, 2])]);
        assert_eq!(endpoints[1].endpoint.server(), "10.0.0.2:8080");
        assert_eq!(endpoints[1].standby, vec![("in".to_string(), vec![0])]);
        assert_eq!(endpoints[2].active, vec![("in".to_string(), vec![3])]);
        assert!(HeartbeatResponse::decode(&w.0[..w.0.len() - 3]).is_err());
        // A field too many (or one the decoder missed) is an error, not a silent misread.
        let mut longer = w.0.clone();
        longer.push(0);
        assert!(HeartbeatResponse::decode(&longer).is_err());
    }

    /// The map unchanged since the echoed epoch: a null list after the epoch.
    #[test]
    fn an_unchanged_endpoint_map_is_none_with_the_epoch_kept() {
        let mut w = Writer::default();
        w.i32(0);
        w.i16(0);
        w.nullable_string(None);
        w.string("m-1");
        for v in [4, 5000, 1000, 60_000] {
            w.i32(v);
        }
        for _ in 0..4 {
            w.nullable_array::<TaskIds>(None, Writer::task_ids); // status and the three task lists
        }
        w.i32(12);
        w.nullable_array::<TaskIds>(None, Writer::task_ids);
        w.tags();
        let r = HeartbeatResponse::decode(&w.0).unwrap();
        assert_eq!(r.endpoint_information_epoch, 12);
        assert_eq!(r.partitions_by_endpoint, None);
        assert_eq!(r.active_tasks, None);
    }

    #[test]
    fn an_ipv6_endpoint_is_bracketed() {
        let e = Endpoint {
            host: "::1".into(),
            port: 80,
        };
        assert_eq!(e.server(), "[::1]:80");
    }
}
