//! [`Change`]: a table update with the value it replaces (Kafka Streams' `Change<V>`), what a
//! table's change stream carries so that a regrouping can retract the old value
//! ([`crate::dsl::KTable::group_by`]), and [`ChangeSerde`], its layout on a repartition topic.

use std::sync::Arc;

use crate::serdes::{Serde, SerdeError};

/// A table update: the key's value after it (`None`: deleted) and before it (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change<V> {
    /// The value after the update.
    pub new: Option<V>,
    /// The value before it.
    pub old: Option<V>,
}

/// Serializes a [`Change`] with the value serde: a flags byte (1: new set, 2: old set), the new
/// value's length (4 bytes, big-endian) and bytes, then the old value's bytes.
pub struct ChangeSerde<V>(pub Arc<dyn Serde<V>>);

impl<V: 'static> Serde<Change<V>> for ChangeSerde<V> {
    fn serialize(&self, value: &Change<V>) -> Result<Vec<u8>, SerdeError> {
        let new = value
            .new
            .as_ref()
            .map(|v| self.0.serialize(v))
            .transpose()?;
        let old = value
            .old
            .as_ref()
            .map(|v| self.0.serialize(v))
            .transpose()?;
        let flags = u8::from(new.is_some()) | (u8::from(old.is_some()) << 1);
        let new = new.unwrap_or_default();
        let len = u32::try_from(new.len())
            .map_err(|_| SerdeError::new("ChangeSerde", "a table value longer than 4 GiB"))?;
        let mut out = Vec::with_capacity(5 + new.len() + old.as_ref().map_or(0, Vec::len));
        out.push(flags);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&new);
        out.extend_from_slice(&old.unwrap_or_default());
        Ok(out)
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Change<V>, SerdeError> {
        let bad = || {
            SerdeError::new(
                "ChangeSerde",
                "not a table change (flags, length, new value, old value)",
            )
        };
        let (&flags, rest) = bytes.split_first().ok_or_else(bad)?;
        let len = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .ok_or_else(bad)? as usize;
        let new_bytes = rest.get(4..4 + len).ok_or_else(bad)?;
        let old_bytes = &rest[4 + len..];
        Ok(Change {
            new: (flags & 1 != 0)
                .then(|| self.0.deserialize(new_bytes))
                .transpose()?,
            old: (flags & 2 != 0)
                .then(|| self.0.deserialize(old_bytes))
                .transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serdes::StringSerde;

    #[test]
    fn a_change_round_trips_with_either_side_absent_or_empty() {
        let serde = ChangeSerde::<String>(Arc::new(StringSerde));
        for (new, old) in [
            (Some("a"), Some("bc")),
            (None, Some("")),
            (Some(""), None),
            (None, None),
        ] {
            let c = Change {
                new: new.map(String::from),
                old: old.map(String::from),
            };
            let bytes = serde.serialize(&c).unwrap();
            assert_eq!(serde.deserialize(&bytes).unwrap(), c);
        }
        assert!(serde.deserialize(&[1, 0, 0]).is_err());
    }
}
