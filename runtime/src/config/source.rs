//! Reading the sources: TOML flattened to dotted keys, and the flat `key -> text` map as serde
//! input that names the key in every value error.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};

use super::ConfigError;

/// Errors while deserializing [`Settings`] from the flat key map.
#[derive(Debug)]
pub(super) enum DeError {
    /// A key the struct does not have.
    Unknown(String),
    /// A value did not parse; carries what the key takes until the key is known.
    Value(String),
    /// A value error with its key.
    Config(ConfigError),
}

impl DeError {
    pub(super) fn into_config_error(self) -> ConfigError {
        match self {
            DeError::Unknown(key) => ConfigError::UnknownKey(key),
            DeError::Config(e) => e,
            // Values are only read through `Flat`, which names the key; kept for completeness.
            DeError::Value(expected) => ConfigError::BadValue {
                key: String::new(),
                value: String::new(),
                expected,
            },
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeError::Unknown(key) => write!(f, "unknown key `{key}`"),
            DeError::Value(expected) => write!(f, "expected {expected}"),
            DeError::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::Value(msg.to_string())
    }
    fn unknown_field(field: &str, _expected: &'static [&'static str]) -> Self {
        DeError::Unknown(field.to_string())
    }
}

/// The flat `key -> text` map as a serde map, naming the key in every value error.
pub(super) struct Flat<'a> {
    entries: std::collections::btree_map::Iter<'a, String, String>,
    current: Option<(&'a String, &'a String)>,
}

impl<'a> Flat<'a> {
    pub(super) fn new(values: &'a BTreeMap<String, String>) -> Self {
        Flat {
            entries: values.iter(),
            current: None,
        }
    }
}

impl<'de> MapAccess<'de> for Flat<'_> {
    type Error = DeError;

    fn next_key_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, DeError> {
        self.current = self.entries.next();
        match self.current {
            Some((key, _)) => seed.deserialize(key.as_str().into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, DeError> {
        let Some((key, value)) = self.current else {
            return Err(DeError::Value("a key before its value".into()));
        };
        seed.deserialize(value.clone().into_deserializer())
            .map_err(|e| match e {
                DeError::Value(expected) => DeError::Config(ConfigError::BadValue {
                    key: key.clone(),
                    value: value.clone(),
                    expected,
                }),
                other => other,
            })
    }
}

impl<'de> Deserializer<'de> for Flat<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// Flattens a TOML document into dotted keys with string values.
pub(super) fn parse_toml(path: &str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: path.to_string(),
            message: format!("not valid TOML: {}", e.to_string().trim_end()),
        })?;
    let mut out = Vec::new();
    flatten(path, "", &table, &mut out)?;
    Ok(out)
}

fn flatten(
    path: &str,
    prefix: &str,
    table: &toml::Table,
    out: &mut Vec<(String, String)>,
) -> Result<(), ConfigError> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let text = match v {
            toml::Value::Table(t) => {
                flatten(path, &key, t, out)?;
                continue;
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(_) | toml::Value::Array(_) => {
                return Err(ConfigError::File {
                    path: path.to_string(),
                    message: format!(
                        "key `{key}` holds a {}: expected a string, number or boolean",
                        v.type_str()
                    ),
                })
            }
        };
        out.push((key, text));
    }
    Ok(())
}
