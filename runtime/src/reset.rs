//! Resetting an application so that it processes its input again from a point in time (Kafka
//! Streams' application reset tool, `kafka-streams-application-reset`): `rill reset`.
//!
//! [`plan`] finds what a reset changes; [`apply`] changes it:
//! 1. the group's committed offsets of its input topics go to the earliest offsets (or those of
//!    a timestamp), with no range metadata, so every key range starts there;
//! 2. the application's internal topics (`<application.id>-…-repartition`, `-changelog`,
//!    `-endpoints`) are deleted; the next start creates them empty;
//! 3. the local state dir, when given, is removed (it must name this application: the
//!    `APPLICATION` file rill writes there), as the changelogs it restores from are gone.
//!
//! The group must have no members: a running instance would commit over the reset. Every other
//! instance's state dir must be removed too (each machine runs `rill reset --state-dir` or
//! deletes it); the plan says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka::admin::client_config;

/// Suffixes of the internal topics rill creates under `<application.id>-`.
const INTERNAL_SUFFIXES: &[&str] = &["-repartition", "-changelog", "-endpoints"];
/// Kafka's own topics, never an application's input.
const KAFKA_TOPICS: &[&str] = &[
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
];

/// Where the input offsets go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetTo {
    /// The earliest offset of every partition (the default).
    Earliest,
    /// The first offset at or after this timestamp (ms since the epoch).
    Timestamp(i64),
}

/// What to reset.
#[derive(Clone, Debug)]
pub struct ResetOptions {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// `application.id`: the consumer group and the internal topics' prefix.
    pub application_id: String,
    /// The input topics; `None`: every non-internal topic the group has committed offsets for.
    pub input_topics: Option<Vec<String>>,
    /// Where the input offsets go.
    pub to: ResetTo,
    /// This instance's state dir, to remove.
    pub state_dir: Option<PathBuf>,
    /// Further librdkafka settings (`kafka.*`: security).
    pub kafka: BTreeMap<String, String>,
    /// Timeout of each broker request.
    pub timeout: Duration,
}

/// What a reset changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResetPlan {
    /// (topic, partition, offset) the group's committed offsets go to.
    pub offsets: Vec<(String, i32, i64)>,
    /// Internal topics to delete.
    pub delete_topics: Vec<String>,
    /// The state dir to remove, if it exists.
    pub remove_state_dir: Option<PathBuf>,
}

impl std::fmt::Display for ResetPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (t, p, o) in &self.offsets {
            writeln!(f, "offset {t}/{p} -> {o}")?;
        }
        for t in &self.delete_topics {
            writeln!(f, "delete topic {t}")?;
        }
        match &self.remove_state_dir {
            Some(d) => writeln!(f, "remove state dir {}", d.display())?,
            None => writeln!(
                f,
                "no local state dir to remove (remove every instance's state.dir before it starts)"
            )?,
        }
        Ok(())
    }
}

/// Why a reset cannot be planned or applied.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// Kafka failed.
    #[error("kafka: {0}; check --bootstrap and that the brokers run")]
    Kafka(#[from] KafkaError),
    /// The group still has members.
    #[error("consumer group `{group}` still has {members} member(s): stop every instance of the application first (a static member stays until its session times out)")]
    GroupActive {
        /// The group.
        group: String,
        /// Its members.
        members: usize,
    },
    /// An input topic does not exist.
    #[error("input topic `{0}` does not exist")]
    MissingTopic(String),
    /// The state dir belongs to another application, or is not a rill state dir.
    #[error("state dir {}: {reason}; nothing was removed", dir.display())]
    StateDir {
        /// The dir.
        dir: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// A topic could not be deleted.
    #[error("deleting topic `{topic}` failed: {reason}")]
    DeleteTopic {
        /// The topic.
        topic: String,
        /// The broker's answer.
        reason: String,
    },
    /// Removing the state dir failed.
    #[error("removing state dir {}: {source}", dir.display())]
    Io {
        /// The dir.
        dir: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

fn consumer(o: &ResetOptions) -> Result<BaseConsumer, KafkaError> {
    let mut cfg = client_config(&o.bootstrap, &o.kafka);
    cfg.set("group.id", &o.application_id)
        .set("enable.auto.commit", "false")
        .set("allow.auto.create.topics", "false");
    cfg.create()
}

/// What a reset of `o` changes; fails when the group has members.
pub fn plan(o: &ResetOptions) -> Result<ResetPlan, ResetError> {
    let c = consumer(o)?;
    let groups = c.fetch_group_list(Some(&o.application_id), o.timeout)?;
    let members = groups
        .groups()
        .iter()
        .filter(|g| g.name() == o.application_id)
        .map(|g| g.members().len())
        .sum::<usize>();
    if members > 0 {
        return Err(ResetError::GroupActive {
            group: o.application_id.clone(),
            members,
        });
    }
    let metadata = c.fetch_metadata(None, o.timeout)?;
    let prefix = format!("{}-", o.application_id);
    let internal = |name: &str| {
        name.starts_with(&prefix) && INTERNAL_SUFFIXES.iter().any(|s| name.ends_with(s))
    };
    let partitions: BTreeMap<String, i32> = metadata
        .topics()
        .iter()
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect();
    let inputs: Vec<String> = match &o.input_topics {
        Some(topics) => {
            for t in topics {
                if !partitions.contains_key(t) {
                    return Err(ResetError::MissingTopic(t.clone()));
                }
            }
            topics.clone()
        }
        None => {
            let mut tpl = TopicPartitionList::new();
            for (t, n) in &partitions {
                if internal(t) || KAFKA_TOPICS.contains(&t.as_str()) {
                    continue;
                }
                for p in 0..*n {
                    tpl.add_partition(t, p);
                }
            }
            let committed = c.committed_offsets(tpl, o.timeout)?;
            let mut found: Vec<String> = committed
                .elements()
                .iter()
                .filter(|e| matches!(e.offset(), Offset::Offset(_)))
                .map(|e| e.topic().to_string())
                .collect();
            found.dedup();
            found
        }
    };
    let mut offsets = Vec::new();
    for t in &inputs {
        let n = partitions.get(t).copied().unwrap_or(0);
        match o.to {
            ResetTo::Earliest => {
                for p in 0..n {
                    let (low, _) = c.fetch_watermarks(t, p, o.timeout)?;
                    offsets.push((t.clone(), p, low));
                }
            }
            ResetTo::Timestamp(ms) => {
                let mut tpl = TopicPartitionList::new();
                for p in 0..n {
                    tpl.add_partition_offset(t, p, Offset::Offset(ms))?;
                }
                let found = c.offsets_for_times(tpl, o.timeout)?;
                for p in 0..n {
                    let offset = match found.find_partition(t, p).map(|e| e.offset()) {
                        Some(Offset::Offset(x)) => x,
                        // No record at or after the timestamp: the end.
                        _ => c.fetch_watermarks(t, p, o.timeout)?.1,
                    };
                    offsets.push((t.clone(), p, offset));
                }
            }
        }
    }
    let delete_topics = partitions.keys().filter(|t| internal(t)).cloned().collect();
    let remove_state_dir = match &o.state_dir {
        Some(dir) if dir.exists() => {
            check_state_dir(dir, &o.application_id)?;
            Some(dir.clone())
        }
        _ => None,
    };
    Ok(ResetPlan {
        offsets,
        delete_topics,
        remove_state_dir,
    })
}

/// Refuses a dir that is not a state dir of `application_id`.
fn check_state_dir(dir: &Path, application_id: &str) -> Result<(), ResetError> {
    let file = dir.join(rill_state::APPLICATION_FILE);
    let refuse = |reason: String| ResetError::StateDir {
        dir: dir.to_path_buf(),
        reason,
    };
    match std::fs::read_to_string(&file) {
        Ok(recorded) if recorded.trim() == application_id => Ok(()),
        Ok(recorded) => Err(refuse(format!(
            "it belongs to application `{}`",
            recorded.trim()
        ))),
        Err(e) => Err(refuse(format!(
            "no {} file naming the application ({e}): not a rill state dir?",
            rill_state::APPLICATION_FILE
        ))),
    }
}

/// Applies `plan` (from [`plan`] of the same options).
pub fn apply(o: &ResetOptions, plan: &ResetPlan) -> Result<(), ResetError> {
    if !plan.offsets.is_empty() {
        let c = consumer(o)?;
        let mut tpl = TopicPartitionList::new();
        for (t, p, offset) in &plan.offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*offset))?;
        }
        c.commit(&tpl, CommitMode::Sync)?;
    }
    if !plan.delete_topics.is_empty() {
        let admin: AdminClient<DefaultClientContext> =
            client_config(&o.bootstrap, &o.kafka).create()?;
        let names: Vec<&str> = plan.delete_topics.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(o.timeout));
        let results = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| ResetError::Io {
                dir: PathBuf::new(),
                source,
            })?
            .block_on(admin.delete_topics(&names, &options))?;
        for r in results {
            if let Err((topic, code)) = r {
                if code != rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition {
                    return Err(ResetError::DeleteTopic {
                        topic,
                        reason: code.to_string(),
                    });
                }
            }
        }
    }
    if let Some(dir) = &plan.remove_state_dir {
        check_state_dir(dir, &o.application_id)?;
        std::fs::remove_dir_all(dir).map_err(|source| ResetError::Io {
            dir: dir.clone(),
            source,
        })?;
    }
    Ok(())
}
