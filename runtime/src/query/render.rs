//! How keys in URLs become store bytes, and store bytes become JSON in answers, per store.

use std::collections::HashMap;
use std::sync::Arc;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use rill_topology::serdes::{I32Serde, I64Serde, Serde, StringSerde, U64Serde};
use serde_json::Value;

type Parse = dyn Fn(&str) -> Result<Vec<u8>, String> + Send + Sync;
type Render = dyn Fn(&[u8]) -> Option<Value> + Send + Sync;

/// Text for one serde's bytes: how a key written in a URL becomes the store's key bytes, and how
/// stored bytes show in a JSON answer. Bytes that do not decode show as `{"base64": "..."}`.
#[derive(Clone)]
pub struct Rendering {
    name: &'static str,
    parse: Arc<Parse>,
    render: Arc<Render>,
}

impl Rendering {
    /// UTF-8 strings ([`StringSerde`]): the URL text as it is; a JSON string.
    pub fn string() -> Self {
        Self::text(
            "string",
            StringSerde,
            |s| Ok(s.to_string()),
            |s| Value::from(s.clone()),
        )
    }

    /// Big-endian i64 ([`I64Serde`]): decimal text; a JSON number.
    pub fn i64() -> Self {
        Self::number("i64", I64Serde)
    }

    /// Big-endian i32 ([`I32Serde`]): decimal text; a JSON number.
    pub fn i32() -> Self {
        Self::number("i32", I32Serde)
    }

    /// Big-endian u64 ([`U64Serde`]): decimal text; a JSON number.
    pub fn u64() -> Self {
        Self::number("u64", U64Serde)
    }

    /// JSON of `T` ([`rill_topology::serdes::JsonSerde`]): the URL text is the JSON of a `T`
    /// (a string key in quotes), serialized again as the serde does; the stored JSON as it is.
    pub fn json<T>() -> Self
    where
        T: serde::Serialize + serde::de::DeserializeOwned + 'static,
    {
        Rendering {
            name: "json",
            parse: Arc::new(|text| {
                let value: T = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
                serde_json::to_vec(&value).map_err(|e| e.to_string())
            }),
            render: Arc::new(|bytes| serde_json::from_slice(bytes).ok()),
        }
    }

    /// Any bytes (the default): URL-safe base64 without padding in URLs; `{"base64": "..."}`.
    pub fn base64() -> Self {
        Rendering {
            name: "base64",
            parse: Arc::new(|text| {
                URL_SAFE_NO_PAD
                    .decode(text.trim_end_matches('='))
                    .map_err(|e| format!("not URL-safe base64: {e}"))
            }),
            render: Arc::new(|_| None),
        }
    }

    /// A rendering through `serde` of a type with a text form: `from_text` reads a URL,
    /// `to_json` shows a value.
    pub fn text<T: 'static>(
        name: &'static str,
        serde: impl Serde<T> + Clone,
        from_text: impl Fn(&str) -> Result<T, String> + Send + Sync + 'static,
        to_json: impl Fn(&T) -> Value + Send + Sync + 'static,
    ) -> Self {
        let s2 = serde.clone();
        Rendering {
            name,
            parse: Arc::new(move |text| {
                let value = from_text(text)?;
                s2.serialize(&value).map_err(|e| e.to_string())
            }),
            render: Arc::new(move |bytes| serde.deserialize(bytes).ok().map(|v| to_json(&v))),
        }
    }

    fn number<T>(name: &'static str, serde: impl Serde<T> + Clone) -> Self
    where
        T: std::str::FromStr + Into<Value> + Clone + 'static,
        T::Err: std::fmt::Display,
    {
        Self::text(
            name,
            serde,
            |s| s.parse::<T>().map_err(|e| format!("not a number: {e}")),
            |v| v.clone().into(),
        )
    }

    /// The rendering's name (`string`, `i64`, `json`, `base64`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The store bytes of a key written as `text` in a URL.
    pub fn parse(&self, text: &str) -> Result<Vec<u8>, String> {
        (self.parse)(text)
    }

    /// `bytes` as JSON: the decoded value, or `{"base64": "..."}` when they do not decode.
    pub fn render(&self, bytes: &[u8]) -> Value {
        (self.render)(bytes)
            .unwrap_or_else(|| serde_json::json!({ "base64": STANDARD.encode(bytes) }))
    }
}

impl std::fmt::Debug for Rendering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The key and value renderings of each store served over HTTP; stores not registered render
/// both as base64.
#[derive(Clone, Debug, Default)]
pub struct StoreRenderings {
    by_store: HashMap<String, (Rendering, Rendering)>,
}

impl StoreRenderings {
    /// Renders keys of `store` with `key` and its values with `value`.
    pub fn register(&mut self, store: &str, key: Rendering, value: Rendering) {
        self.by_store.insert(store.to_string(), (key, value));
    }

    /// The (key, value) renderings of `store`.
    pub fn of(&self, store: &str) -> (Rendering, Rendering) {
        self.by_store
            .get(store)
            .cloned()
            .unwrap_or_else(|| (Rendering::base64(), Rendering::base64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_number_json_and_base64_renderings_round_trip_and_fall_back_to_base64() {
        let s = Rendering::string();
        assert_eq!(s.parse("kafka").unwrap(), b"kafka");
        assert_eq!(s.render(b"kafka"), Value::from("kafka"));
        assert_eq!(s.render(&[0xff]), serde_json::json!({"base64": "/w=="}));
        let n = Rendering::i64();
        assert_eq!(n.parse("42").unwrap(), 42i64.to_be_bytes());
        assert_eq!(n.render(&42i64.to_be_bytes()), Value::from(42));
        assert!(n.parse("x").unwrap_err().contains("not a number"));
        let j = Rendering::json::<Vec<u32>>();
        assert_eq!(j.parse("[1, 2]").unwrap(), b"[1,2]");
        assert_eq!(j.render(b"[1,2]"), serde_json::json!([1, 2]));
        let b = Rendering::base64();
        assert_eq!(b.parse("AP8").unwrap(), vec![0, 255]);
        assert_eq!(b.render(&[0, 255]), serde_json::json!({"base64": "AP8="}));
    }
}
