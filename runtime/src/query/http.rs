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
//! Every route first asks [`Locate`] who answers a key. Only this instance does for now (its
//! local ranges, [`LocalOnly`]); the cross-instance step plugs a locator in that knows the
//! owners, and forwards a key owned elsewhere where the `Owner::Elsewhere` arm answers today.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
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
    /// This instance, from its local ranges.
    Local,
    /// Another instance (`host:port`, as its `application.server` says).
    Elsewhere(String),
}

/// Decides which instance answers for a key; the seam of the cross-instance step.
pub trait Locate: Send + Sync {
    /// The instance that owns `key` (serialized) of `store`.
    fn owner(&self, store: &str, key: &[u8]) -> Owner;
}

/// Every key is answered from this instance's ranges.
pub struct LocalOnly;

impl Locate for LocalOnly {
    fn owner(&self, _store: &str, _key: &[u8]) -> Owner {
        Owner::Local
    }
}

/// What the query routes read: the engine once the runtime has one, the renderings, the locator.
#[derive(Clone)]
pub struct QueryRoutes {
    engine: Arc<OnceLock<Arc<dyn EngineAccess>>>,
    renderings: Arc<StoreRenderings>,
    locate: Arc<dyn Locate>,
}

impl QueryRoutes {
    /// Routes reading through the engine set later with [`QueryRoutes::serve`] (the endpoint
    /// starts before the engine exists: until then, queries answer 503).
    pub fn new(renderings: StoreRenderings) -> Self {
        QueryRoutes {
            engine: Arc::new(OnceLock::new()),
            renderings: Arc::new(renderings),
            locate: Arc::new(LocalOnly),
        }
    }

    /// Starts answering from `engine`.
    pub fn serve(&self, engine: Arc<dyn EngineAccess>) {
        let _ = self.engine.set(engine);
    }

    fn reader(&self, store: &str) -> Result<StoreReader, QueryError> {
        let access = self.engine.get().ok_or(QueryError::NotRunning)?;
        Ok(StoreReader::new(access.clone(), store))
    }
}

/// The routes, to merge into the endpoint's router.
pub fn routes(q: QueryRoutes) -> Router {
    Router::new()
        .route("/stores/{store}/keys/{key}", get(key_route))
        .route("/stores/{store}/range", get(range_route))
        .route("/stores/{store}/windows/{key}", get(windows_route))
        .with_state(q)
}

/// An answer that is not a 200.
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
            QueryError::WrongKind { .. } => StatusCode::BAD_REQUEST,
            QueryError::Serde { .. } | QueryError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            QueryError::Restoring { .. }
            | QueryError::Busy { .. }
            | QueryError::Moved { .. }
            | QueryError::NotRunning => StatusCode::SERVICE_UNAVAILABLE,
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

/// The JSON of where a value was read.
fn served_json(s: &Served) -> Value {
    json!({
        "instance": "local",
        "partition": s.partition,
        "range": {
            "index": s.index,
            "factor": s.factor,
            "start": format!("{:#018x}", s.range.start),
            "end": format!("{:#018x}", s.range.end),
        },
    })
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
    response
}

/// Parses `key` with the store's key rendering and checks that this instance answers for it.
fn local_key(q: &QueryRoutes, store: &str, key: &str) -> Result<Vec<u8>, Refusal> {
    let (rendering, _) = q.renderings.of(store);
    let bytes = rendering.parse(key).map_err(|e| {
        Refusal::bad_request(
            store,
            format!("key `{key}` is not a {} key: {e}", rendering.name()),
        )
    })?;
    match q.locate.owner(store, &bytes) {
        Owner::Local => Ok(bytes),
        // The cross-instance step forwards here instead.
        Owner::Elsewhere(instance) => Err(Refusal {
            status: StatusCode::NOT_IMPLEMENTED,
            outcome: "elsewhere",
            body: json!({ "error": "elsewhere", "instance": instance,
                "message": format!("key `{key}` is owned by {instance}; forwarding is not built yet") }),
            retry_after: None,
        }),
    }
}

async fn key_route(
    Path((store, key)): Path<(String, String)>,
    State(q): State<QueryRoutes>,
) -> Response {
    serve("keys", q, store, move |q, store| {
        let reader = q.reader(store)?;
        reader.expect_kind("key-value", |k| *k == StoreKind::KeyValue)?;
        let bytes = local_key(q, store, &key)?;
        let (_, values) = q.renderings.of(store);
        match reader.get(&bytes)? {
            Some((value, served)) => Ok(json!({
                "store": store,
                "key": key,
                "value": values.render(&value),
                "served_by": served_json(&served),
            })),
            None => Err(Refusal {
                status: StatusCode::NOT_FOUND,
                outcome: "not_found",
                body: json!({ "error": "key_not_found", "store": store, "key": key,
                    "message": format!("key `{key}` is not in store `{store}` on this instance's ranges") }),
                retry_after: None,
            }),
        }
    })
    .await
}

async fn range_route(
    Path(store): Path<String>,
    RawQuery(query): RawQuery,
    State(q): State<QueryRoutes>,
) -> Response {
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
        let reader = q.reader(store)?;
        reader.expect_kind("key-value", |k| *k == StoreKind::KeyValue)?;
        let b = |v: &Option<Vec<u8>>| match v {
            Some(v) => std::ops::Bound::Included(v.clone()),
            None => std::ops::Bound::Unbounded,
        };
        let (f, t) = (b(&from), b(&to));
        let entries = reader.range(f.as_ref().map(Vec::as_slice), t.as_ref().map(Vec::as_slice))?;
        let truncated = entries.len() > limit;
        let shown: Vec<Value> = entries
            .iter()
            .take(limit)
            .map(|(k, v, served)| {
                json!({ "key": keys.render(k), "value": values.render(v), "served_by": served_json(served) })
            })
            .collect();
        Ok(json!({ "store": store, "count": shown.len(), "truncated": truncated, "entries": shown }))
    })
    .await
}

async fn windows_route(
    Path((store, key)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    State(q): State<QueryRoutes>,
) -> Response {
    serve("windows", q, store, move |q, store| {
        let params = Params::parse(store, query.as_deref())?;
        let (from, to) = (params.number("from")?, params.number("to")?);
        let reader = q.reader(store)?;
        let StoreKind::Window(spec) =
            reader.expect_kind("window", |k| matches!(k, StoreKind::Window(_)))?
        else {
            unreachable!("checked above")
        };
        let bytes = local_key(q, store, &key)?;
        let (_, values) = q.renderings.of(store);
        let per_range = reader.read_timed(Some(&bytes), |t| {
            WindowBytes::open(t)?.fetch(&bytes, from.unwrap_or(i64::MIN), to.unwrap_or(i64::MAX))
        })?;
        let mut windows: Vec<(i64, Value)> = per_range
            .iter()
            .flat_map(|(served, found)| {
                let values = &values;
                found.iter().map(move |(start, v)| {
                    // The DSL's window stores keep the window's timestamp before the value.
                    let v = if spec.timestamped { v.get(8..).unwrap_or_default() } else { v };
                    (*start, json!({
                        "start": start,
                        "end": start.saturating_add(spec.window_size_ms),
                        "value": values.render(v),
                        "served_by": served_json(served),
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
            "GET /stores/counts/keys/a2Fma2E HTTP/1.1\r\nHost: x\r\n\r\n"
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
