//! An in-process schema registry for tests (feature `test-util`): the few routes of the
//! Confluent API that the serdes use, with the answers (bodies, status and error codes) of
//! Confluent Schema Registry 7, on a free port of 127.0.0.1.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::{SchemaRegistry, SchemaType};

/// A Confluent-compatible schema registry in the test process, serving
/// `POST /subjects/{subject}/versions`, `GET /schemas/ids/{id}` and
/// `GET /subjects/{subject}/versions/latest` on 127.0.0.1. New Avro versions of a subject are
/// checked for `BACKWARD` compatibility (the default level: the new schema reads data of the
/// latest), and refused with 409 as the real registry does; Protobuf and JSON schemas are not
/// checked. Stops when dropped.
pub struct MockSchemaRegistry {
    addr: SocketAddr,
    state: Arc<MockState>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct MockState {
    inner: Mutex<Registered>,
    requests: AtomicU64,
}

#[derive(Default)]
struct Registered {
    /// By id - 1.
    schemas: Vec<(SchemaType, String)>,
    /// Subject -> ids of its versions, oldest first.
    subjects: HashMap<String, Vec<u32>>,
}

impl MockSchemaRegistry {
    /// Starts the registry on a free port.
    pub fn start() -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(MockState::default());
        let (stop, mut stopped) = watch::channel(false);
        let router = Router::new()
            .route("/subjects/{subject}/versions", post(register))
            .route("/subjects/{subject}/versions/latest", get(latest))
            .route("/schemas/ids/{id}", get(by_id))
            .fallback(|| async { error(StatusCode::NOT_FOUND, 404, "HTTP 404 Not Found") })
            .with_state(state.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("mock-schema-registry".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    loop {
                        let stream = tokio::select! {
                            accepted = listener.accept() => match accepted {
                                Ok((s, _)) => s,
                                Err(_) => continue,
                            },
                            _ = stopped.changed() => return,
                        };
                        let service = TowerToHyperService::new(router.clone());
                        let mut stopped = stopped.clone();
                        tokio::spawn(async move {
                            let conn = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service);
                            tokio::select! {
                                _ = conn => {}
                                _ = stopped.changed() => {}
                            }
                        });
                    }
                })
            })?;
        Ok(MockSchemaRegistry {
            addr,
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of it.
    pub fn client(&self) -> SchemaRegistry {
        SchemaRegistry::new(&self.url()).expect("a valid URL")
    }

    /// HTTP requests it answered.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// The subjects, sorted, each with the ids of its versions (oldest first).
    pub fn subjects(&self) -> Vec<(String, Vec<u32>)> {
        let inner = self.state.inner.lock();
        let mut subjects: Vec<_> = inner
            .subjects
            .iter()
            .map(|(s, v)| (s.clone(), v.clone()))
            .collect();
        subjects.sort();
        subjects
    }
}

impl Drop for MockSchemaRegistry {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            "application/vnd.schemaregistry.v1+json",
        )],
        body.to_string(),
    )
        .into_response()
}

fn error(status: StatusCode, code: i64, message: &str) -> Response {
    json(
        status,
        serde_json::json!({ "error_code": code, "message": message }),
    )
}

fn schema_json(id: u32, schema_type: SchemaType, schema: &str) -> serde_json::Value {
    let mut body = serde_json::json!({ "schema": schema });
    if schema_type != SchemaType::Avro {
        body["schemaType"] = schema_type.as_api().into();
    }
    body["id"] = id.into();
    body
}

/// Whether two schema texts are the same schema (Avro: the same parsing canonical form).
fn same(schema_type: SchemaType, a: &str, b: &str) -> bool {
    if schema_type == SchemaType::Avro {
        if let (Ok(a), Ok(b)) = (
            apache_avro::Schema::parse_str(a),
            apache_avro::Schema::parse_str(b),
        ) {
            return a.canonical_form() == b.canonical_form() && a == b;
        }
    }
    a == b
}

async fn register(
    State(state): State<Arc<MockState>>,
    Path(subject): Path<String>,
    body: Bytes,
) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let Ok(req) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, 400, "Unrecognized request body");
    };
    let Some(schema) = req.get("schema").and_then(|s| s.as_str()) else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, 42201, "Empty schema");
    };
    let schema_type = match req.get("schemaType").and_then(|t| t.as_str()) {
        None | Some("AVRO") => SchemaType::Avro,
        Some("PROTOBUF") => SchemaType::Protobuf,
        Some("JSON") => SchemaType::Json,
        Some(other) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                42201,
                &format!("Invalid schema type {other}"),
            )
        }
    };
    let parsed = match schema_type {
        SchemaType::Avro => match apache_avro::Schema::parse_str(schema) {
            Ok(s) => Some(s),
            Err(e) => {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    42201,
                    &format!("Invalid schema {schema}, details: {e}"),
                )
            }
        },
        SchemaType::Json if serde_json::from_str::<serde_json::Value>(schema).is_err() => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                42201,
                "Invalid schema: not JSON",
            )
        }
        _ => None,
    };
    let mut inner = state.inner.lock();
    let versions = inner.subjects.get(&subject).cloned().unwrap_or_default();
    // A schema the subject already has: its id.
    for id in &versions {
        let (t, s) = &inner.schemas[*id as usize - 1];
        if *t == schema_type && same(schema_type, s, schema) {
            return json(StatusCode::OK, serde_json::json!({ "id": id }));
        }
    }
    if let (Some(new), Some(latest)) = (&parsed, versions.last()) {
        let (_, old) = &inner.schemas[*latest as usize - 1];
        let old = apache_avro::Schema::parse_str(old).expect("registered schemas parse");
        if let Err(e) = apache_avro::schema_compatibility::SchemaCompatibility::can_read(&old, new)
        {
            return error(
                StatusCode::CONFLICT,
                409,
                &format!(
                    "Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: [{e}]"
                ),
            );
        }
    }
    // The same schema under another subject keeps its global id.
    let existing = inner
        .schemas
        .iter()
        .position(|(t, s)| *t == schema_type && same(schema_type, s, schema));
    let id = match existing {
        Some(i) => i as u32 + 1,
        None => {
            inner.schemas.push((schema_type, schema.to_string()));
            inner.schemas.len() as u32
        }
    };
    inner.subjects.entry(subject).or_default().push(id);
    json(StatusCode::OK, serde_json::json!({ "id": id }))
}

async fn by_id(State(state): State<Arc<MockState>>, Path(id): Path<String>) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let inner = state.inner.lock();
    let found = id
        .parse::<u32>()
        .ok()
        .filter(|id| *id >= 1)
        .and_then(|id| inner.schemas.get(id as usize - 1).map(|s| (id, s)));
    match found {
        Some((id, (t, s))) => {
            let mut body = schema_json(id, *t, s);
            // GET /schemas/ids/{id} answers without the id.
            body.as_object_mut().map(|o| o.remove("id"));
            json(StatusCode::OK, body)
        }
        None => error(
            StatusCode::NOT_FOUND,
            40403,
            &format!("Schema {id} not found"),
        ),
    }
}

async fn latest(State(state): State<Arc<MockState>>, Path(subject): Path<String>) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let inner = state.inner.lock();
    match inner.subjects.get(&subject) {
        Some(versions) if !versions.is_empty() => {
            let id = *versions.last().expect("a version");
            let (t, s) = &inner.schemas[id as usize - 1];
            let mut body = schema_json(id, *t, s);
            body["subject"] = subject.into();
            body["version"] = versions.len().into();
            json(StatusCode::OK, body)
        }
        _ => error(
            StatusCode::NOT_FOUND,
            40401,
            &format!("Subject '{subject}' not found."),
        ),
    }
}
