//! Schema Registry serdes: Avro, Protobuf and JSON Schema values in the Confluent wire format,
//! with their schemas kept in a Confluent-compatible schema registry (Confluent Schema Registry,
//! Karapace, Apicurio Registry's `/apis/ccompat/v7` API, Redpanda).
//!
//! ```no_run
//! use rill_runtime::registry::{AvroSerde, SchemaRegistry, SubjectRole};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Payment { account: String, amount: i64 }
//!
//! const PAYMENT: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
//!   "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"}]}"#;
//!
//! let registry = SchemaRegistry::new("http://127.0.0.1:8081")?;
//! // Subject `payments-value` (the topic name strategy); the schema is registered on the first
//! // write, and records of any registered writer schema are read through this reader schema.
//! let payments = AvroSerde::<Payment>::for_topic(&registry, "payments", SubjectRole::Value, PAYMENT)?;
//! # Ok::<(), rill_runtime::registry::RegistryError>(())
//! ```
//!
//! - [`AvroSerde`]: `T: Serialize + DeserializeOwned` through `apache-avro`; written with the
//!   serde's schema (or the subject's latest, [`AvroSerde::use_latest`]), read with the writer's
//!   schema (fetched by id) resolved to the serde's, so a field added with a default reads from
//!   records written before it, and a field removed is skipped.
//! - [`ProtobufSerde`]: prost messages; the `.proto` text is registered as given (schema type
//!   `PROTOBUF`) and the message indexes of the Confluent format are written for the message's
//!   position in that file.
//! - [`JsonSchemaSerde`]: JSON (serde_json) with a JSON Schema registered (schema type `JSON`).
//!   Values are **not validated** against the schema: serde's types are the contract in Rust;
//!   the registry still checks the schema's compatibility when it is registered.
//!
//! Serdes do not know the topic they serve (rill's [`Serde`](rill_topology::serdes::Serde) is
//! called with the value alone), so a serde is built for its subject: [`SubjectNameStrategy`]
//! names it from the topic and role (`{topic}-key`, `{topic}-value`, Confluent's default), the
//! record's name, or both. Use one serde per topic with the topic strategy.
//!
//! [`SchemaRegistry`] is a blocking HTTP client shared by every serde built from it (clones share
//! one connection pool and one cache): schemas by id, ids by subject and schema, and the latest
//! version of a subject are each fetched once. A serde's first write registers (or looks up)
//! its schema; a read of an id not seen before fetches that schema; every other call is local.
//!
//! ## Why the wire format is written here
//! `schema_registry_converter` 6 covers the three formats, but resolves to ~190 crates (reqwest
//! with hyper's client, native-tls and OpenSSL, its own tokio use, valico for JSON Schema) where
//! this module adds `apache-avro` and `ureq` (without TLS) to a workspace that already has prost,
//! serde_json and axum: ~70 crates, about a minute of a cold build on two cores. The format itself
//! is five bytes (magic byte 0, the schema id as a big-endian u32) followed, for Protobuf only, by
//! a zig-zag varint array of message indexes ([`wire`]); it is tested against its specification
//! and with property tests.
//!
//! ## Limits
//! - Plain HTTP only (no TLS in the client; basic auth is supported). Put a TLS-terminating
//!   proxy in front of a registry that needs it, or ask for a `registry-tls` feature.
//! - Schema references (Avro named types or `.proto` imports from other subjects) are not
//!   resolved.
//! - Protobuf records are decoded into the serde's prost type; the writer's `.proto` is fetched
//!   (an unknown id is an error) but not used to decode.

/// The methods every registry serde has: `use_latest` and `subject` (over its `writer`).
macro_rules! writer_methods {
    ($use_latest_doc:literal) => {
        #[doc = $use_latest_doc]
        pub fn use_latest(mut self) -> Self {
            self.writer
                .set_lookup($crate::registry::SchemaLookup::UseLatest);
            self
        }

        /// The subject the serde writes under.
        pub fn subject(&self) -> &str {
            self.writer.subject()
        }
    };
}

/// `for_topic(registry, topic, role, schema)` of a serde whose `new` takes a strategy and a
/// schema.
macro_rules! for_topic_method {
    ($schema_doc:literal) => {
        /// A serde for the `role` (key or value) of `topic` (subject `{topic}-key` or
        /// `{topic}-value`), with
        #[doc = $schema_doc]
        pub fn for_topic(
            registry: &SchemaRegistry,
            topic: &str,
            role: SubjectRole,
            schema: &str,
        ) -> Result<Self, RegistryError> {
            Self::new(registry, SubjectNameStrategy::topic(topic, role), schema)
        }
    };
}

mod avro;
mod client;
mod json_schema;
#[cfg(any(test, feature = "test-util"))]
mod mock;
mod protobuf;
pub mod wire;

pub use avro::AvroSerde;
pub use client::{RegisteredSchema, SchemaRegistry, SchemaRegistryBuilder, SchemaType};
pub use json_schema::JsonSchemaSerde;
#[cfg(any(test, feature = "test-util"))]
pub use mock::MockSchemaRegistry;
pub use protobuf::ProtobufSerde;

use rill_topology::serdes::SerdeError;

/// Whether a serde writes a record's key or its value (the topic name strategy's suffix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubjectRole {
    /// The record's key: subject `{topic}-key`.
    Key,
    /// The record's value: subject `{topic}-value`.
    Value,
}

/// How a serde names its subject (Confluent's `subject.name.strategy`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SubjectNameStrategy {
    /// `{topic}-key` or `{topic}-value` (`TopicNameStrategy`, the default): one schema
    /// history per topic.
    Topic {
        /// The topic the serde writes.
        topic: String,
        /// Key or value.
        role: SubjectRole,
    },
    /// The record's fully-qualified name (`RecordNameStrategy`): an Avro record's
    /// `namespace.name`, a Protobuf message's `package.Message`, a JSON Schema's `title`. One
    /// schema history per record type, across topics.
    Record,
    /// `{topic}-{record name}` (`TopicRecordNameStrategy`): several record types in a topic,
    /// each with its own history.
    TopicRecord {
        /// The topic the serde writes.
        topic: String,
    },
}

impl SubjectNameStrategy {
    /// The topic name strategy for the `role` of `topic`.
    pub fn topic(topic: &str, role: SubjectRole) -> Self {
        SubjectNameStrategy::Topic {
            topic: topic.to_string(),
            role,
        }
    }

    /// The subject for a record named `record` (its fully-qualified name, when the schema has
    /// one).
    pub fn subject(&self, record: Option<&str>) -> Result<String, RegistryError> {
        let record = || {
            record.ok_or_else(|| {
                RegistryError::Schema(format!(
                    "the {self:?} subject name strategy needs the record's name, and the schema has none (an Avro record, a Protobuf message, a JSON Schema with a \"title\")"
                ))
            })
        };
        Ok(match self {
            SubjectNameStrategy::Topic { topic, role } => match role {
                SubjectRole::Key => format!("{topic}-key"),
                SubjectRole::Value => format!("{topic}-value"),
            },
            SubjectNameStrategy::Record => record()?.to_string(),
            SubjectNameStrategy::TopicRecord { topic } => format!("{topic}-{}", record()?),
        })
    }
}

/// Which schema a serde writes with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SchemaLookup {
    /// Registers the serde's schema under its subject (`auto.register.schemas=true`, the
    /// default); registering a schema the subject already has returns its id.
    #[default]
    AutoRegister,
    /// Writes with the subject's latest registered schema (`use.latest.version=true`), for
    /// applications that must not register schemas.
    UseLatest,
}

/// What went wrong between a serde and the schema registry, or in the wire format.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// No HTTP exchange with the registry.
    #[error("schema registry at {url} unreachable: {reason} (check the registry URL and that the registry runs)")]
    Unreachable {
        /// The registry's base URL.
        url: String,
        /// The transport error.
        reason: String,
    },
    /// The id in a record is not in this registry.
    #[error("schema id {id} is not in the schema registry at {url}: the record was written against another registry, or its schema was deleted; read with a serde built on the registry the producer used")]
    UnknownSchemaId {
        /// The id in the record.
        id: u32,
        /// The registry's base URL.
        url: String,
    },
    /// The subject has no versions (use-latest, or a lookup).
    #[error("subject {subject} not found in the schema registry at {url}: register its schema first (or let the serde auto-register it)")]
    SubjectNotFound {
        /// The subject.
        subject: String,
        /// The registry's base URL.
        url: String,
    },
    /// The registry refused the schema under the subject's compatibility level (HTTP 409).
    #[error("schema incompatible with the earlier versions of subject {subject}: {message} (make the change compatible, e.g. give a new field a default, or change the subject's compatibility level)")]
    Incompatible {
        /// The subject.
        subject: String,
        /// The registry's explanation.
        message: String,
    },
    /// The registry could not parse the schema (HTTP 422, error 42201).
    #[error("the schema registry rejected the schema of subject {subject} as invalid: {message}")]
    InvalidSchema {
        /// The subject.
        subject: String,
        /// The registry's explanation.
        message: String,
    },
    /// Any other error answer of the registry.
    #[error("schema registry error {status} (code {code}) on {what}: {message}")]
    Registry {
        /// HTTP status.
        status: u16,
        /// The registry's `error_code`.
        code: i64,
        /// The request.
        what: String,
        /// The registry's message.
        message: String,
    },
    /// An answer that is not the registry API's JSON.
    #[error("unexpected answer of the schema registry on {what}: {reason} (is the URL a Confluent-compatible registry API? For Apicurio Registry use its /apis/ccompat/v7 path)")]
    BadResponse {
        /// The request.
        what: String,
        /// What was wrong.
        reason: String,
    },
    /// The bytes are not in the Confluent wire format.
    #[error("not in the schema registry's wire format: {0} (was it written without a schema registry serializer?)")]
    Wire(String),
    /// A schema the serde was given, or one fetched from the registry, could not be used.
    #[error("schema: {0}")]
    Schema(String),
    /// The record's schema id names a schema of another type than the serde's.
    #[error("schema id {id} is a {found} schema, and this serde reads {expected}")]
    WrongSchemaType {
        /// The id in the record.
        id: u32,
        /// The serde's type.
        expected: SchemaType,
        /// The registered schema's type.
        found: SchemaType,
    },
    /// Encoding or decoding the payload failed.
    #[error("{format} payload: {reason}")]
    Payload {
        /// Avro, Protobuf or JSON.
        format: &'static str,
        /// What failed.
        reason: String,
    },
}

impl RegistryError {
    /// This error as a [`SerdeError`] of `serde`.
    pub fn into_serde(self, serde: &'static str) -> SerdeError {
        SerdeError::new(serde, self.to_string())
    }
}

/// The schema a serde writes with: its own (registered on first use) or its subject's latest,
/// looked up once.
pub(crate) struct WriterSchema {
    registry: SchemaRegistry,
    subject: String,
    schema_type: SchemaType,
    schema: String,
    lookup: SchemaLookup,
    current: parking_lot::RwLock<Option<std::sync::Arc<RegisteredSchema>>>,
}

impl WriterSchema {
    pub(crate) fn new(
        registry: &SchemaRegistry,
        subject: String,
        schema_type: SchemaType,
        schema: String,
    ) -> Self {
        WriterSchema {
            registry: registry.clone(),
            subject,
            schema_type,
            schema,
            lookup: SchemaLookup::AutoRegister,
            current: parking_lot::RwLock::new(None),
        }
    }

    pub(crate) fn set_lookup(&mut self, lookup: SchemaLookup) {
        self.lookup = lookup;
        *self.current.get_mut() = None;
    }

    pub(crate) fn subject(&self) -> &str {
        &self.subject
    }

    /// The id and text to write with.
    pub(crate) fn get(&self) -> Result<std::sync::Arc<RegisteredSchema>, RegistryError> {
        if let Some(s) = &*self.current.read() {
            return Ok(s.clone());
        }
        let schema = match self.lookup {
            SchemaLookup::AutoRegister => {
                let id = self
                    .registry
                    .register(&self.subject, self.schema_type, &self.schema)?;
                std::sync::Arc::new(RegisteredSchema {
                    id,
                    schema_type: self.schema_type,
                    schema: self.schema.clone(),
                })
            }
            SchemaLookup::UseLatest => {
                let latest = self.registry.latest(&self.subject)?;
                if latest.schema_type != self.schema_type {
                    return Err(RegistryError::WrongSchemaType {
                        id: latest.id,
                        expected: self.schema_type,
                        found: latest.schema_type,
                    });
                }
                latest
            }
        };
        *self.current.write() = Some(schema.clone());
        Ok(schema)
    }
}

/// The registered schema of id `id`, which must be of type `expected`.
pub(crate) fn reader_check(
    registry: &SchemaRegistry,
    id: u32,
    expected: SchemaType,
) -> Result<std::sync::Arc<RegisteredSchema>, RegistryError> {
    let schema = registry.schema_by_id(id)?;
    if schema.schema_type != expected {
        return Err(RegistryError::WrongSchemaType {
            id,
            expected,
            found: schema.schema_type,
        });
    }
    Ok(schema)
}

#[cfg(test)]
mod tests;
