//! [`KTable`]: the changelog of an aggregation.

use super::KStream;
use crate::processor::Datum;

/// The changelog of an aggregation, keyed like its store; the counterpart of `KTable`.
pub struct KTable<K, V> {
    pub(super) stream: KStream<K, V>,
    pub(super) store: String,
}

impl<K: Datum + Clone, V: Datum + Clone> KTable<K, V> {
    /// The stream of updates: one record per change, carrying the new value.
    pub fn to_stream(&self) -> KStream<K, V> {
        self.stream.clone()
    }

    /// The name of the store that materializes the table.
    pub fn store_name(&self) -> &str {
        &self.store
    }
}
