//! The blocking client of a Confluent-compatible schema registry, with its caches.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use parking_lot::RwLock;
use serde::Deserialize;

use super::RegistryError;

/// Default bound on one HTTP exchange with the registry.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of the registry API.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// The kind of a registered schema (the API's `schemaType`; absent means Avro).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// Avro (JSON schema text).
    Avro,
    /// Protobuf (`.proto` text).
    Protobuf,
    /// JSON Schema.
    Json,
}

impl SchemaType {
    /// The API's `schemaType` value.
    pub fn as_api(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Protobuf => "PROTOBUF",
            SchemaType::Json => "JSON",
        }
    }

    fn from_api(s: Option<&str>) -> Result<Self, String> {
        match s {
            None | Some("AVRO") => Ok(SchemaType::Avro),
            Some("PROTOBUF") => Ok(SchemaType::Protobuf),
            Some("JSON") => Ok(SchemaType::Json),
            Some(other) => Err(format!("unknown schemaType {other:?}")),
        }
    }
}

impl fmt::Display for SchemaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_api())
    }
}

/// A schema as the registry holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredSchema {
    /// Its global id (the one in the wire format).
    pub id: u32,
    /// Its kind.
    pub schema_type: SchemaType,
    /// Its text.
    pub schema: String,
}

/// A client of a Confluent-compatible schema registry: blocking (serdes are synchronous and
/// run on worker threads), with the caches that make a registry call rare. Clones share the
/// connection pool and the caches; build one per registry and give it to every serde.
#[derive(Clone)]
pub struct SchemaRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    agent: ureq::Agent,
    authorization: Option<String>,
    latest_ttl: Option<Duration>,
    by_id: RwLock<HashMap<u32, Arc<RegisteredSchema>>>,
    /// (subject, type, schema text) -> id, of schemas registered or looked up.
    ids: RwLock<HashMap<(String, SchemaType, String), u32>>,
    latest: RwLock<HashMap<String, (Instant, Arc<RegisteredSchema>)>>,
    requests: AtomicU64,
}

impl fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaRegistry")
            .field("url", &self.inner.url)
            .finish_non_exhaustive()
    }
}

/// An error answer of the registry API.
#[derive(Deserialize)]
struct ApiError {
    error_code: i64,
    message: String,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    #[serde(default)]
    id: Option<u32>,
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
}

impl SchemaRegistry {
    /// A client of the registry at `url` (e.g. `http://127.0.0.1:8081`, or Apicurio Registry's
    /// `http://host:8080/apis/ccompat/v7`). No request is sent until a serde needs one.
    pub fn new(url: &str) -> Result<Self, RegistryError> {
        SchemaRegistryBuilder::new(url).build()
    }

    /// A builder for the client's options (basic auth, timeout, how long the latest version of
    /// a subject is cached).
    pub fn builder(url: &str) -> SchemaRegistryBuilder {
        SchemaRegistryBuilder::new(url)
    }

    /// The registry's base URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// HTTP requests sent so far (each cache miss is one).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Registers `schema` under `subject` (or finds it there) and returns its id. Cached: a
    /// schema registered once is not sent again.
    pub fn register(
        &self,
        subject: &str,
        schema_type: SchemaType,
        schema: &str,
    ) -> Result<u32, RegistryError> {
        let key = (subject.to_string(), schema_type, schema.to_string());
        if let Some(id) = self.inner.ids.read().get(&key) {
            return Ok(*id);
        }
        let mut body = serde_json::json!({ "schema": schema });
        if schema_type != SchemaType::Avro {
            body["schemaType"] = schema_type.as_api().into();
        }
        let what = format!("registering a schema under subject {subject}");
        let answer: IdAnswer = self.call(
            "POST",
            &format!("/subjects/{}/versions", path_segment(subject)),
            Some(body.to_string()),
            &what,
            Some(subject),
        )?;
        self.inner.ids.write().insert(key, answer.id);
        self.inner
            .by_id
            .write()
            .entry(answer.id)
            .or_insert_with(|| {
                Arc::new(RegisteredSchema {
                    id: answer.id,
                    schema_type,
                    schema: schema.to_string(),
                })
            });
        Ok(answer.id)
    }

    /// The schema with id `id`. Cached for good (an id's schema never changes).
    pub fn schema_by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        if let Some(s) = self.inner.by_id.read().get(&id) {
            return Ok(s.clone());
        }
        let answer: SchemaAnswer = self.call(
            "GET",
            &format!("/schemas/ids/{id}"),
            None,
            &format!("fetching schema id {id}"),
            None,
        )?;
        let schema = Arc::new(RegisteredSchema {
            id,
            schema_type: SchemaType::from_api(answer.schema_type.as_deref()).map_err(|reason| {
                RegistryError::BadResponse {
                    what: format!("fetching schema id {id}"),
                    reason,
                }
            })?,
            schema: answer.schema,
        });
        self.inner.by_id.write().insert(id, schema.clone());
        Ok(schema)
    }

    /// The latest version of `subject`; cached for the client's `latest_ttl` (for good by
    /// default, as Confluent's `latest.cache.ttl.sec=-1`).
    pub fn latest(&self, subject: &str) -> Result<Arc<RegisteredSchema>, RegistryError> {
        if let Some((at, s)) = self.inner.latest.read().get(subject) {
            if self.inner.latest_ttl.is_none_or(|ttl| at.elapsed() < ttl) {
                return Ok(s.clone());
            }
        }
        let what = format!("fetching the latest version of subject {subject}");
        let answer: SchemaAnswer = self.call(
            "GET",
            &format!("/subjects/{}/versions/latest", path_segment(subject)),
            None,
            &what,
            Some(subject),
        )?;
        let schema = Arc::new(RegisteredSchema {
            id: answer.id.ok_or_else(|| RegistryError::BadResponse {
                what: what.clone(),
                reason: "no id in the answer".into(),
            })?,
            schema_type: SchemaType::from_api(answer.schema_type.as_deref())
                .map_err(|reason| RegistryError::BadResponse { what, reason })?,
            schema: answer.schema,
        });
        self.inner.by_id.write().insert(schema.id, schema.clone());
        self.inner
            .latest
            .write()
            .insert(subject.to_string(), (Instant::now(), schema.clone()));
        Ok(schema)
    }

    /// One exchange: `method path` with `body`, the answer parsed as `T` or mapped to an error.
    fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        what: &str,
        subject: Option<&str>,
    ) -> Result<T, RegistryError> {
        let inner = &*self.inner;
        let url = format!("{}{path}", inner.url);
        inner.requests.fetch_add(1, Ordering::Relaxed);
        let unreachable = |e: ureq::Error| RegistryError::Unreachable {
            url: inner.url.clone(),
            reason: e.to_string(),
        };
        let mut response = match (method, body) {
            ("POST", Some(body)) => {
                let mut req = inner.agent.post(&url).header("Content-Type", CONTENT_TYPE);
                req = req.header("Accept", CONTENT_TYPE);
                if let Some(a) = &inner.authorization {
                    req = req.header("Authorization", a);
                }
                req.send(body.as_bytes()).map_err(unreachable)?
            }
            _ => {
                let mut req = inner.agent.get(&url).header("Accept", CONTENT_TYPE);
                if let Some(a) = &inner.authorization {
                    req = req.header("Authorization", a);
                }
                req.call().map_err(unreachable)?
            }
        };
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().map_err(unreachable)?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|e| RegistryError::BadResponse {
                what: what.to_string(),
                reason: format!("HTTP {status}, {e}: {}", truncate(&text)),
            });
        }
        let Ok(err) = serde_json::from_str::<ApiError>(&text) else {
            return Err(RegistryError::BadResponse {
                what: what.to_string(),
                reason: format!("HTTP {status}: {}", truncate(&text)),
            });
        };
        let subject = subject.unwrap_or_default().to_string();
        Err(match (status, err.error_code) {
            (409, _) => RegistryError::Incompatible {
                subject,
                message: err.message,
            },
            (422, 42201) => RegistryError::InvalidSchema {
                subject,
                message: err.message,
            },
            (404, 40403) => RegistryError::UnknownSchemaId {
                id: path
                    .rsplit('/')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_default(),
                url: inner.url.clone(),
            },
            (404, 40401) | (404, 40402) if !subject.is_empty() => RegistryError::SubjectNotFound {
                subject,
                url: inner.url.clone(),
            },
            (status, code) => RegistryError::Registry {
                status,
                code,
                what: what.to_string(),
                message: err.message,
            },
        })
    }
}

/// Options of a [`SchemaRegistry`].
#[derive(Clone, Debug)]
pub struct SchemaRegistryBuilder {
    url: String,
    timeout: Duration,
    basic_auth: Option<(String, String)>,
    latest_ttl: Option<Duration>,
}

impl SchemaRegistryBuilder {
    fn new(url: &str) -> Self {
        SchemaRegistryBuilder {
            url: url.trim_end_matches('/').to_string(),
            timeout: DEFAULT_TIMEOUT,
            basic_auth: None,
            latest_ttl: None,
        }
    }

    /// Bound on one HTTP exchange (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// HTTP basic authentication (`basic.auth.user.info`).
    pub fn basic_auth(mut self, user: &str, password: &str) -> Self {
        self.basic_auth = Some((user.to_string(), password.to_string()));
        self
    }

    /// How long the latest version of a subject is cached (default: for good).
    pub fn latest_ttl(mut self, ttl: Duration) -> Self {
        self.latest_ttl = Some(ttl);
        self
    }

    /// The client.
    pub fn build(self) -> Result<SchemaRegistry, RegistryError> {
        if self.url.starts_with("https://") {
            return Err(RegistryError::Schema(format!(
                "{}: this client speaks plain HTTP only (no TLS); reach the registry through a TLS-terminating proxy",
                self.url
            )));
        }
        if !self.url.starts_with("http://") {
            return Err(RegistryError::Schema(format!(
                "{}: the registry URL must start with http://",
                self.url
            )));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(self.timeout))
            .build()
            .into();
        let authorization = self.basic_auth.map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        });
        Ok(SchemaRegistry {
            inner: Arc::new(Inner {
                url: self.url,
                agent,
                authorization,
                latest_ttl: self.latest_ttl,
                by_id: RwLock::default(),
                ids: RwLock::default(),
                latest: RwLock::default(),
                requests: AtomicU64::new(0),
            }),
        })
    }
}

/// `s` percent-encoded as one URL path segment.
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(200) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_one_path_segment() {
        assert_eq!(path_segment("shop.Payment"), "shop.Payment");
        assert_eq!(path_segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn only_plain_http() {
        let err = SchemaRegistry::new("https://r:8081")
            .unwrap_err()
            .to_string();
        assert!(err.contains("plain HTTP only"), "{err}");
        assert!(SchemaRegistry::new("r:8081").is_err());
        assert_eq!(
            SchemaRegistry::new("http://r:8081/").unwrap().url(),
            "http://r:8081"
        );
    }
}
