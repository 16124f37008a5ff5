//! Start-up's topic step: wait for the brokers, check the source topics, create the internal ones.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{
    Runtime, RuntimeError, CHANGELOG_MIN_COMPACTION_LAG, CONNECT_DEADLINE, REQUEST_TIMEOUT,
};
use crate::engine::changelog::changelog_topic;
use crate::kafka::admin::{
    client_config, create_topics_with, is_transient, partition_counts, partition_counts_checked,
    topic_config, AuthWatch,
};

impl Runtime {
    /// Waits for the brokers, checks source topics, creates internal topics; returns partition
    /// counts of every source and internal topic.
    pub(super) fn prepare_topics(&self) -> Result<BTreeMap<String, u32>, RuntimeError> {
        let cfg = client_config(&self.bootstrap, &self.config.kafka);
        // One client for the wait, so a refused login (reported through its context) ends it.
        let probe: BaseConsumer<AuthWatch> = cfg.create_with_context(AuthWatch::default())?;
        let external: Vec<String> = self
            .topology
            .source_topics()
            .iter()
            .filter(|t| !t.is_internal())
            .map(|t| self.resolve(t))
            .collect();
        let start = std::time::Instant::now();
        let mut backoff = Duration::from_millis(200);
        let counts = loop {
            let result = partition_counts_checked(&probe, &external, REQUEST_TIMEOUT);
            if let Some(detail) = probe.context().failure() {
                return Err(RuntimeError::Authentication {
                    bootstrap: self.bootstrap.clone(),
                    detail,
                });
            }
            match result {
                Ok(c) => break c,
                Err(e) if is_transient(&e) && start.elapsed() < CONNECT_DEADLINE => {
                    tracing::warn!(bootstrap = %self.bootstrap, error = %e, retry_in = ?backoff, "Kafka is not reachable yet; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let mut partitions = BTreeMap::new();
        for (t, n) in counts {
            let n = n.ok_or_else(|| RuntimeError::MissingSourceTopic(t.clone()))?;
            partitions.insert(t, n);
        }
        self.topology
            .resolve_internal_partitions(&self.config.application_id, &mut partitions);
        let internal = self.topology.internal_topics();
        for st in self.topology.sub_topologies() {
            let topics: Vec<String> = st.sources.iter().map(|(t, _)| self.resolve(t)).collect();
            let counts: Vec<u32> = topics
                .iter()
                .map(|t| partitions.get(t).copied().unwrap_or(1))
                .collect();
            if counts.windows(2).any(|w| w[0] != w[1]) {
                return Err(RuntimeError::NotCoPartitioned { topics, counts });
            }
        }
        let to_create: Vec<(String, u32)> = internal
            .keys()
            .map(|t| {
                let name = self.resolve(t);
                let n = partitions.get(&name).copied().unwrap_or(1);
                (name, n)
            })
            .collect();
        // One compacted changelog per store, partitioned like its sub-topology's input.
        let mut changelogs = Vec::new();
        // The store of each changelog, in the same order (for its declared topic configs).
        let mut stores_of = Vec::new();
        for st in self.topology.sub_topologies() {
            let n = st
                .sources
                .iter()
                .filter_map(|(s, _)| partitions.get(&self.resolve(s)).copied())
                .max()
                .unwrap_or(1);
            for store in &st.logged {
                changelogs.push((changelog_topic(&self.config.application_id, store), n));
                stores_of.push(store.clone());
            }
        }
        // Internal topics that exist already must match what rill would create.
        let names: Vec<String> = to_create
            .iter()
            .chain(&changelogs)
            .map(|(n, _)| n.clone())
            .collect();
        // The endpoint map's topic: one partition, so its offsets order every instance's records.
        let endpoints = self
            .endpoints_enabled()
            .then(|| crate::query::metadata::endpoints_topic(&self.config.application_id));
        let mut names = names;
        names.extend(endpoints.clone());
        let existing = partition_counts(&cfg, &names, REQUEST_TIMEOUT)?;
        if let Some(name) = &endpoints {
            if let Some(Some(have)) = existing.get(name) {
                if *have != 1 {
                    return Err(RuntimeError::InternalTopic {
                        topic: name.clone(),
                        problem: format!(
                            "has {have} partitions, but the endpoint map needs one (its offsets \
                             order the instances' records)"
                        ),
                    });
                }
            }
        }
        for (name, want) in to_create.iter().chain(&changelogs) {
            if let Some(Some(have)) = existing.get(name) {
                if have != want {
                    return Err(RuntimeError::InternalTopic {
                        topic: name.clone(),
                        problem: format!(
                            "has {have} partitions, but its input has {want}: records would reach \
                             the wrong tasks"
                        ),
                    });
                }
            }
        }
        match &self.embedded {
            Some(cluster) => {
                for (name, n) in to_create.iter().chain(&changelogs) {
                    cluster.create_topic(name, *n)?;
                }
                if let Some(name) = &endpoints {
                    cluster.create_topic(name, 1)?;
                }
            }
            None => {
                let existing_changelogs: Vec<String> = changelogs
                    .iter()
                    .filter(|(n, _)| matches!(existing.get(n), Some(Some(_))))
                    .map(|(n, _)| n.clone())
                    .collect();
                let policies = topic_config(
                    &cfg,
                    &existing_changelogs,
                    "cleanup.policy",
                    REQUEST_TIMEOUT,
                )?;
                for (topic, policy) in policies {
                    if !policy.split(',').any(|p| p.trim() == "compact") {
                        return Err(RuntimeError::InternalTopic {
                            topic,
                            problem: format!(
                                "has cleanup.policy={policy}: a changelog needs compact, or \
                                 restores lose state"
                            ),
                        });
                    }
                }
                let replication = self.config.replication_factor;
                let created = |topics: &[(String, u32)], configs: &[(&str, &str)]| {
                    create_topics_with(&cfg, topics, configs, replication, REQUEST_TIMEOUT)
                        .map_err(|e| replication_refused(e, replication))
                };
                created(&to_create, &[])?;
                let lag = CHANGELOG_MIN_COMPACTION_LAG.as_millis().to_string();
                // One request per distinct set of configs (most changelogs share rill's own).
                let mut by_configs: BTreeMap<Configs, Vec<(String, u32)>> = BTreeMap::new();
                for (changelog, store) in changelogs.iter().zip(&stores_of) {
                    let declared = self.topology.changelog_configs(store);
                    let configs = changelog_configs(declared, &lag).map_err(|problem| {
                        RuntimeError::InternalTopic {
                            topic: changelog.0.clone(),
                            problem,
                        }
                    })?;
                    by_configs
                        .entry(configs)
                        .or_default()
                        .push(changelog.clone());
                }
                for (configs, topics) in &by_configs {
                    let configs: Vec<(&str, &str)> = configs
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    created(topics, &configs)?;
                }
                if let Some(name) = &endpoints {
                    created(&[(name.clone(), 1)], &[("cleanup.policy", "compact")])?;
                }
            }
        }
        Ok(partitions)
    }
}

/// Topic configs, as (key, value) pairs.
type Configs = Vec<(String, String)>;

/// The topic configs of a new changelog: rill's (`cleanup.policy=compact`,
/// `min.compaction.lag.ms=lag`) overridden by those its store's builder declared
/// (`with_logging_enabled`). A `cleanup.policy` without `compact` is refused: restores need the
/// latest value of every key.
fn changelog_configs(
    declared: Option<&BTreeMap<String, String>>,
    lag: &str,
) -> Result<Configs, String> {
    let mut configs: BTreeMap<String, String> = [
        ("cleanup.policy".to_string(), "compact".to_string()),
        ("min.compaction.lag.ms".to_string(), lag.to_string()),
    ]
    .into();
    configs.extend(
        declared
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let policy = configs.get("cleanup.policy").map_or("", String::as_str);
    if !policy.split(',').any(|p| p.trim() == "compact") {
        return Err(format!(
            "its store's builder asks for cleanup.policy={policy}: a changelog needs compact \
             (with_logging_enabled may add delete, as compact,delete)"
        ));
    }
    Ok(configs.into_iter().collect())
}

/// A broker's refusal of `replication.factor` as a start error that names the key.
fn replication_refused(e: rdkafka::error::KafkaError, replication: i32) -> RuntimeError {
    match e {
        rdkafka::error::KafkaError::AdminOp(
            rdkafka::types::RDKafkaErrorCode::InvalidReplicationFactor,
        ) => RuntimeError::Config(crate::config::ConfigError::BadValue {
            key: "replication.factor".into(),
            value: replication.to_string(),
            expected: "at most the number of brokers in the cluster (the broker refused to create the internal topics with it)".into(),
        }),
        e => RuntimeError::Kafka(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stores_changelog_configs_override_rills_but_keep_compaction() {
        let rill = changelog_configs(None, "60000").unwrap();
        assert_eq!(
            rill,
            [
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("min.compaction.lag.ms".to_string(), "60000".to_string()),
            ]
        );
        let mine: BTreeMap<String, String> = [
            ("segment.ms".to_string(), "3600000".to_string()),
            ("min.compaction.lag.ms".to_string(), "120000".to_string()),
            ("cleanup.policy".to_string(), "compact,delete".to_string()),
        ]
        .into();
        let configs: BTreeMap<String, String> = changelog_configs(Some(&mine), "60000")
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(configs, mine);
        let deleting: BTreeMap<String, String> =
            [("cleanup.policy".to_string(), "delete".to_string())].into();
        let err = changelog_configs(Some(&deleting), "60000").unwrap_err();
        assert!(err.contains("cleanup.policy=delete"), "{err}");
    }
}
