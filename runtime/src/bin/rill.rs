//! `rill`: the operator command-line tool.
//!
//! `rill offsets --bootstrap B --group G [--topic T]` prints, per topic partition, the offset
//! committed by consumer group `G` and the per-key-range next offsets carried in rill's commit
//! metadata (see `rill_runtime::kafka::metadata`). Exit codes: 0 success, 1 broker error,
//! 2 usage error.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use rill_runtime::kafka::metadata::{self, MetadataError};

const USAGE: &str = "\
rill: operator tool for rill stream-processing applications

Usage:
    rill offsets --bootstrap <SERVERS> --group <GROUP> [--topic <TOPIC>] [--timeout-ms <MS>]
    rill --help
    rill --version

Commands:
    offsets    Print a consumer group's committed offsets and the per-key-range next offsets
               decoded from rill's commit metadata

Run `rill offsets --help` for the options of a command.
";

const OFFSETS_USAGE: &str = "\
rill offsets: print a consumer group's committed offsets and rill's per-key-range offsets

Usage:
    rill offsets --bootstrap <SERVERS> --group <GROUP> [--topic <TOPIC>] [--timeout-ms <MS>]

Options:
    --bootstrap <SERVERS>   Kafka bootstrap servers, e.g. 127.0.0.1:9092 (bootstrap.servers)
    --group <GROUP>         consumer group: the application.id of a rill application
    --topic <TOPIC>         only this topic (default: every topic except Kafka's internal ones)
    --timeout-ms <MS>       timeout of each broker request (default 10000)
    -h, --help              print this help

For every partition with a committed offset it prints `TOPIC/PARTITION committed OFFSET`, then
either one line per key range, `START-END next OFFSET` (16-hex-digit bounds of the closed
interval of the key-hash space, and the next offset to process in that range), or why there is
no range metadata (with the raw metadata when there is any). The group is not joined: the tool
reads offsets and changes nothing.

Exit status: 0 on success, 1 on a broker error, 2 on a usage error.
";

/// Kafka's own internal topics, never consumed by a rill application.
const INTERNAL_TOPICS: &[&str] = &[
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
];

/// Longest raw metadata shown, in characters; longer metadata is cut and its length given.
const RAW_SHOWN_CHARS: usize = 200;

/// How the command ended: a usage error (exit 2) or a failure talking to Kafka (exit 1).
enum Failure {
    Usage(String),
    Broker(String),
}

struct OffsetsArgs {
    bootstrap: String,
    group: String,
    topic: Option<String>,
    timeout: Duration,
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("rill: {message}");
            eprintln!("Run `rill --help` for usage.");
            ExitCode::from(2)
        }
        Err(Failure::Broker(message)) => {
            eprintln!("rill: {message}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Vec<OsString>) -> Result<(), Failure> {
    let args = args
        .into_iter()
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| Failure::Usage(format!("argument {arg:?} is not valid UTF-8")))
        })
        .collect::<Result<Vec<String>, Failure>>()?;
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return Err(Failure::Usage("no command given".into()));
    };
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        "-V" | "--version" | "version" => {
            println!("rill {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        "offsets" => match parse_offsets(rest)? {
            Some(args) => offsets(&args),
            None => {
                print!("{OFFSETS_USAGE}");
                Ok(())
            }
        },
        other if other.starts_with('-') => Err(Failure::Usage(format!("unknown option {other}"))),
        other => Err(Failure::Usage(format!("unknown command {other}"))),
    }
}

/// Parses the options of `rill offsets`; `None` when help was asked for.
fn parse_offsets(args: &[String]) -> Result<Option<OffsetsArgs>, Failure> {
    let (mut bootstrap, mut group, mut topic, mut timeout_ms) = (None, None, None, None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let slot = match name {
            "--bootstrap" => &mut bootstrap,
            "--group" => &mut group,
            "--topic" => &mut topic,
            "--timeout-ms" => &mut timeout_ms,
            _ if name.starts_with('-') => {
                return Err(Failure::Usage(format!("unknown option {name} for offsets")))
            }
            _ => return Err(Failure::Usage(format!("unexpected argument {name:?}"))),
        };
        let value = match inline_value {
            Some(value) => value,
            None => match args.next() {
                Some(value) if !value.starts_with("--") => value.clone(),
                _ => return Err(Failure::Usage(format!("option {name} needs a value"))),
            },
        };
        if value.is_empty() {
            return Err(Failure::Usage(format!(
                "option {name} needs a non-empty value"
            )));
        }
        if slot.replace(value).is_some() {
            return Err(Failure::Usage(format!("option {name} given twice")));
        }
    }
    let bootstrap =
        bootstrap.ok_or_else(|| Failure::Usage("offsets needs --bootstrap <SERVERS>".into()))?;
    let group = group.ok_or_else(|| Failure::Usage("offsets needs --group <GROUP>".into()))?;
    let timeout = match timeout_ms {
        None => Duration::from_secs(10),
        Some(ms) => match ms.parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                return Err(Failure::Usage(format!(
                    "--timeout-ms must be a positive number of milliseconds, not {ms:?}"
                )))
            }
        },
    };
    Ok(Some(OffsetsArgs {
        bootstrap,
        group,
        topic,
        timeout,
    }))
}

/// `rill offsets`: reads the group's committed offsets without joining the group.
fn offsets(args: &OffsetsArgs) -> Result<(), Failure> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|e| Failure::Usage(format!("cannot create a Kafka client: {e}")))?;
    let cluster = consumer.fetch_metadata(None, args.timeout).map_err(|e| {
        Failure::Broker(format!(
            "cannot fetch metadata from {}: {e}",
            args.bootstrap
        ))
    })?;

    let mut partitions: Vec<(String, i32)> = Vec::new();
    let mut found_topic = false;
    for topic in cluster.topics() {
        let name = topic.name();
        let wanted = match &args.topic {
            Some(only) => name == only,
            None => !INTERNAL_TOPICS.contains(&name),
        };
        if !wanted {
            continue;
        }
        found_topic = true;
        if let Some(err) = topic.error() {
            eprintln!("rill: warning: metadata of topic {name}: {err:?}");
        }
        partitions.extend(
            topic
                .partitions()
                .iter()
                .map(|p| (name.to_string(), p.id())),
        );
    }
    if let Some(only) = &args.topic {
        if !found_topic {
            return Err(Failure::Broker(format!(
                "topic {only} does not exist on {}",
                args.bootstrap
            )));
        }
    }
    partitions.sort();
    if partitions.is_empty() {
        eprintln!("rill: no topic partitions on {}", args.bootstrap);
        return Ok(());
    }

    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (topic, partition) in &partitions {
        tpl.add_partition(topic, *partition);
    }
    let committed = consumer.committed_offsets(tpl, args.timeout).map_err(|e| {
        Failure::Broker(format!(
            "cannot fetch the committed offsets of group {}: {e}",
            args.group
        ))
    })?;

    let mut shown = 0;
    let mut failed = 0;
    for (index, elem) in committed.elements().iter().enumerate() {
        let (topic, partition) = (elem.topic(), elem.partition());
        if let Err(e) = elem.error() {
            eprintln!("rill: {topic}/{partition}: {e}");
            failed += 1;
            continue;
        }
        let Offset::Offset(offset) = elem.offset() else {
            continue;
        };
        shown += 1;
        print!(
            "{}",
            describe(topic, partition, offset, raw_metadata(&committed, index))
        );
    }
    if failed > 0 {
        return Err(Failure::Broker(format!(
            "could not read the committed offsets of {failed} partitions"
        )));
    }
    if shown == 0 {
        eprintln!(
            "rill: group {} has no committed offsets{}",
            args.group,
            args.topic
                .as_deref()
                .map(|t| format!(" on topic {t}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// The lines printed for one committed partition.
fn describe(topic: &str, partition: i32, offset: i64, raw: &[u8]) -> String {
    let mut out = format!("{topic}/{partition} committed {offset}");
    // A committed offset is never negative (`Offset::Offset` holds only offsets >= 0).
    let base = u64::try_from(offset).unwrap_or(0);
    let decoded = match std::str::from_utf8(raw) {
        Ok(text) => metadata::decode(text, base),
        Err(_) => Err(MetadataError::NotRill),
    };
    match decoded {
        Ok(offsets) => {
            let _ = writeln!(
                out,
                ", {} key ranges (hash id {}):",
                offsets.ranges.len(),
                offsets.hash_id
            );
            for (range, next) in &offsets.ranges {
                let _ = writeln!(out, "  {range} next {next}");
            }
        }
        Err(MetadataError::NotRill) if raw.is_empty() => {
            let _ = writeln!(out, ": no range metadata");
        }
        Err(MetadataError::NotRill) => {
            let _ = writeln!(out, ": no range metadata; raw metadata {}", show_raw(raw));
        }
        Err(e) => {
            let _ = writeln!(out, ": {e}; raw metadata {}", show_raw(raw));
        }
    }
    out
}

/// Raw metadata for display: quoted and escaped, cut after [`RAW_SHOWN_CHARS`] characters.
fn show_raw(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let shown: String = text.chars().take(RAW_SHOWN_CHARS).collect();
    let mut out = format!("{shown:?}");
    if shown.len() < text.len() {
        let _ = write!(out, "... ({} bytes)", raw.len());
    }
    if std::str::from_utf8(raw).is_err() {
        out.push_str(" (not UTF-8)");
    }
    out
}

/// The metadata bytes of element `index` of `tpl`.
///
/// Read from the C list directly: `TopicPartitionListElem::metadata` panics when the bytes are not
/// UTF-8, and other clients may commit any bytes.
fn raw_metadata(tpl: &TopicPartitionList, index: usize) -> &[u8] {
    if index >= tpl.count() {
        return &[];
    }
    // SAFETY: `tpl` owns a valid rd_kafka_topic_partition_list_t with `count()` elements; the
    // element's metadata buffer (when not null) holds `metadata_size` bytes and lives as long as
    // the list, which the returned slice borrows.
    unsafe {
        let elem = &*(*tpl.ptr()).elems.add(index);
        if elem.metadata.is_null() || elem.metadata_size == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(elem.metadata as *const u8, elem.metadata_size)
        }
    }
}
