//! `rill`: the operator command-line tool.
//!
//! `rill offsets --bootstrap B --group G [--topic T]` prints, per topic partition, the offset
//! committed by consumer group `G` and the per-key-range next offsets carried in rill's commit
//! metadata (see `rill_runtime::kafka::metadata`). `rill reset` resets an application,
//! `rill describe --url URL` prints a running instance's topology (text, DOT or Mermaid) and
//! `rill state inspect DIR` reads a state directory without changing it. Exit codes: 0 success,
//! 1 a broker, HTTP or state-directory error, 2 usage error.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use rill_runtime::kafka::metadata::{self, MetadataError};

#[path = "rill/inspect.rs"]
mod inspect;

/// What `rill offsets --help` says after the options.
const OFFSETS_AFTER_HELP: &str = "\
For every partition with a committed offset it prints `TOPIC/PARTITION committed OFFSET`, then
either one line per key range, `START-END next OFFSET` (16-hex-digit bounds of the closed
interval of the key-hash space, and the next offset to process in that range), or why there is
no range metadata (with the raw metadata when there is any). The group is not joined: the tool
reads offsets and changes nothing.

Exit status: 0 on success, 1 on a broker error, 2 on a usage error.";

/// Kafka's own internal topics, never consumed by a rill application.
const INTERNAL_TOPICS: &[&str] = &[
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
];

/// Longest raw metadata shown, in characters; longer metadata is cut and its length given.
const RAW_SHOWN_CHARS: usize = 200;

/// rill: operator tool for rill stream-processing applications.
#[derive(Parser)]
#[command(
    name = "rill",
    version,
    after_help = "Exit status: 0 on success, 1 on a broker, HTTP or state-directory error, 2 on a \
                  usage error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a consumer group's committed offsets and the per-key-range next offsets decoded
    /// from rill's commit metadata
    #[command(after_help = OFFSETS_AFTER_HELP)]
    Offsets(OffsetsArgs),
    /// Reset an application to process its input again (Kafka Streams' application reset
    /// tool): input offsets to the earliest (or a time), internal topics deleted, the local
    /// state dir removed; a dry run unless --execute
    Reset(ResetArgs),
    /// Print the topology of a running instance (GET /topology on its metrics.addr) as Kafka
    /// Streams' text, a Graphviz DOT digraph or a Mermaid flowchart
    #[command(after_help = DESCRIBE_AFTER_HELP)]
    Describe(DescribeArgs),
    /// Operator commands on a local state directory (state.dir)
    #[command(subcommand)]
    State(StateCommand),
}

#[derive(Subcommand)]
enum StateCommand {
    /// Print a state directory's column families (store, partition, key range), their progress
    /// records, entries and sizes, read-only; with --bootstrap, against the group's committed
    /// offsets
    #[command(after_help = INSPECT_AFTER_HELP)]
    Inspect(InspectArgs),
}

/// What `rill describe --help` says after the options.
const DESCRIBE_AFTER_HELP: &str = "\
The topology lives in the application's binary: the tool asks a running instance for it, at
URL/topology?format=FORMAT (the instance's metrics.addr). Render a DOT graph with
`rill describe --url http://127.0.0.1:9464 --format dot | dot -Tsvg > topology.svg`.

Exit status: 0 on success, 1 when the instance does not answer with the topology, 2 on a usage
error.";

/// What `rill state inspect --help` says after the options.
const INSPECT_AFTER_HELP: &str = "\
The directory is opened read-only and nothing in it changes. A directory in use by a running
instance is refused (stop the instance, or copy the directory and inspect the copy). Entries
are RocksDB's estimate unless --count-entries is given.

With --bootstrap, each range's next offset per input topic is compared with the offset the group
(the application.id; by default the one in the directory's APPLICATION file) committed for
that range: `at` (equal), `behind` (the local state has applied less than was committed, e.g.
the partition was processed elsewhere since) or `ahead` (it has applied more, e.g. after a crash
between the local commit and the offset commit).

Exit status: 0 on success, 1 on a state-directory or broker error, 2 on a usage error.";

#[derive(Args)]
struct DescribeArgs {
    /// The instance's HTTP endpoint (metrics.addr), e.g. http://127.0.0.1:9464
    #[arg(long, value_name = "URL", value_parser = http_url)]
    url: String,
    /// text (Kafka Streams' format), dot (Graphviz) or mermaid
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = describe_format)]
    format: rill_topology::DescribeFormat,
    /// Timeout of the request, in milliseconds
    #[arg(long = "timeout-ms", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
}

#[derive(Args)]
struct InspectArgs {
    /// The state directory (state.dir)
    #[arg(value_name = "DIR")]
    dir: std::path::PathBuf,
    /// Kafka bootstrap servers: compare the ranges with the group's committed offsets
    #[arg(long, value_name = "SERVERS", value_parser = non_empty)]
    bootstrap: Option<String>,
    /// The application.id (consumer group) to compare with (default: the directory's
    /// APPLICATION file)
    #[arg(long = "application-id", value_name = "ID", value_parser = non_empty,
          requires = "bootstrap")]
    application_id: Option<String>,
    /// Count every column family's entries exactly (reads all the state) instead of estimating
    #[arg(long = "count-entries")]
    count_entries: bool,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Timeout of each broker request, in milliseconds
    #[arg(long = "timeout-ms", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
}

#[derive(Args)]
struct ResetArgs {
    /// Kafka bootstrap servers, e.g. 127.0.0.1:9092 (bootstrap.servers)
    #[arg(long, value_name = "SERVERS", value_parser = non_empty)]
    bootstrap: String,
    /// The application.id (its consumer group and its internal topics' prefix)
    #[arg(long = "application-id", value_name = "ID", value_parser = non_empty)]
    application_id: String,
    /// Input topics, comma-separated (default: every non-internal topic the group committed)
    #[arg(long = "input-topics", value_name = "TOPICS", value_delimiter = ',')]
    input_topics: Option<Vec<String>>,
    /// Offsets go to the first record at or after this time (ms since the epoch) instead of
    /// the earliest
    #[arg(
        long = "to-timestamp-ms",
        value_name = "MS",
        conflicts_with = "by_duration_ms"
    )]
    to_timestamp_ms: Option<i64>,
    /// Offsets go to the first record at or after this long ago (ms)
    #[arg(long = "by-duration-ms", value_name = "MS")]
    by_duration_ms: Option<u64>,
    /// This machine's state dir of the application (state.dir), removed
    #[arg(long = "state-dir", value_name = "DIR")]
    state_dir: Option<std::path::PathBuf>,
    /// Apply the plan (without it, only print it)
    #[arg(long)]
    execute: bool,
    /// Timeout of each broker request, in milliseconds
    #[arg(long = "timeout-ms", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
}

#[derive(Args)]
struct OffsetsArgs {
    /// Kafka bootstrap servers, e.g. 127.0.0.1:9092 (bootstrap.servers)
    #[arg(long, value_name = "SERVERS", value_parser = non_empty)]
    bootstrap: String,
    /// Consumer group: the application.id of a rill application
    #[arg(long, value_name = "GROUP", value_parser = non_empty)]
    group: String,
    /// Only this topic (default: every topic except Kafka's internal ones)
    #[arg(long, value_name = "TOPIC", value_parser = non_empty)]
    topic: Option<String>,
    /// Timeout of each broker request, in milliseconds
    #[arg(long = "timeout-ms", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
}

/// A failure talking to Kafka (exit 1); usage errors are clap's (exit 2).
struct Failure(String);

fn describe_format(s: &str) -> Result<rill_topology::DescribeFormat, String> {
    s.parse()
        .map_err(|e: rill_topology::describe::UnknownFormat| e.to_string())
}

fn http_url(s: &str) -> Result<String, String> {
    if !s.starts_with("http://") {
        return Err("needs an http:// URL, e.g. http://127.0.0.1:9464".into());
    }
    Ok(s.trim_end_matches('/').to_string())
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("needs a non-empty value".into())
    } else {
        Ok(s.to_string())
    }
}

fn main() -> ExitCode {
    // Usage errors print the usage and exit 2; --help and --version exit 0.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Offsets(args) => offsets(args),
        Command::Reset(args) => reset(args),
        Command::Describe(args) => describe_topology(args),
        Command::State(StateCommand::Inspect(args)) => inspect::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message)) => {
            eprintln!("rill: {message}");
            ExitCode::from(1)
        }
    }
}

/// `rill describe`: GET URL/topology?format=FORMAT, printed as it comes.
fn describe_topology(args: &DescribeArgs) -> Result<(), Failure> {
    let url = if args.url.ends_with("/topology") {
        format!("{}?format={}", args.url, args.format)
    } else {
        format!("{}/topology?format={}", args.url, args.format)
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(args.timeout_ms)))
        .build()
        .into();
    let failed = |e: ureq::Error| Failure(format!("cannot get {url}: {e}"));
    let mut response = agent.get(&url).call().map_err(failed)?;
    let status = response.status();
    let body = response.body_mut().read_to_string().map_err(failed)?;
    if !status.is_success() {
        return Err(Failure(format!(
            "{url} answered {status}: {}",
            body.trim_end()
        )));
    }
    print!("{body}");
    Ok(())
}

/// `rill reset`: prints the plan, and applies it with `--execute`.
fn reset(args: &ResetArgs) -> Result<(), Failure> {
    use rill_runtime::reset::{apply, plan, ResetOptions, ResetTo};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let to = match (args.to_timestamp_ms, args.by_duration_ms) {
        (Some(ms), _) => ResetTo::Timestamp(ms),
        (None, Some(ago)) => ResetTo::Timestamp(now - ago as i64),
        (None, None) => ResetTo::Earliest,
    };
    let options = ResetOptions {
        bootstrap: args.bootstrap.clone(),
        application_id: args.application_id.clone(),
        input_topics: args.input_topics.clone(),
        to,
        state_dir: args.state_dir.clone(),
        kafka: Default::default(),
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let plan = plan(&options).map_err(|e| Failure(e.to_string()))?;
    print!("{plan}");
    if !args.execute {
        println!("dry run: nothing changed; run again with --execute to apply");
        return Ok(());
    }
    apply(&options, &plan).map_err(|e| Failure(e.to_string()))?;
    println!("reset done: start the application to process its input again");
    Ok(())
}

/// A client that reads group `group`'s committed offsets without joining the group.
fn group_reader(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap_or_else(|e| {
            // The settings come from the arguments: a usage error (exit 2).
            Cli::command()
                .error(
                    ErrorKind::InvalidValue,
                    format!("cannot create a Kafka client from these options: {e}"),
                )
                .exit()
        })
}

/// `rill offsets`: reads the group's committed offsets without joining the group.
fn offsets(args: &OffsetsArgs) -> Result<(), Failure> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let consumer = group_reader(&args.bootstrap, &args.group);
    let cluster = consumer.fetch_metadata(None, timeout).map_err(|e| {
        Failure(format!(
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
            return Err(Failure(format!(
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
    let committed = consumer.committed_offsets(tpl, timeout).map_err(|e| {
        Failure(format!(
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
        return Err(Failure(format!(
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
