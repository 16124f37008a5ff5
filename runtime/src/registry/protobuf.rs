//! Protobuf messages (prost) in the Confluent wire format.

use std::marker::PhantomData;

use rill_topology::serdes::{Serde, SerdeError};

use super::{
    reader_check, wire, RegistryError, SchemaRegistry, SchemaType, SubjectNameStrategy,
    SubjectRole, WriterSchema,
};

const NAME: &str = "ProtobufSerde";

/// Protobuf messages of the prost type `T` in the Confluent wire format, with the `.proto` file
/// that declares the message registered under the serde's subject (schema type `PROTOBUF`).
///
/// The serde is given the `.proto` text (as the registry should store it) and the message's
/// fully-qualified name (`package.Message`, or `package.Outer.Inner`); it finds the message's
/// indexes in the file and writes them after the header (a single `0` for the file's first
/// message). Reading skips the indexes and decodes `T` with prost: protobuf's own rules make
/// fields added or removed by a later version of the writer's schema compatible.
pub struct ProtobufSerde<T> {
    registry: SchemaRegistry,
    writer: WriterSchema,
    indexes: Vec<i32>,
    _values: PhantomData<fn() -> T>,
}

impl<T> ProtobufSerde<T> {
    /// A serde for the `role` of `topic` (subject `{topic}-key` or `{topic}-value`) writing the
    /// message `message` (fully qualified) of the `.proto` file `proto`.
    pub fn for_topic(
        registry: &SchemaRegistry,
        topic: &str,
        role: SubjectRole,
        proto: &str,
        message: &str,
    ) -> Result<Self, RegistryError> {
        Self::new(
            registry,
            SubjectNameStrategy::topic(topic, role),
            proto,
            message,
        )
    }

    /// A serde writing the message `message` (fully qualified) of the `.proto` file `proto`
    /// under the subject `strategy` names (the record strategies use `message`).
    pub fn new(
        registry: &SchemaRegistry,
        strategy: SubjectNameStrategy,
        proto: &str,
        message: &str,
    ) -> Result<Self, RegistryError> {
        let indexes = message_indexes(proto, message)?;
        let subject = strategy.subject(Some(message))?;
        Ok(ProtobufSerde {
            registry: registry.clone(),
            writer: WriterSchema::new(registry, subject, SchemaType::Protobuf, proto.to_string()),
            indexes,
            _values: PhantomData,
        })
    }

    writer_methods!(
        "Writes with the id of the subject's latest registered schema instead of registering the serde's own (the message indexes stay those of the serde's `.proto`)."
    );

    /// The message indexes the serde writes.
    pub fn indexes(&self) -> &[i32] {
        &self.indexes
    }
}

fn payload_error(reason: String) -> SerdeError {
    RegistryError::Payload {
        format: "Protobuf",
        reason,
    }
    .into_serde(NAME)
}

impl<T> Serde<T> for ProtobufSerde<T>
where
    T: prost::Message + Default + 'static,
{
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        let id = self.writer.get().map_err(|e| e.into_serde(NAME))?.id;
        let mut out = wire::encode(id, &[]);
        wire::write_message_indexes(&self.indexes, &mut out);
        value
            .encode(&mut out)
            .map_err(|e| payload_error(e.to_string()))?;
        Ok(out)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<T, SerdeError> {
        let (id, payload) = wire::decode(bytes).map_err(|e| e.into_serde(NAME))?;
        reader_check(&self.registry, id, SchemaType::Protobuf).map_err(|e| e.into_serde(NAME))?;
        let (_indexes, message) =
            wire::read_message_indexes(payload).map_err(|e| e.into_serde(NAME))?;
        T::decode(message).map_err(|e| payload_error(format!("schema id {id}: {e}")))
    }
}

/// The indexes of the message `full_name` in the `.proto` text `proto`: its position among the
/// file's top-level messages, then among the nested messages of each enclosing one.
///
/// A scan of the file's tokens (comments and string literals skipped), not a full parser: it
/// follows `package`, `message NAME {` and the nesting of braces, which is all the indexes
/// need.
pub fn message_indexes(proto: &str, full_name: &str) -> Result<Vec<i32>, RegistryError> {
    let tokens = tokens(proto);
    let mut package = String::new();
    // Open blocks: (message name if a message, messages seen so far inside it).
    let mut stack: Vec<(Option<String>, i32)> = vec![(Some(String::new()), 0)];
    let mut path: Vec<i32> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "package" if stack.len() == 1 => {
                package = tokens.get(i + 1).cloned().unwrap_or_default();
                i += 1;
            }
            "message" if tokens.get(i + 2).map(String::as_str) == Some("{") => {
                let name = tokens[i + 1].clone();
                let top = stack.last_mut().expect("the file's frame");
                let index = top.1;
                top.1 += 1;
                path.truncate(stack.len() - 1);
                path.push(index);
                let mut names: Vec<&str> = stack
                    .iter()
                    .skip(1)
                    .filter_map(|(n, _)| n.as_deref())
                    .collect();
                names.push(&name);
                let qualified = match package.as_str() {
                    "" => names.join("."),
                    p => format!("{p}.{}", names.join(".")),
                };
                if qualified == full_name.trim_start_matches('.') {
                    return Ok(path);
                }
                stack.push((Some(name), 0));
                i += 2;
            }
            "{" => {
                // A block that holds no messages (enum, oneof, service, an option's value);
                // its nested braces are counted so that the closing one is found.
                stack.push((None, 0));
            }
            "}" => {
                if stack.len() > 1 {
                    stack.pop();
                }
                path.truncate(stack.len() - 1);
            }
            _ => {}
        }
        i += 1;
    }
    Err(RegistryError::Schema(format!(
        "no message {full_name} in the .proto (give its fully-qualified name, package included)"
    )))
}

/// Identifiers, `{`, `}` and other punctuation of `proto`, without comments and strings.
fn tokens(proto: &str) -> Vec<String> {
    let chars: Vec<char> = proto.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    let mut i = 0;
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if !word.is_empty() {
            out.push(std::mem::take(word));
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '/' if chars.get(i + 1) == Some(&'/') => {
                flush(&mut word, &mut out);
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                flush(&mut word, &mut out);
                i += 2;
                while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                    i += 1;
                }
                i += 1;
            }
            '"' | '\'' => {
                flush(&mut word, &mut out);
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                out.push("\"\"".into());
            }
            c if c.is_alphanumeric() || c == '_' || c == '.' => word.push(c),
            c if c.is_whitespace() => flush(&mut word, &mut out),
            c => {
                flush(&mut word, &mut out);
                out.push(c.to_string());
            }
        }
        i += 1;
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTO: &str = r#"
        syntax = "proto3";
        // message Commented { }
        package shop.v1;
        /* message AlsoCommented { } */
        message Payment {
            string account = 1;
            int64 amount = 2 [json_name = "a{mount"];
            enum Kind { CARD = 0; }
            message Line { string sku = 1; }
            oneof via { string card = 3; string iban = 4; }
            message Note { message Author { string name = 1; } }
        }
        enum Top { A = 0; }
        message Refund { string account = 1; }
    "#;

    #[test]
    fn finds_the_indexes_of_top_level_and_nested_messages() {
        let at = |name| message_indexes(PROTO, name).unwrap();
        assert_eq!(at("shop.v1.Payment"), [0]);
        assert_eq!(at("shop.v1.Refund"), [1]);
        assert_eq!(at("shop.v1.Payment.Line"), [0, 0]);
        assert_eq!(at("shop.v1.Payment.Note"), [0, 1]);
        assert_eq!(at("shop.v1.Payment.Note.Author"), [0, 1, 0]);
        let err = message_indexes(PROTO, "Payment").unwrap_err().to_string();
        assert!(err.contains("fully-qualified"), "{err}");
        assert_eq!(
            message_indexes("message A {} message B {}", "B").unwrap(),
            [1]
        );
    }
}
