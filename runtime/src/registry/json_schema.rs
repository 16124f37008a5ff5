//! JSON values with a JSON Schema, in the Confluent wire format.

use std::marker::PhantomData;

use rill_topology::serdes::{Serde, SerdeError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    reader_check, wire, RegistryError, SchemaRegistry, SchemaType, SubjectNameStrategy,
    SubjectRole, WriterSchema,
};

const NAME: &str = "JsonSchemaSerde";

/// JSON values of `T` (serde_json) in the Confluent wire format, with a JSON Schema registered
/// under the serde's subject (schema type `JSON`).
///
/// Values are not validated against the schema, on either side: the Rust type is the contract
/// (`serde` rejects a value that does not fit it when reading), and the registry checks the
/// schema's compatibility when it is registered. A record's schema id is still looked up once
/// (an unknown id, or an id of an Avro or Protobuf schema, is an error).
pub struct JsonSchemaSerde<T> {
    registry: SchemaRegistry,
    writer: WriterSchema,
    _values: PhantomData<fn() -> T>,
}

impl<T> JsonSchemaSerde<T> {
    for_topic_method!("the JSON Schema `schema`.");

    /// A serde with the JSON Schema `schema` under the subject `strategy` names (the record
    /// strategies use the schema's `title`).
    pub fn new(
        registry: &SchemaRegistry,
        strategy: SubjectNameStrategy,
        schema: &str,
    ) -> Result<Self, RegistryError> {
        let parsed: serde_json::Value = serde_json::from_str(schema)
            .map_err(|e| RegistryError::Schema(format!("the JSON Schema is not JSON: {e}")))?;
        let title = parsed.get("title").and_then(|t| t.as_str());
        let subject = strategy.subject(title)?;
        Ok(JsonSchemaSerde {
            registry: registry.clone(),
            writer: WriterSchema::new(registry, subject, SchemaType::Json, schema.to_string()),
            _values: PhantomData,
        })
    }

    writer_methods!(
        "Writes with the id of the subject's latest registered schema instead of registering the serde's own."
    );
}

fn payload_error(reason: String) -> SerdeError {
    RegistryError::Payload {
        format: "JSON",
        reason,
    }
    .into_serde(NAME)
}

impl<T> Serde<T> for JsonSchemaSerde<T>
where
    T: Serialize + DeserializeOwned + 'static,
{
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        let id = self.writer.get().map_err(|e| e.into_serde(NAME))?.id;
        let json = serde_json::to_vec(value).map_err(|e| payload_error(e.to_string()))?;
        Ok(wire::encode(id, &json))
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<T, SerdeError> {
        let (id, payload) = wire::decode(bytes).map_err(|e| e.into_serde(NAME))?;
        reader_check(&self.registry, id, SchemaType::Json).map_err(|e| e.into_serde(NAME))?;
        serde_json::from_slice(payload).map_err(|e| payload_error(format!("schema id {id}: {e}")))
    }
}
