//! The interactive-query routes on the HTTP endpoint (`interactive.queries.enabled`):
//!
//! - `GET /stores/{store}/keys/{key}`: the value of one key of a key-value store;
//! - `GET /stores/{store}/range?from=&to=&limit=`: the entries of a key-value store from `from` to
//!   `to` (both included, each optional), in key order, at most `limit` (default
//!   [`DEFAULT_LIMIT`]);
//! - `GET /stores/{store}/windows/{key}?from=&to=`: the windows of one key of a window store
//!   starting from `from` to `to` (ms, both included, each optional).
//!
//! Keys in URLs and values in answers go through the store's [`Rendering`]s. Every answer is
//! JSON. 200 says which partition and key range served each value; 404 an unknown store
//! (`"error": "unknown_store"`) or an absent key (`"error": "key_not_found"`); 400 a key or
//! parameter that does not parse, or a route of another kind of store; 503 with `Retry-After`
//! a store that restores (or a read that found its ranges busy or moving). Reads block (they
//! wait for a range's batch in progress, see [`super`]), so they run off the async workers.
//!
//! - `GET /metadata`: this instance's `application.server` and every instance the endpoint map
//!   knows ([`super::metadata`]), with the partitions and stores each owns.
//!
//! The key routes (`keys`, `windows`) first ask [`Locate`] who owns the key. Without an
//! endpoint map ([`LocalOnly`]) every local partition's range of the key is read. With one
//! ([`super::Cluster`]):
//!
//! - the key's partition (where the store's input puts it: murmur2 of the serialized key for a
//!   user topic, rill's key hash for a repartition topic read alone; see
//!   [`super::StoreSource::kafka_partitioned`]) runs here: the key's range is read in every local partition (as
//!   without a map), and the read checks under the engine lock that the key's partition is
//!   still assigned here (else the answer is as below for a partition owned elsewhere);
//! - another instance owns it: the request is forwarded there (proxy) with the header
//!   [`FORWARDED_HEADER`] and the caller's `Authorization`, and its answer relayed with
//!   `"forwarded_by"` added; a request that carries the header is never forwarded again (one
//!   hop at most): it answers **404** `"error": "moved"` with `"owner"`;
//! - nobody is known to own it (a rebalance in progress, an owner without
//!   `application.server`), or the owner does not answer: **503** with `Retry-After`
//!   (`owner_unknown`, `owner_unreachable`).
//!
//! Every key answer names the instance that read it (`served_by.instance`, header
//! [`SERVED_BY_HEADER`]). A range scan asks every other owner of the store's partitions once
//! ([`Locate::scan_plan`]; marked forwarded, so each answers locally) and merges their entries
//! with its own in key-byte order.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rill_topology::store::StoreKind;
use rill_topology::window::store::WindowBytes;
use serde_json::{json, Value};

use super::{EngineAccess, QueryError, Served, StoreReader, StoreRenderings};

/// Entries a range answer holds unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 1000;

/// Who answers for a key of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// This instance, from its local ranges: of the key's partition only when known.
    Local(Option<u32>),
    /// Another instance (`host:port`, as its `application.server` says) owns the key's
    /// partition.
    Elsewhere {
        /// Its `application.server`.
        server: String,
        /// The key's partition.
        partition: u32,
    },
    /// No instance is known to own the key's partition (a rebalance in progress, an owner
    /// without `application.server`, an endpoint map still reading).
    Unknown {
        /// The key's partition.
        partition: u32,
    },
}

/// Decides which instance answers for a key; [`super::Cluster`] across instances.
pub trait Locate: Send + Sync {
    /// The instance that owns `key` (serialized) of `store`.
    fn owner(&self, store: &str, key: &[u8]) -> Owner;

    /// This instance's `application.server`, when set.
    fn me(&self) -> Option<String> {
        None
    }

    /// Whether the endpoint map read its whole topic once, and every published instance;
    /// `None` when this instance keeps no endpoint map.
    fn metadata(&self) -> Option<(bool, Vec<super::StreamsMetadata>)> {
        None
    }

    /// Who a scan of `store` must ask besides this instance: the other owners of its
    /// partitions, and the partitions nobody is known to own.
    fn scan_plan(&self, _store: &str) -> ScanPlan {
        ScanPlan::default()
    }
}

/// The instances a scan visits (see [`Locate::scan_plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPlan {
    /// Other instances that own partitions of the store (`application.server`).
    pub others: Vec<String>,
    /// Partitions of the store no instance is known to own.
    pub unknown: Vec<u32>,
}

/// Every key is answered from this instance's ranges.
pub struct LocalOnly;

impl Locate for LocalOnly {
    fn owner(&self, _store: &str, _key: &[u8]) -> Owner {
        Owner::Local(None)
    }
}

/// The header that marks a request one instance forwarded to another (its value: the
/// forwarding instance's `application.server`, or `unknown`). A forwarded request is never
/// forwarded again: one hop at most.
pub const FORWARDED_HEADER: &str = "x-rill-forwarded-by";

/// The header of every key answer that names the instance that read the value.
pub const SERVED_BY_HEADER: &str = "x-rill-served-by";

/// How long a forward waits to connect to the owner, and for its whole answer.
const FORWARD_CONNECT: Duration = Duration::from_secs(2);
const FORWARD_ANSWER: Duration = Duration::from_secs(10);
/// How long a forward's connection may wait in the pool for the next forward.
const FORWARD_IDLE: Duration = Duration::from_millis(1500);

/// What the query routes read: the engine once the runtime has one, the renderings, the locator.
#[derive(Clone)]
pub struct QueryRoutes {
    engine: Arc<OnceLock<Arc<dyn EngineAccess>>>,
    renderings: Arc<StoreRenderings>,
    locate: Arc<dyn Locate>,
    /// Shared by every forward of the endpoint (its connection pool is).
    forwarder: ureq::Agent,
}

impl QueryRoutes {
    /// Routes reading through the engine set later with [`QueryRoutes::serve`] (the endpoint
    /// starts before the engine exists: until then, queries answer 503).
    pub fn new(renderings: StoreRenderings) -> Self {
        QueryRoutes {
            engine: Arc::new(OnceLock::new()),
            renderings: Arc::new(renderings),
            locate: Arc::new(LocalOnly),
            forwarder: forwarding_agent(),
        }
    }

    /// The same routes, asking `locate` who owns each key.
    pub fn with_locate(mut self, locate: Arc<dyn Locate>) -> Self {
        self.locate = locate;
        self
    }

    /// Starts answering from `engine`.
    pub fn serve(&self, engine: Arc<dyn EngineAccess>) {
        let _ = self.engine.set(engine);
    }

    fn reader(&self, store: &str) -> Result<StoreReader, QueryError> {
        let access = self.engine.get().ok_or(QueryError::NotRunning)?;
        Ok(StoreReader::new(access.clone(), store))
    }

    /// This instance's name in answers.
    fn instance(&self) -> String {
        self.locate.me().unwrap_or_else(|| "local".into())
    }
}

/// The routes, to merge into the endpoint's router.
pub fn routes(q: QueryRoutes) -> Router {
    Router::new()
        .route("/stores/{store}/keys/{key}", get(key_route))
        .route("/stores/{store}/range", get(range_route))
        .route("/stores/{store}/windows/{key}", get(windows_route))
        .route("/metadata", get(metadata_route))
        .with_state(q)
}

/// An answer that is not a local 200: a refusal, or an answer relayed from the owner.
struct Refusal {
    status: StatusCode,
    outcome: &'static str,
    body: Value,
    retry_after: Option<u64>,
}

impl Refusal {
    fn bad_request(store: &str, message: String) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            outcome: "bad_request",
            body: json!({ "error": "bad_request", "store": store, "message": message }),
            retry_after: None,
        }
    }
}

impl From<QueryError> for Refusal {
    fn from(e: QueryError) -> Self {
        let status = match &e {
            QueryError::UnknownStore { .. } => StatusCode::NOT_FOUND,
            QueryError::WrongKind { .. } | QueryError::BoundTopic { .. } => StatusCode::BAD_REQUEST,
            QueryError::Serde { .. } | QueryError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            QueryError::Restoring { .. }
            | QueryError::Busy { .. }
            | QueryError::Moved { .. }
            | QueryError::NotOwned { .. }
            | QueryError::NotRunning
            | QueryError::PositionNotReached { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut body = json!({ "error": e.outcome(), "message": e.to_string() });
        match &e {
            QueryError::UnknownStore { known, .. } => body["stores"] = json!(known),
            QueryError::Restoring { partitions, .. } => body["partitions"] = json!(partitions),
            _ => {}
        }
        Refusal {
            status,
            outcome: e.outcome(),
            body,
            retry_after: e.retry_after().map(|d| d.as_secs().max(1)),
        }
    }
}

/// The JSON of where a value was read, by `instance`; `topics`: the store's input topics.
fn served_json(instance: &str, s: &Served, topics: &[String]) -> Value {
    json!({
        "instance": instance,
        "partition": s.partition,
        "range": {
            "index": s.index,
            "factor": s.factor,
            "start": format!("{:#018x}", s.range.start),
            "end": format!("{:#018x}", s.range.end),
        },
        "position": {
            "topic": topics.get(s.position_source),
            "partition": s.partition,
            "offset": s.position,
        },
    })
}

/// Longest a read waits for its position bound unless `wait_ms` says otherwise.
const DEFAULT_POSITION_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// `reader` with the position bound of `?position=<topic>:<partition>:<offset>` (and
/// `wait_ms`), when given.
fn bounded(reader: StoreReader, params: &Params<'_>) -> Result<StoreReader, Refusal> {
    let Some(text) = params.get("position") else {
        return Ok(reader);
    };
    let bad = || {
        Refusal::bad_request(
            params.store,
            format!("`position={text}` is not <topic>:<partition>:<offset>"),
        )
    };
    let mut parts = text.rsplitn(3, ':');
    let (Some(offset), Some(partition), Some(topic)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let bound = super::PositionBound {
        topic: topic.to_string(),
        partition: partition.parse().map_err(|_| bad())?,
        offset: offset.parse().map_err(|_| bad())?,
    };
    let wait = match params.number("wait_ms")? {
        Some(ms) if ms >= 0 => std::time::Duration::from_millis(ms as u64),
        Some(ms) => {
            return Err(Refusal::bad_request(
                params.store,
                format!("`wait_ms={ms}` is negative"),
            ))
        }
        None => DEFAULT_POSITION_WAIT,
    };
    Ok(reader.at_least(bound, wait))
}

/// Runs `answer` off the async workers, then counts and times it as `route`.
async fn serve(
    route: &'static str,
    q: QueryRoutes,
    store: String,
    answer: impl FnOnce(&QueryRoutes, &str) -> Result<Value, Refusal> + Send + 'static,
) -> Response {
    let started = Instant::now();
    let s2 = store.clone();
    let q2 = q.clone();
    let result = tokio::task::spawn_blocking(move || answer(&q2, &s2))
        .await
        .unwrap_or_else(|e| {
            Err(Refusal {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                outcome: "panicked",
                body: json!({ "error": "panicked", "message": e.to_string() }),
                retry_after: None,
            })
        });
    let (status, outcome, body, retry_after) = match result {
        Ok(body) => (StatusCode::OK, "local", body, None),
        Err(r) => (r.status, r.outcome, r.body, r.retry_after),
    };
    let served_by = body
        .get("served_by")
        .and_then(|s| s.get("instance"))
        .and_then(Value::as_str)
        .and_then(|s| HeaderValue::from_str(s).ok());
    // A name the topology lacks is not a label: a client could make up any number of them.
    let label = match outcome {
        "unknown_store" => "unknown".to_string(),
        _ => store,
    };
    metrics::counter!(crate::metrics::QUERIES, "route" => route, "store" => label, "outcome" => outcome)
        .increment(1);
    metrics::histogram!(crate::metrics::QUERY_LATENCY, "route" => route)
        .record(started.elapsed().as_secs_f64());
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response();
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some(v) = served_by {
        response.headers_mut().insert(SERVED_BY_HEADER, v);
    }
    response
}

/// How a key request arrived: the path and query to forward, whether another instance
/// forwarded it already, the credentials to carry on.
struct Incoming {
    path: String,
    forwarded: bool,
    authorization: Option<String>,
}

impl Incoming {
    fn new(uri: &Uri, headers: &HeaderMap) -> Self {
        Incoming {
            path: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string()),
            forwarded: headers.contains_key(FORWARDED_HEADER),
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        }
    }
}

/// Where a key is answered: here (the reader restricted to the key's partition when known),
/// or the owner's answer relayed (as a [`Refusal`] carrying its status).
enum Route {
    Here(Vec<u8>, StoreReader),
    Relayed(Refusal),
}

/// 404 `moved`: the key's partition is owned by `owner`, not here.
fn moved(store: &str, key: &str, partition: u32, owner: &str) -> Refusal {
    Refusal {
        status: StatusCode::NOT_FOUND,
        outcome: "moved",
        body: json!({ "error": "moved", "store": store, "key": key, "partition": partition,
            "owner": owner,
            "message": format!("partition {partition} of key `{key}` is owned by {owner}: ask it") }),
        retry_after: None,
    }
}

/// 503 `owner_unknown`: no instance is known to own the key's partition right now.
fn owner_unknown(store: &str, key: &str, partition: u32) -> Refusal {
    Refusal {
        status: StatusCode::SERVICE_UNAVAILABLE,
        outcome: "owner_unknown",
        body: json!({ "error": "owner_unknown", "store": store, "key": key, "partition": partition,
            "message": format!("no instance is known to own partition {partition} of key `{key}` (a rebalance in progress, or an owner without application.server): retry shortly") }),
        retry_after: Some(super::RETRY_AFTER.as_secs().max(1)),
    }
}

/// What to answer for a read here that found the key's partition gone: the new owner's name,
/// as the locator knows it now.
fn gone(q: &QueryRoutes, store: &str, key: &str, bytes: &[u8], partition: u32) -> Refusal {
    match q.locate.owner(store, bytes) {
        Owner::Elsewhere { server, partition } => moved(store, key, partition, &server),
        Owner::Unknown { partition } => owner_unknown(store, key, partition),
        // Assigned again meanwhile.
        Owner::Local(_) => owner_unknown(store, key, partition),
    }
}

/// Parses `key` with the store's key rendering and decides who answers it: this instance, or
/// the owner (the request forwarded once; a forwarded request found elsewhere answers moved).
fn route_key(
    q: &QueryRoutes,
    store: &str,
    key: &str,
    reader: StoreReader,
    incoming: &Incoming,
) -> Result<Route, Refusal> {
    let (rendering, _) = q.renderings.of(store);
    let bytes = rendering.parse(key).map_err(|e| {
        Refusal::bad_request(
            store,
            format!("key `{key}` is not a {} key: {e}", rendering.name()),
        )
    })?;
    match q.locate.owner(store, &bytes) {
        Owner::Local(None) => Ok(Route::Here(bytes, reader)),
        Owner::Local(Some(p)) => Ok(Route::Here(bytes, reader.owning(p))),
        Owner::Unknown { partition } => Err(owner_unknown(store, key, partition)),
        Owner::Elsewhere { server, partition } if incoming.forwarded => {
            Err(moved(store, key, partition, &server))
        }
        Owner::Elsewhere { server, partition } => Ok(Route::Relayed(relay(
            q, store, key, partition, &server, incoming,
        ))),
    }
}

/// Forwards the request to `server` and relays its answer, with `forwarded_by` added.
fn relay(
    q: &QueryRoutes,
    store: &str,
    key: &str,
    partition: u32,
    server: &str,
    incoming: &Incoming,
) -> Refusal {
    let me = q.instance();
    match forward(
        &q.forwarder,
        server,
        &incoming.path,
        &me,
        incoming.authorization.as_deref(),
    ) {
        Ok((status, retry_after, body)) => {
            let mut body: Value = serde_json::from_str(&body).unwrap_or_else(
                |_| json!({ "error": "bad_answer", "message": format!("{server} answered {status} with a body that is not JSON") }),
            );
            if let Some(o) = body.as_object_mut() {
                o.insert("forwarded_by".into(), json!(me));
            }
            let outcome = match (status, body.get("error").and_then(Value::as_str)) {
                (200, _) => "forwarded",
                (_, Some("moved")) => "moved",
                _ => "forwarded_refused",
            };
            Refusal {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                outcome,
                body,
                retry_after,
            }
        }
        Err(e) => Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            outcome: "owner_unreachable",
            body: json!({ "error": "owner_unreachable", "store": store, "key": key,
                "partition": partition, "owner": server,
                "message": format!("the owner {server} of partition {partition} did not answer: {e}; retry shortly") }),
            retry_after: Some(super::RETRY_AFTER.as_secs().max(1)),
        },
    }
}

/// A client for forwards, one per endpoint: it keeps connections to the owners open between
/// forwards (rill's endpoint keeps them alive), so a forward costs one round trip, not a
/// connect as well.
fn forwarding_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(FORWARD_CONNECT))
        .timeout_global(Some(FORWARD_ANSWER))
        // Below the owner's idle cut (`HEADER_TIMEOUT`), so a pooled connection is not reused
        // as the owner closes it.
        .max_idle_age(FORWARD_IDLE)
        .max_idle_connections(256)
        .max_idle_connections_per_host(64)
        .build()
        .into()
}

/// `GET path` at `server`, marked forwarded; the status, `Retry-After` and body of its answer.
fn forward(
    agent: &ureq::Agent,
    server: &str,
    path: &str,
    me: &str,
    authorization: Option<&str>,
) -> Result<(u16, Option<u64>, String), String> {
    let url = format!("http://{server}{path}");
    let call = || {
        let mut request = agent.get(&url).header(FORWARDED_HEADER, me);
        if let Some(a) = authorization {
            request = request.header(header::AUTHORIZATION.as_str(), a);
        }
        request.call()
    };
    // A kept-alive connection the owner closed just as it was reused fails at once with an I/O
    // error; a GET is safe to send again, on a new connection.
    let mut response = match call() {
        Err(ureq::Error::Io(_)) => call(),
        other => other,
    }
    .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("read: {e}"))?;
    Ok((status, retry_after, body))
}

async fn key_route(
    Path((store, key)): Path<(String, String)>,
    State(q): State<QueryRoutes>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let incoming = Incoming::new(&uri, &headers);
    serve("keys", q, store, move |q, store| {
        let reader = q.reader(store)?;
        reader.expect_kind("key-value", |k| *k == StoreKind::KeyValue)?;
        let (bytes, reader) = match route_key(q, store, &key, reader, &incoming)? {
            Route::Here(bytes, reader) => (bytes, reader),
            Route::Relayed(answer) => return Err(answer),
        };
        let (_, values) = q.renderings.of(store);
        let reader = bounded(reader, &Params::parse(store, uri.query())?)?;
        let topics = reader.source_topics()?;
        let found = match reader.get(&bytes) {
            Err(QueryError::NotOwned { partition, .. }) => {
                return Err(gone(q, store, &key, &bytes, partition))
            }
            found => found?,
        };
        match found {
            Some((value, served)) => Ok(json!({
                "store": store,
                "key": key,
                "value": values.render(&value),
                "served_by": served_json(&q.instance(), &served, &topics),
            })),
            None => Err(Refusal {
                status: StatusCode::NOT_FOUND,
                outcome: "not_found",
                body: json!({ "error": "key_not_found", "store": store, "key": key,
                    "served_by": { "instance": q.instance() },
                    "message": format!("key `{key}` is not in store `{store}` on this instance's ranges") }),
                retry_after: None,
            }),
        }
    })
    .await
}

/// `GET /metadata`: this instance and every instance the endpoint map knows, with the
/// partitions and stores each owns.
async fn metadata_route(State(q): State<QueryRoutes>) -> Response {
    let body = match q.locate.metadata() {
        Some((caught_up, all)) => json!({
            "instance": q.locate.me(),
            "caught_up": caught_up,
            "instances": all,
        }),
        None => json!({
            "instance": q.locate.me(),
            "caught_up": false,
            "instances": [],
            "message": "this instance keeps no endpoint map (application.server unset and interactive queries off)",
        }),
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

async fn range_route(
    Path(store): Path<String>,
    RawQuery(query): RawQuery,
    State(q): State<QueryRoutes>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let incoming = Incoming::new(&uri, &headers);
    serve("range", q, store, move |q, store| {
        let params = Params::parse(store, query.as_deref())?;
        let (keys, values) = q.renderings.of(store);
        let bound = |name: &str| -> Result<Option<Vec<u8>>, Refusal> {
            params
                .get(name)
                .map(|t| {
                    keys.parse(t).map_err(|e| {
                        Refusal::bad_request(store, format!("`{name}={t}` is not a {} key: {e}", keys.name()))
                    })
                })
                .transpose()
        };
        let (from, to) = (bound("from")?, bound("to")?);
        let limit = params.number("limit")?.map_or(DEFAULT_LIMIT, |n| n as usize);
        let reader = bounded(q.reader(store)?, &params)?;
        reader.expect_kind("key-value", |k| *k == StoreKind::KeyValue)?;
        let topics = reader.source_topics()?;
        let b = |v: &Option<Vec<u8>>| match v {
            Some(v) => std::ops::Bound::Included(v.clone()),
            None => std::ops::Bound::Unbounded,
        };
        let (f, t) = (b(&from), b(&to));
        let entries = reader.range(f.as_ref().map(Vec::as_slice), t.as_ref().map(Vec::as_slice))?;
        let mut truncated = entries.len() > limit;
        let mut merged: Vec<(Vec<u8>, Value)> = entries
            .iter()
            .take(limit)
            .map(|(k, v, served)| {
                (k.clone(), json!({ "key": keys.render(k), "value": values.render(v), "served_by": served_json(&q.instance(), served, &topics) }))
            })
            .collect();
        // The other owners' entries, asked once each (a forwarded request answers locally).
        let plan = if incoming.forwarded { ScanPlan::default() } else { q.locate.scan_plan(store) };
        if !plan.unknown.is_empty() {
            return Err(Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                outcome: "owner_unknown",
                body: json!({ "error": "owner_unknown", "store": store, "partitions": plan.unknown,
                    "message": format!("no instance is known to own partitions {:?} of store `{store}` (a rebalance in progress?): retry shortly", plan.unknown) }),
                retry_after: Some(super::RETRY_AFTER.as_secs().max(1)),
            });
        }
        for server in &plan.others {
            let answer = match forward(&q.forwarder, server, &incoming.path, &q.instance(), incoming.authorization.as_deref()) {
                Ok((200, _, body)) => serde_json::from_str::<Value>(&body).ok(),
                Ok((status, retry_after, body)) => {
                    let body = serde_json::from_str::<Value>(&body).unwrap_or_else(|_| json!({ "error": "bad_answer" }));
                    return Err(Refusal {
                        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                        outcome: "forwarded_refused",
                        body: json!({ "error": "owner_refused", "store": store, "owner": server, "answer": body }),
                        retry_after,
                    });
                }
                Err(e) => {
                    return Err(Refusal {
                        status: StatusCode::SERVICE_UNAVAILABLE,
                        outcome: "owner_unreachable",
                        body: json!({ "error": "owner_unreachable", "store": store, "owner": server,
                            "message": format!("the owner {server} did not answer: {e}; retry shortly") }),
                        retry_after: Some(super::RETRY_AFTER.as_secs().max(1)),
                    })
                }
            };
            let Some(answer) = answer else {
                return Err(Refusal {
                    status: StatusCode::BAD_GATEWAY,
                    outcome: "forwarded_refused",
                    body: json!({ "error": "bad_answer", "store": store, "owner": server }),
                    retry_after: None,
                });
            };
            truncated |= answer["truncated"] == true;
            for e in answer["entries"].as_array().into_iter().flatten() {
                // Merged in the order of the serialized keys, as one instance's scan is.
                let Some(k) = e["key"].as_str().and_then(|k| keys.parse(k).ok()) else {
                    continue;
                };
                merged.push((k, e.clone()));
            }
        }
        merged.sort_by(|a, b| a.0.cmp(&b.0));
        truncated |= merged.len() > limit;
        let shown: Vec<Value> = merged.into_iter().take(limit).map(|(_, v)| v).collect();
        Ok(json!({ "store": store, "count": shown.len(), "truncated": truncated, "entries": shown }))
    })
    .await
}

async fn windows_route(
    Path((store, key)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    State(q): State<QueryRoutes>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let incoming = Incoming::new(&uri, &headers);
    serve("windows", q, store, move |q, store| {
        let params = Params::parse(store, query.as_deref())?;
        let (from, to) = (params.number("from")?, params.number("to")?);
        let reader = q.reader(store)?;
        let StoreKind::Window(spec) =
            reader.expect_kind("window", |k| matches!(k, StoreKind::Window(_)))?
        else {
            unreachable!("checked above")
        };
        let (bytes, reader) = match route_key(q, store, &key, reader, &incoming)? {
            Route::Here(bytes, reader) => (bytes, reader),
            Route::Relayed(answer) => return Err(answer),
        };
        let (_, values) = q.renderings.of(store);
        let reader = bounded(reader, &params)?;
        let topics = reader.source_topics()?;
        let per_range = match reader.read_timed(Some(&bytes), |t| {
            WindowBytes::open(t)?.fetch(&bytes, from.unwrap_or(i64::MIN), to.unwrap_or(i64::MAX))
        }) {
            Err(QueryError::NotOwned { partition, .. }) => {
                return Err(gone(q, store, &key, &bytes, partition))
            }
            r => r?,
        };
        let instance = q.instance();
        let mut windows: Vec<(i64, Value)> = per_range
            .iter()
            .flat_map(|(served, found)| {
                let (values, instance, topics) = (&values, &instance, &topics);
                found.iter().map(move |(start, v)| {
                    // The DSL's window stores keep the window's timestamp before the value.
                    let v = if spec.timestamped { v.get(8..).unwrap_or_default() } else { v };
                    (*start, json!({
                        "start": start,
                        "end": start.saturating_add(spec.window_size_ms),
                        "value": values.render(v),
                        "served_by": served_json(instance, served, topics),
                    }))
                })
            })
            .collect();
        windows.sort_by_key(|(start, _)| *start);
        if windows.is_empty() {
            return Err(Refusal {
                status: StatusCode::NOT_FOUND,
                outcome: "not_found",
                body: json!({ "error": "key_not_found", "store": store, "key": key,
                    "message": format!("key `{key}` has no windows in store `{store}` in that time on this instance's ranges") }),
                retry_after: None,
            });
        }
        let windows: Vec<Value> = windows.into_iter().map(|(_, w)| w).collect();
        Ok(json!({ "store": store, "key": key, "windows": windows }))
    })
    .await
}

/// The decoded parameters of a query string.
struct Params<'a> {
    store: &'a str,
    pairs: Vec<(String, String)>,
}

impl<'a> Params<'a> {
    fn parse(store: &'a str, query: Option<&str>) -> Result<Self, Refusal> {
        let mut pairs = Vec::new();
        for part in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            let decode = |s: &str| {
                percent_decode(s).ok_or_else(|| {
                    Refusal::bad_request(store, format!("`{part}` is not percent-encoded UTF-8"))
                })
            };
            pairs.push((decode(k)?, decode(v)?));
        }
        Ok(Params { store, pairs })
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, name: &str) -> Result<Option<i64>, Refusal> {
        self.get(name)
            .map(|t| {
                t.parse::<i64>().map_err(|e| {
                    Refusal::bad_request(self.store, format!("`{name}={t}` is not a number: {e}"))
                })
            })
            .transpose()
    }
}

/// `s` with `%XX` escapes and `+` decoded; `None` when it is not valid UTF-8 afterwards.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Before the runtime has an engine (it binds the endpoint first), a query answers 503 with
    /// `Retry-After`, in JSON.
    #[test]
    fn a_query_before_the_engine_exists_answers_503_with_retry_after() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let router = routes(QueryRoutes::new(StoreRenderings::default()));
        let server =
            crate::http::HttpServer::start("127.0.0.1:0".parse().unwrap(), rt.handle(), router)
                .expect("server");
        let mut s = std::net::TcpStream::connect(server.local_addr()).expect("connect");
        write!(
            s,
            "GET /stores/counts/keys/a2Fma2E HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        assert!(head.to_lowercase().contains("retry-after: 1"), "{head}");
        assert!(head.contains("application/json"), "{head}");
        let body: Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(body["error"], "not_running");
    }

    #[test]
    fn query_parameters_are_percent_decoded() {
        assert_eq!(percent_decode("a%20b+c").as_deref(), Some("a b c"));
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decode("%ff"), None);
        assert_eq!(percent_decode("50%").as_deref(), Some("50%"));
    }
}
