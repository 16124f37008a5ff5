//! Avro values in the Confluent wire format.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use apache_avro::Schema;
use parking_lot::RwLock;
use rill_topology::serdes::{Serde, SerdeError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    reader_check, wire, RegistryError, SchemaRegistry, SchemaType, SubjectNameStrategy,
    SubjectRole, WriterSchema,
};

const NAME: &str = "AvroSerde";

/// Avro values of `T` (serde's `Serialize` and `Deserialize`, field names as in the schema) in
/// the Confluent wire format, with their schemas in a [`SchemaRegistry`].
///
/// Written with the serde's schema, registered under its subject on the first write (or with
/// the subject's latest schema, [`AvroSerde::use_latest`]). Read with the writer's schema,
/// fetched by the record's id once, resolved to the serde's schema by Avro's rules: a field the
/// writer did not have takes its default, a field the reader does not have is skipped.
pub struct AvroSerde<T> {
    registry: SchemaRegistry,
    /// The serde's schema: the reader schema, and the writer schema unless `use_latest`.
    schema: Arc<Schema>,
    writer: WriterSchema,
    /// Parsed schemas by id: writers of records read, and the latest when `use_latest`.
    parsed: RwLock<HashMap<u32, Arc<Schema>>>,
    _values: PhantomData<fn() -> T>,
}

impl<T> AvroSerde<T> {
    for_topic_method!("the Avro schema `schema` (JSON text).");

    /// A serde with the Avro schema `schema` (JSON text) under the subject that `strategy`
    /// names (the record strategies use the schema's full name, `namespace.name`).
    pub fn new(
        registry: &SchemaRegistry,
        strategy: SubjectNameStrategy,
        schema: &str,
    ) -> Result<Self, RegistryError> {
        let parsed = Schema::parse_str(schema)
            .map_err(|e| RegistryError::Schema(format!("invalid Avro schema: {e}")))?;
        let name = parsed.name().map(|n| n.fullname(None));
        let subject = strategy.subject(name.as_deref())?;
        Ok(AvroSerde {
            registry: registry.clone(),
            schema: Arc::new(parsed),
            writer: WriterSchema::new(registry, subject, SchemaType::Avro, schema.to_string()),
            parsed: RwLock::default(),
            _values: PhantomData,
        })
    }

    writer_methods!(
        "Writes with the subject's latest registered schema instead of registering the serde's own (`use.latest.version`); the value is resolved to that schema (a field it has and the value lacks takes its default)."
    );

    /// The parsed schema of `id`, of type Avro.
    fn schema_of(&self, id: u32) -> Result<Arc<Schema>, RegistryError> {
        if let Some(s) = self.parsed.read().get(&id) {
            return Ok(s.clone());
        }
        let registered = reader_check(&self.registry, id, SchemaType::Avro)?;
        let schema = Arc::new(Schema::parse_str(&registered.schema).map_err(|e| {
            RegistryError::Schema(format!(
                "the registry's schema id {id} is not valid Avro: {e}"
            ))
        })?);
        self.parsed.write().insert(id, schema.clone());
        Ok(schema)
    }

    fn encode(&self, value: &T) -> Result<Vec<u8>, RegistryError>
    where
        T: Serialize,
    {
        let registered = self.writer.get()?;
        let schema = match self.writer_is_own() {
            true => self.schema.clone(),
            false => self.schema_of(registered.id)?,
        };
        let payload = apache_avro::to_value(value)
            .and_then(|v| v.resolve(&schema))
            .and_then(|v| {
                apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
                    .build()?
                    .write_value_to_vec(v)
            })
            .map_err(|e| {
                payload_error(format!(
                    "cannot write the value with the schema of subject {}: {e}",
                    self.subject()
                ))
            })?;
        Ok(wire::encode(registered.id, &payload))
    }

    fn writer_is_own(&self) -> bool {
        self.writer.lookup == super::SchemaLookup::AutoRegister
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, RegistryError>
    where
        T: DeserializeOwned,
    {
        let (id, mut payload) = wire::decode(bytes)?;
        let writer = self.schema_of(id)?;
        let value = apache_avro::reader::datum::GenericDatumReader::builder(&writer)
            .reader_schema(&self.schema)
            .build()
            .and_then(|r| r.read_value(&mut payload))
            .map_err(|e| payload_error(format!("schema id {id}: {e}")))?;
        apache_avro::from_value::<T>(&value)
            .map_err(|e| payload_error(format!("schema id {id}, into the serde's type: {e}")))
    }
}

fn payload_error(reason: String) -> RegistryError {
    RegistryError::Payload {
        format: "Avro",
        reason,
    }
}

impl<T> Serde<T> for AvroSerde<T>
where
    T: Serialize + DeserializeOwned + 'static,
{
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        self.encode(value).map_err(|e| e.into_serde(NAME))
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<T, SerdeError> {
        self.decode(bytes).map_err(|e| e.into_serde(NAME))
    }
}
