//! A [`ProcessorHost`] over in-memory stores, for unit tests of what processors do with their
//! context (the typed store handles).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::processor::{Cancellable, ErasedRecord, ProcessorHost, PunctuationType, RecordMeta};
use crate::store::{KeyValueBytes, MemoryKeyValue, StoreError, StoreKind, TimedStore};
use crate::stores::StoreDeclaration;

/// One connected store: its bytes, layout and declaration, and the clocks of a timed store.
struct HostedStore {
    bytes: MemoryKeyValue,
    kind: StoreKind,
    declaration: Option<StoreDeclaration>,
    expired_below: i64,
    observed: Option<i64>,
}

/// Stores by name, a stream time, and the records forwarded.
#[derive(Default)]
pub(crate) struct TestHost {
    stores: BTreeMap<String, HostedStore>,
    /// The sub-task's stream time, as timed stores see it.
    pub(crate) stream_time: Option<i64>,
    /// What processors forwarded, in order.
    pub(crate) forwarded: Vec<ErasedRecord>,
    meta: RecordMeta,
}

impl TestHost {
    /// Connects store `name` with the layout and serdes `builder` declares.
    pub(crate) fn declare<K: 'static, V: 'static>(
        &mut self,
        builder: crate::stores::StoreBuilder<K, V>,
    ) {
        let (name, kind, declaration) = builder.into_declaration();
        self.connect(&name, kind);
        if let Some(s) = self.stores.get_mut(&name) {
            s.declaration = Some(declaration);
        }
    }

    /// Connects store `name` of layout `kind` without a declaration (as the DSL makes them).
    pub(crate) fn connect(&mut self, name: &str, kind: StoreKind) {
        self.stores.insert(
            name.to_string(),
            HostedStore {
                bytes: MemoryKeyValue::new(name),
                kind,
                declaration: None,
                expired_below: i64::MIN,
                observed: None,
            },
        );
    }

    fn hosted(&mut self, name: &str) -> Result<&mut HostedStore, StoreError> {
        self.stores
            .get_mut(name)
            .ok_or_else(|| StoreError::UnknownStore(name.to_string()))
    }
}

impl ProcessorHost for TestHost {
    fn forward(&mut self, record: ErasedRecord) {
        self.forwarded.push(record);
    }
    fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError> {
        Ok(&mut self.hosted(name)?.bytes)
    }
    fn store_declaration(&self, name: &str) -> Option<&StoreDeclaration> {
        self.stores.get(name)?.declaration.as_ref()
    }
    fn timed_store(&mut self, name: &str) -> Result<TimedStore<'_>, StoreError> {
        let stream_time = self.stream_time;
        let s = self.hosted(name)?;
        Ok(TimedStore {
            bytes: &mut s.bytes,
            kind: s.kind,
            stream_time,
            expired_below: &mut s.expired_below,
            observed: &mut s.observed,
        })
    }
    fn stream_time(&self) -> Option<i64> {
        self.stream_time
    }
    fn late_record_dropped(&mut self, _store: &str) {}
    fn schedule(&mut self, _interval: Duration, _kind: PunctuationType) -> Cancellable {
        Cancellable::new(0)
    }
    fn record_dropped(&mut self, _reason: &'static str) {}
    fn meta(&self) -> &RecordMeta {
        &self.meta
    }
}
