//! Serdes: how keys and values become bytes and back.
//!
//! The fixed-width integer serdes use the big-endian layout of Kafka's `IntegerSerializer` and
//! `LongSerializer`, so rill reads and writes the same bytes as Java clients.

use std::marker::PhantomData;

/// Why bytes could not become a value, or a value bytes.
#[derive(Debug, thiserror::Error)]
#[error("{serde}: {reason}")]
pub struct SerdeError {
    /// The serde that failed.
    pub serde: &'static str,
    /// What was wrong with the input.
    pub reason: String,
}

impl SerdeError {
    /// A new error from `serde` with `reason`.
    pub fn new(serde: &'static str, reason: impl Into<String>) -> Self {
        SerdeError {
            serde,
            reason: reason.into(),
        }
    }
}

/// Converts values of `T` to bytes and back.
///
/// Every topic is read and written with a serde for its keys and one for its values, and every
/// store keeps its keys and values with serdes: the built-in ones have Kafka's layouts
/// ([`StringSerde`], [`I64Serde`] as Kafka's `LongSerializer`...), [`JsonSerde`] and
/// [`ProtobufSerde`] cover structured values, and a type of your own implements the trait:
///
/// ```
/// use rill_topology::serdes::{Serde, SerdeError};
///
/// /// A temperature in tenths of a degree, as 2 bytes, big-endian.
/// #[derive(Debug, PartialEq)]
/// struct Celsius(f32);
///
/// struct CelsiusSerde;
///
/// impl Serde<Celsius> for CelsiusSerde {
///     fn serialize(&self, value: &Celsius) -> Result<Vec<u8>, SerdeError> {
///         Ok(((value.0 * 10.0).round() as i16).to_be_bytes().to_vec())
///     }
///     fn deserialize(&self, bytes: &[u8]) -> Result<Celsius, SerdeError> {
///         let tenths: [u8; 2] = bytes
///             .try_into()
///             .map_err(|_| SerdeError::new("CelsiusSerde", "not 2 bytes"))?;
///         Ok(Celsius(f32::from(i16::from_be_bytes(tenths)) / 10.0))
///     }
/// }
///
/// let bytes = CelsiusSerde.serialize(&Celsius(21.5))?;
/// assert_eq!(bytes, vec![0, 215]);
/// assert_eq!(CelsiusSerde.deserialize(&bytes)?, Celsius(21.5));
/// assert!(CelsiusSerde.deserialize(b"x").is_err());
/// # Ok::<(), SerdeError>(())
/// ```
pub trait Serde<T>: Send + Sync + 'static {
    /// Serializes `value`.
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerdeError>;
    /// Deserializes `bytes`.
    fn deserialize(&self, bytes: &[u8]) -> Result<T, SerdeError>;
    /// The value a null (a Kafka tombstone) stands for, when this serde has one ([`Nullable`]);
    /// without one, a stream record with a null value is a deserialization error.
    fn null_value(&self) -> Option<T> {
        None
    }
    /// Whether `value` is written as a null (a tombstone) instead of bytes.
    fn is_null(&self, _value: &T) -> bool {
        false
    }
}

/// `Option<T>` over the serde of `T`: a null value (a tombstone) reads as `None` and `None` is
/// written as a tombstone, as Kafka Streams' streams carry null values. A store cannot hold a
/// `None` (it has no bytes): filter or map the nulls before an aggregation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Nullable<S>(pub S);

impl<T: 'static, S: Serde<T>> Serde<Option<T>> for Nullable<S> {
    fn serialize(&self, value: &Option<T>) -> Result<Vec<u8>, SerdeError> {
        match value {
            Some(v) => self.0.serialize(v),
            None => Err(SerdeError::new(
                "Nullable",
                "None has no bytes: it is written to a topic as a tombstone, and a store cannot hold it (filter or map the nulls before the aggregation)",
            )),
        }
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<Option<T>, SerdeError> {
        self.0.deserialize(bytes).map(Some)
    }
    fn null_value(&self) -> Option<Option<T>> {
        Some(None)
    }
    fn is_null(&self, value: &Option<T>) -> bool {
        value.is_none()
    }
}

/// UTF-8 strings.
#[derive(Clone, Copy, Debug, Default)]
pub struct StringSerde;

impl Serde<String> for StringSerde {
    fn serialize(&self, value: &String) -> Result<Vec<u8>, SerdeError> {
        Ok(value.as_bytes().to_vec())
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<String, SerdeError> {
        String::from_utf8(bytes.to_vec())
            .map_err(|e| SerdeError::new("StringSerde", format!("invalid UTF-8: {e}")))
    }
}

/// Raw bytes, passed through unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct BytesSerde;

impl Serde<Vec<u8>> for BytesSerde {
    fn serialize(&self, value: &Vec<u8>) -> Result<Vec<u8>, SerdeError> {
        Ok(value.clone())
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<Vec<u8>, SerdeError> {
        Ok(bytes.to_vec())
    }
}

macro_rules! big_endian_serde {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $width:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;

        impl Serde<$ty> for $name {
            fn serialize(&self, value: &$ty) -> Result<Vec<u8>, SerdeError> {
                Ok(value.to_be_bytes().to_vec())
            }
            fn deserialize(&self, bytes: &[u8]) -> Result<$ty, SerdeError> {
                let arr: [u8; $width] = bytes.try_into().map_err(|_| {
                    SerdeError::new(
                        stringify!($name),
                        format!("expected {} bytes, got {}", $width, bytes.len()),
                    )
                })?;
                Ok(<$ty>::from_be_bytes(arr))
            }
        }
    };
}

big_endian_serde!(
    /// 32-bit signed integers, big-endian (Kafka's `IntegerSerializer`).
    I32Serde, i32, 4
);
big_endian_serde!(
    /// 64-bit signed integers, big-endian (Kafka's `LongSerializer`).
    I64Serde, i64, 8
);
big_endian_serde!(
    /// 64-bit unsigned integers, big-endian.
    U64Serde, u64, 8
);

/// JSON for any serde type (serde_json).
///
/// ```
/// use rill_topology::serdes::{JsonSerde, Serde};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Order {
///     customer: String,
///     cents: i64,
/// }
///
/// let serde = JsonSerde::<Order>::new();
/// let order = Order { customer: "alice".into(), cents: 1_000 };
/// let bytes = serde.serialize(&order)?;
/// assert_eq!(bytes, br#"{"customer":"alice","cents":1000}"#);
/// assert_eq!(serde.deserialize(&bytes)?, order);
/// # Ok::<(), rill_topology::serdes::SerdeError>(())
/// ```
pub struct JsonSerde<T>(PhantomData<fn() -> T>);

impl<T> JsonSerde<T> {
    /// A JSON serde for `T`.
    pub fn new() -> Self {
        JsonSerde(PhantomData)
    }
}

impl<T> Default for JsonSerde<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for JsonSerde<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> Serde<T> for JsonSerde<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        serde_json::to_vec(value).map_err(|e| SerdeError::new("JsonSerde", e.to_string()))
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<T, SerdeError> {
        serde_json::from_slice(bytes).map_err(|e| SerdeError::new("JsonSerde", e.to_string()))
    }
}

/// Protocol Buffers for any `prost::Message`.
pub struct ProtobufSerde<T>(PhantomData<fn() -> T>);

impl<T> ProtobufSerde<T> {
    /// A protobuf serde for `T`.
    pub fn new() -> Self {
        ProtobufSerde(PhantomData)
    }
}

impl<T> Default for ProtobufSerde<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ProtobufSerde<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> Serde<T> for ProtobufSerde<T>
where
    T: prost::Message + Default + 'static,
{
    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerdeError> {
        Ok(value.encode_to_vec())
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<T, SerdeError> {
        T::decode(bytes).map_err(|e| SerdeError::new("ProtobufSerde", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_serde_matches_kafka_long_serializer_layout() {
        assert_eq!(
            I64Serde.serialize(&1).unwrap(),
            vec![0, 0, 0, 0, 0, 0, 0, 1]
        );
        assert_eq!(
            I64Serde.serialize(&-2).unwrap(),
            vec![0xff; 7].into_iter().chain([0xfe]).collect::<Vec<_>>()
        );
        assert_eq!(I32Serde.serialize(&258).unwrap(), vec![0, 0, 1, 2]);
    }

    #[test]
    fn integer_serdes_round_trip_and_reject_wrong_widths() {
        assert_eq!(
            I64Serde
                .deserialize(&I64Serde.serialize(&i64::MIN).unwrap())
                .unwrap(),
            i64::MIN
        );
        assert_eq!(
            U64Serde
                .deserialize(&U64Serde.serialize(&u64::MAX).unwrap())
                .unwrap(),
            u64::MAX
        );
        let err = I32Serde.deserialize(&[1, 2, 3]).unwrap_err();
        assert!(err.to_string().contains("expected 4 bytes, got 3"), "{err}");
    }

    #[test]
    fn string_serde_rejects_invalid_utf8() {
        assert!(StringSerde.deserialize(&[0xff, 0xfe]).is_err());
        assert_eq!(StringSerde.deserialize(b"ok").unwrap(), "ok");
    }

    #[test]
    fn json_and_protobuf_serdes_round_trip() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Order {
            id: u32,
            customer: String,
        }
        let s = JsonSerde::<Order>::new();
        let o = Order {
            id: 7,
            customer: "c".into(),
        };
        assert_eq!(s.deserialize(&s.serialize(&o).unwrap()).unwrap(), o);
        assert!(s.deserialize(b"{not json").is_err());

        #[derive(Clone, PartialEq, prost::Message)]
        struct Point {
            #[prost(int64, tag = "1")]
            x: i64,
        }
        let p = ProtobufSerde::<Point>::new();
        assert_eq!(
            p.deserialize(&p.serialize(&Point { x: -5 }).unwrap())
                .unwrap(),
            Point { x: -5 }
        );
    }
}
