//! The settings in effect as text for the start-up log, with secrets redacted.

use std::collections::BTreeMap;

use super::{
    Config, CorruptionHandler, MetricsAddr, OrderSensitivePolicy, ProcessingGuarantee,
    ProductionHandler,
};

/// Keys whose values are never logged: any key containing one of these.
const SECRET_MARKERS: &[&str] = &["password", "secret", "sasl.jaas", "ssl.key"];

impl Config {
    /// Every setting in effect (defaults included) as `key = value`, secrets redacted, for the
    /// start-up log.
    pub fn redacted(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            out.insert(k.to_string(), redact(k, &v));
        };
        put("application.id", self.application_id.clone());
        put(
            "bootstrap.servers",
            self.bootstrap_servers
                .clone()
                .unwrap_or_else(|| "(embedded cluster)".into()),
        );
        put(
            "parallelising.factor",
            self.parallelising_factor.to_string(),
        );
        put("parallelising.auto", self.parallelising_auto.to_string());
        put(
            "parallelising.factor.max",
            self.parallelising_factor_max.to_string(),
        );
        put(
            "parallelising.auto.queue.time.ms",
            self.parallelising_auto_queue_time.as_millis().to_string(),
        );
        put("worker.threads", self.worker_threads.to_string());
        put("worker.threads.nice", self.worker_threads_nice.to_string());
        put("replication.factor", self.replication_factor.to_string());
        put("state.dir", self.state_dir.display().to_string());
        put(
            "commit.interval.ms",
            self.commit_interval.as_millis().to_string(),
        );
        put("mailbox.capacity", self.mailbox_capacity.to_string());
        put(
            "processing.guarantee",
            match self.processing_guarantee {
                ProcessingGuarantee::AtLeastOnce => "at_least_once",
                ProcessingGuarantee::ExactlyOnceV2 => "exactly_once_v2",
            }
            .into(),
        );
        put(
            "metrics.addr",
            match self.metrics_addr {
                MetricsAddr::Off => "off".into(),
                MetricsAddr::On(a) => a.to_string(),
            },
        );
        put("group.protocol", self.group_protocol.name().into());
        put(
            "at.least.once.order.sensitive",
            match self.at_least_once_order_sensitive {
                OrderSensitivePolicy::Refuse => "refuse".into(),
                OrderSensitivePolicy::Allow => "allow".into(),
            },
        );
        put(
            "rocksdb.memory.bytes",
            self.rocksdb_memory_bytes.to_string(),
        );
        put(
            "rocksdb.max.open.files",
            self.rocksdb_max_open_files
                .map_or_else(|| "-1".into(), |n| n.to_string()),
        );
        put(
            "statestore.cache.max.bytes",
            self.statestore_cache_max_bytes.to_string(),
        );
        put(
            "deserialization.error.handler",
            self.deserialization_handler.to_string(),
        );
        put(
            "processing.exception.handler",
            self.processing_handler.to_string(),
        );
        put(
            "async.max.in.flight",
            self.async_stages.max_in_flight.to_string(),
        );
        put("async.threads", self.async_stages.threads.to_string());
        put(
            "retry.max.attempts",
            self.async_stages.retry_max_attempts.to_string(),
        );
        put(
            "retry.backoff.ms",
            self.async_stages.retry_backoff.as_millis().to_string(),
        );
        put("processing.order", self.async_stages.order.to_string());
        put("max.task.idle.ms", self.max_task_idle.to_string());
        put(
            "shutdown.timeout.ms",
            self.shutdown_timeout.as_millis().to_string(),
        );
        put(
            "production.exception.handler",
            match self.production_handler {
                ProductionHandler::Fail => "fail".into(),
                ProductionHandler::LogAndContinue => "log_and_continue".into(),
            },
        );
        put(
            "state.corruption.handler",
            match self.state_corruption_handler {
                CorruptionHandler::Fail => "fail".into(),
                CorruptionHandler::Rebuild => "rebuild".into(),
            },
        );
        put("admin.enabled", self.admin_enabled.to_string());
        put(
            "interactive.queries.enabled",
            self.interactive_queries_enabled.to_string(),
        );
        put(
            "application.server",
            self.application_server
                .clone()
                .unwrap_or_else(|| "unset".into()),
        );
        put(
            "brokers.unavailable.timeout.ms",
            self.brokers_unavailable_timeout
                .map_or_else(|| "unset".into(), |d| d.as_millis().to_string()),
        );
        for (k, v) in &self.kafka {
            put(&format!("kafka.{k}"), v.clone());
        }
        out
    }
}

/// `value`, or `[redacted]` when `key` names a secret.
pub(super) fn redact(key: &str, value: &str) -> String {
    if SECRET_MARKERS.iter().any(|s| key.contains(s)) {
        "[redacted]".into()
    } else {
        value.to_string()
    }
}
