//! Column family names: `{store}.p{partition}.r{start:016x}-{end:016x}`.

use rill_topology::keyrange::KeyRange;

use crate::error::StateError;

/// The longest accepted store name, in bytes (keeps column family names and file paths sane).
pub const MAX_STORE_NAME_LEN: usize = 200;

/// Checks that `name` is a valid store name: 1 to 200 characters of `[A-Za-z0-9_-]`.
pub fn validate_store_name(name: &str) -> Result<(), StateError> {
    let reason = if name.is_empty() {
        Some("store names must not be empty")
    } else if name.len() > MAX_STORE_NAME_LEN {
        Some("store names are at most 200 characters long")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Some("store names are made of A-Z, a-z, 0-9, `_` and `-` only")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(StateError::InvalidStoreName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Identity of one column family: a store's data for one input partition and one key range.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ColumnFamilyId {
    /// The store name (`[A-Za-z0-9_-]+`).
    pub store: String,
    /// The input partition.
    pub partition: u32,
    /// The key range.
    pub range: KeyRange,
}

impl ColumnFamilyId {
    /// A validated id: the store name must be `[A-Za-z0-9_-]+` and the range non-empty.
    pub fn new(store: &str, partition: u32, range: KeyRange) -> Result<Self, StateError> {
        validate_store_name(store)?;
        if range.start > range.end {
            return Err(StateError::InvalidRange { range });
        }
        Ok(ColumnFamilyId {
            store: store.to_string(),
            partition,
            range,
        })
    }

    /// The column family name, `{store}.p{partition}.r{start:016x}-{end:016x}`.
    pub fn name(&self) -> String {
        format!("{}.p{}.r{}", self.store, self.partition, self.range)
    }

    /// Parses a column family name made by [`name`](Self::name); `None` for any other name
    /// (e.g. RocksDB's `default`, or a non-canonical spelling).
    pub fn parse(name: &str) -> Option<Self> {
        let mut parts = name.split('.');
        let store = parts.next()?;
        let partition = parts.next()?.strip_prefix('p')?;
        let range = parts.next()?.strip_prefix('r')?;
        if parts.next().is_some() || validate_store_name(store).is_err() {
            return None;
        }
        let partition: u32 = partition.parse().ok()?;
        let (start, end) = range.split_once('-')?;
        if start.len() != 16 || end.len() != 16 {
            return None;
        }
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        let id = ColumnFamilyId::new(store, partition, KeyRange { start, end }).ok()?;
        // Only the canonical spelling (no `+`, no leading zeros, lower-case hex) is rill's.
        (id.name() == name).then_some(id)
    }
}

/// The column families of one sub-task: each of `stores` for (`partition`, `range`).
pub fn sub_task_column_families(
    stores: &[String],
    partition: u32,
    range: KeyRange,
) -> Result<Vec<ColumnFamilyId>, StateError> {
    stores
        .iter()
        .map(|store| ColumnFamilyId::new(store, partition, range))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn name_has_the_documented_format() {
        let id = ColumnFamilyId::new("counts", 3, KeyRange::nth(1, 2)).unwrap();
        assert_eq!(id.name(), "counts.p3.r8000000000000000-ffffffffffffffff");
        assert_eq!(ColumnFamilyId::parse(&id.name()), Some(id));
    }

    #[test]
    fn other_names_do_not_parse() {
        for name in [
            "default",
            "",
            "counts",
            "counts.p3",
            "counts.p3.r0000000000000000",
            "counts.p3.r0000000000000000-ffffffffffffffff.x",
            "counts.p+3.r0000000000000000-ffffffffffffffff",
            "counts.p03.r0000000000000000-ffffffffffffffff",
            "counts.p3.r0000000000000000-FFFFFFFFFFFFFFFF",
            "counts.p3.r0000000000000001-0000000000000000",
            "counts.p3.r000000000000000-ffffffffffffffff",
            "count s.p3.r0000000000000000-ffffffffffffffff",
            "counts.p4294967296.r0000000000000000-ffffffffffffffff",
        ] {
            assert_eq!(ColumnFamilyId::parse(name), None, "{name}");
        }
    }

    #[test]
    fn store_names_are_validated() {
        for ok in ["a", "word-counts_2", "X"] {
            validate_store_name(ok).unwrap();
        }
        let long = "a".repeat(MAX_STORE_NAME_LEN + 1);
        for bad in ["", "a.b", "a b", "é", "a/b", long.as_str()] {
            assert!(matches!(
                validate_store_name(bad),
                Err(StateError::InvalidStoreName { .. })
            ));
        }
        assert!(matches!(
            ColumnFamilyId::new("s", 0, KeyRange { start: 2, end: 1 }),
            Err(StateError::InvalidRange { .. })
        ));
    }

    proptest! {
        #[test]
        fn name_and_parse_round_trip(
            store in "[A-Za-z0-9_-]{1,40}",
            partition in any::<u32>(),
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let range = KeyRange { start: a.min(b), end: a.max(b) };
            let id = ColumnFamilyId::new(&store, partition, range).unwrap();
            let name = id.name();
            prop_assert_eq!(ColumnFamilyId::parse(&name), Some(id));
        }

        #[test]
        fn parse_never_panics_and_only_accepts_canonical_names(name in ".{0,80}") {
            if let Some(id) = ColumnFamilyId::parse(&name) {
                prop_assert_eq!(id.name(), name);
            }
        }
    }
}
