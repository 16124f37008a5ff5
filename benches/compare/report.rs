//! The report: BENCHMARKS.md from benches/results/*.json (the chart is [`super::chart`]).

use super::*;

pub(crate) fn load_results(dir: &Path) -> Vec<ScenarioResult> {
    let mut v: Vec<ScenarioResult> = ["s1", "s2", "s3", "s4", "s4-2k", "s5", "s6"]
        .iter()
        .filter_map(|s| fs::read_to_string(dir.join(format!("{s}.json"))).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    v.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    v
}

pub(crate) fn find<'a>(r: &'a ScenarioResult, name: &str) -> Option<&'a Run> {
    r.systems
        .iter()
        .find(|s| s.system == name)
        .and_then(|s| s.median.as_ref())
}

pub(crate) fn fmt_num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x >= 100.0 {
        let s = format!("{x:.0}");
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

pub(crate) fn goal_lines(all: &[ScenarioResult]) -> Vec<String> {
    let get = |sc: &str| all.iter().find(|r| r.scenario == sc);
    let mut out = vec![];
    let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
    if let Some(r) = get("s1") {
        if let (Some(rill), Some(ks)) = (find(r, "rill P=64"), find(r, "Kafka Streams")) {
            let x = rill.records_per_s / ks.records_per_s;
            let pc = find(r, "Parallel Consumer");
            let pc_txt = match pc {
                Some(pc) => format!(
                    "; rill P=64 ÷ Parallel Consumer = {:.2}x ({})",
                    rill.records_per_s / pc.records_per_s,
                    verdict(rill.records_per_s > pc.records_per_s)
                ),
                None => "; Parallel Consumer: no result".into(),
            };
            out.push(format!(
                "- S1 (goal: at least 50x Kafka Streams and faster than Parallel Consumer): rill P=64 ÷ Kafka Streams = {x:.1}x ({}){pc_txt}.",
                verdict(x >= 50.0)
            ));
        }
        let sleeps = r
            .params
            .get("sum of sleeps")
            .and_then(|s| s.trim_end_matches(" s").parse::<f64>().ok());
        if let (Some(rill), Some(sleeps)) = (find(r, "rill async P=1, in flight 1000"), sleeps) {
            // The physical limit at concurrency 1000: every sleep overlapped 1000-fold.
            let limit = sleeps / 1000.0;
            let pc_cpu = r
                .systems
                .iter()
                .filter(|s| s.system.starts_with("Parallel Consumer"))
                .filter_map(|s| s.median.as_ref())
                .max_by(|a, b| a.records_per_s.total_cmp(&b.records_per_s));
            let cpu_txt = match pc_cpu {
                Some(pc) => format!(
                    "; its CPU per record ÷ the fastest Parallel Consumer's = {:.2}x ({})",
                    rill.cpu_s_per_m / pc.cpu_s_per_m,
                    verdict(rill.cpu_s_per_m <= pc.cpu_s_per_m / 10.0)
                ),
                None => "; Parallel Consumer: no result".into(),
            };
            out.push(format!(
                "- S1 async (issue 14 goal: within 2x the physical limit, sum of sleeps / 1000 = {limit:.3} s, at a tenth of Parallel Consumer's CPU per record): rill async P=1, in flight 1000 took {:.3} s = {:.2}x the limit ({}){cpu_txt}.",
                rill.wall_s,
                rill.wall_s / limit,
                verdict(rill.wall_s <= 2.0 * limit)
            ));
        }
    }
    if let Some(r) = get("s2") {
        if let (Some(rill), Some(ks)) = (find(r, "rill P=1"), find(r, "Kafka Streams")) {
            let x = rill.records_per_s / ks.records_per_s;
            let c = rill.cpu_s_per_m / ks.cpu_s_per_m;
            out.push(format!(
                "- S2 (goal: at least 3x Kafka Streams' records/s at a third of its CPU per record): {x:.2}x the records/s ({}), {c:.2}x its CPU per record ({}).",
                verdict(x >= 3.0),
                verdict(c <= 1.0 / 3.0)
            ));
        }
    }
    if let Some(r) = get("s3") {
        let rill = find(r, "rill P=1");
        let multi = find(r, "bare rdkafka loop, 4 threads");
        if let (Some(rill), Some(bare)) = (rill, multi) {
            let x = rill.records_per_s / bare.records_per_s;
            out.push(format!(
                "- S3 (goal: at least 80% of the multi-threaded bare consume-and-produce loop): {:.0}% ({}).",
                x * 100.0,
                verdict(x >= 0.8)
            ));
        } else if let (Some(rill), Some(bare)) = (rill, find(r, "bare rdkafka loop")) {
            out.push(format!(
                "- S3 (goal: at least 80% of the multi-threaded bare loop; this run has only the single-threaded one): {:.0}% of it.",
                rill.records_per_s / bare.records_per_s * 100.0,
            ));
        }
    }
    for (id, label) in [
        ("s4", "S4 at 20k records/s"),
        ("s4-2k", "S4 at 2k records/s"),
    ] {
        let Some(r) = get(id) else { continue };
        let rows = (
            find(r, "rill P=1"),
            find(r, "Kafka Streams"),
            find(r, "broker round trip"),
        );
        if let (Some(rill), Some(ks), Some(floor)) = rows {
            if let (Some(a), Some(b), Some(f)) = (rill.p99_ms, ks.p99_ms, floor.p99_ms) {
                // The floor is one hop; the bare loop shows what a second one costs a program
                // that does nothing but forward.
                let bare = find(r, "bare rdkafka loop")
                    .and_then(|bare| bare.p99_ms)
                    .map(|p| format!("; the bare rdkafka loop, which only forwards, {p:.1} ms ({:.2}x the floor)", p / f))
                    .unwrap_or_default();
                out.push(format!(
                    "- {label} (goal: p99 at most half Kafka Streams' and within 2x the floor): rill p99 {a:.1} ms vs Kafka Streams {b:.1} ms ({:.2}x) and the broker round trip {f:.1} ms ({:.2}x) ({}){bare}.",
                    a / b,
                    a / f,
                    verdict(a <= b / 2.0 && a <= 2.0 * f)
                ));
            }
        }
    }
    if let Some(r) = get("s2") {
        if let (Some(rill), Some(alos), Some(ks)) = (
            find(r, "rill P=1 EOS"),
            find(r, "rill P=1"),
            find(r, "Kafka Streams EOS"),
        ) {
            out.push(format!(
                "- S2 under exactly_once_v2 (no goal set; issue 15 asks for the figures): rill {} records/s at {:.2} CPU-s per million ({:.0}% of its at_least_once records/s), Kafka Streams EOS {} records/s at {:.2}: {:.2}x the records/s.",
                fmt_num(rill.records_per_s),
                rill.cpu_s_per_m,
                rill.records_per_s / alos.records_per_s * 100.0,
                fmt_num(ks.records_per_s),
                ks.cpu_s_per_m,
                rill.records_per_s / ks.records_per_s,
            ));
        }
    }
    if let Some(r) = get("s4") {
        if let (Some(rill), Some(ks)) = (find(r, "rill P=1 EOS"), find(r, "Kafka Streams EOS")) {
            if let (Some(a), Some(b)) = (rill.p99_ms, ks.p99_ms) {
                out.push(format!(
                    "- S4 under exactly_once_v2, read_committed (no goal set; issue 15 asks for the figures): rill p99 {a:.1} ms (p50 {:.1}), Kafka Streams EOS p99 {b:.1} ms (p50 {:.1}).",
                    rill.p50_ms.unwrap_or(f64::NAN),
                    ks.p50_ms.unwrap_or(f64::NAN),
                ));
            }
        }
    }
    for (id, label) in [
        ("s5", "S5 (no goal set; issue 11 asks for the figure)"),
        ("s6", "S6 (no goal set; issue 12 asks for the figure)"),
    ] {
        let Some(r) = get(id) else { continue };
        if let (Some(rill), Some(ks)) = (find(r, "rill P=1"), find(r, "Kafka Streams")) {
            out.push(format!(
                "- {label}: rill {} records/s at {:.2} CPU-s per million records, Kafka Streams {} records/s at {:.2}: {:.2}x the records/s, {:.2}x its CPU per record.",
                fmt_num(rill.records_per_s),
                rill.cpu_s_per_m,
                fmt_num(ks.records_per_s),
                ks.cpu_s_per_m,
                rill.records_per_s / ks.records_per_s,
                rill.cpu_s_per_m / ks.cpu_s_per_m
            ));
        }
    }
    out
}

pub(crate) fn write_markdown(all: &[ScenarioResult], path: &Path) {
    let mut md = String::new();
    md.push_str("# Benchmarks: rill side by side with Kafka Streams and Parallel Consumer\n\n");
    md.push_str(
        "Generated by `scripts/bench` (from `benches/results/*.json`; do not edit by hand).\n\n",
    );
    if let Some(first) = all.first() {
        let modes: Vec<String> = all
            .iter()
            .map(|r| format!("{} {} ({})", r.scenario, r.mode, r.date))
            .collect();
        md.push_str(&format!("- Machine: {}.\n", first.machine));
        md.push_str(&format!("- Runs: {}.\n", modes.join(", ")));
        if all.iter().any(|r| r.mode == "quick") {
            md.push_str("- **Quick mode** (`scripts/bench --quick`): smaller inputs, one run per system, no warm-up; figures are indicative only. `scripts/bench` without `--quick` runs the full sizes, a warm-up round and the median of 3.\n");
        }
    }
    md.push_str("- Every system runs as a child process with a fresh consumer group, against the same broker and the same input topic. Throughput is measured from the first record the child consumed to the moment the whole expected output is on the output topic (S1: the orchestrator counts output records as they arrive; S3: output high watermarks, polled every 20 ms; S2: every key's latest count read back equals the truth). CPU is the child's utime + stime over that interval (/proc/PID/stat), per million input records. Peak RSS is the child's VmHWM. Latency (S4) is the time the orchestrator receives an output record minus the produce time carried in the record.\n");
    md.push_str("- `rill ÷ system`: the reference rill configuration's records/s divided by the system's (S4: the system's p99 divided by rill's): above 1 means rill is ahead.\n\n");
    md.push_str("![records/s per system and scenario](benches/results/benchmarks.svg)\n\n");
    md.push_str("## Goals (issue 6)\n\n");
    for l in goal_lines(all) {
        md.push_str(&l);
        md.push('\n');
    }
    md.push('\n');
    md.push_str("## Results (medians)\n\n");
    md.push_str("| system | scenario | records/s | CPU-s per M records | p50 latency | p99 latency | peak RSS | rill ÷ system |\n");
    md.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for r in all {
        let refr = find(r, &r.reference);
        for s in &r.systems {
            let Some(m) = &s.median else {
                let why = if s.note.is_empty() {
                    s.runs
                        .iter()
                        .map(|r| r.note.clone())
                        .collect::<Vec<_>>()
                        .join("; ")
                } else {
                    s.note.clone()
                };
                md.push_str(&format!(
                    "| {} | {} | no result: {} | | | | | |\n",
                    s.system, r.scenario, why
                ));
                continue;
            };
            let ratio = match (refr, r.scenario.as_str()) {
                (Some(x), s) if s.starts_with("s4") => match (m.p99_ms, x.p99_ms) {
                    (Some(a), Some(b)) => format!("{:.2}", a / b),
                    _ => "".into(),
                },
                (Some(x), _) => format!("{:.2}", x.records_per_s / m.records_per_s),
                _ => "".into(),
            };
            let ms = |v: Option<f64>| v.map_or("".into(), |v| format!("{v:.1} ms"));
            md.push_str(&format!(
                "| {} | {} | {} | {:.2} | {} | {} | {:.0} MB | {} |\n",
                s.system,
                r.scenario,
                fmt_num(m.records_per_s),
                m.cpu_s_per_m,
                ms(m.p50_ms),
                ms(m.p99_ms),
                m.peak_rss_mb,
                ratio
            ));
        }
    }
    md.push('\n');
    for r in all {
        md.push_str(&format!("## {}\n\n", r.title));
        for (k, v) in &r.params {
            md.push_str(&format!("- {k}: {v}\n"));
        }
        md.push_str(&format!("- mode: {}, {}\n\n", r.mode, r.date));
        md.push_str("| system | configuration | runs: records/s (S4: p99 ms), with the 1-minute load average at the start of each run |\n|---|---|---|\n");
        for s in &r.systems {
            let runs: Vec<String> = s
                .runs
                .iter()
                .map(|x| {
                    if !x.ok {
                        format!("failed: {}", x.note)
                    } else if r.scenario.starts_with("s4") {
                        format!("{:.1} (load {:.1})", x.p99_ms.unwrap_or(0.0), x.load_avg)
                    } else {
                        format!("{} (load {:.1})", fmt_num(x.records_per_s), x.load_avg)
                    }
                })
                .collect();
            let runs = if s.note.is_empty() {
                runs.join(", ")
            } else {
                s.note.clone()
            };
            md.push_str(&format!("| {} | {} | {} |\n", s.system, s.config, runs));
        }
        md.push('\n');
    }
    md.push_str(NOTES);
    // Hand-written analysis of the committed run, kept beside the JSON it discusses.
    if let Ok(notes) = fs::read_to_string(Path::new(ROOT).join("benches/results/ANALYSIS.md")) {
        md.push('\n');
        md.push_str(&notes);
    }
    fs::write(path, md).expect("write BENCHMARKS.md");
}

pub(crate) const NOTES: &str = "## What is and is not comparable\n\n\
- The broker, the orchestrator (producing S4's input and reading outputs) and the system under test share the same 2 cores: absolute figures are low and every system pays the same tax. Other work on the machine (other engineers' builds and tests) was not under our control; the load average at the start of each run is listed with it.\n\
- Both write a changelog for S2's count store (their default): Kafka Streams one record per cache flush, rill one record per changed key per range commit.\n\
- Kafka Streams runs with `commit.interval.ms=100` (rill's default) instead of its 30 s default, which would hold cached count updates back for that long; record caching stays at its default (10 MB).\n\
- Java peers run with the JVM's defaults (heap up to 1/4 of RAM); their peak RSS mostly reflects that default, and their CPU includes JIT compilation during the run (JVM start-up is excluded: CPU is counted from the first record on).\n\
- The bare loop is the ceiling for rill: one consumer and one producer with rill's producer settings, no state, no framework.\n\
- S1 records carry their sleep in the value, so every system sleeps the same total time (the sum is given above). The blocking rows and Parallel Consumer sleep the thread; rill's async rows await a timer thread that wakes each call at its deadline: `tokio::time::sleep` rounds up to the next millisecond, which made S1's 25 s of sleeps last 35-41 s in all (measured inside the calls at P = 1; 28-33 s with the timer thread, both including the wait for a runtime thread), an artifact no real I/O call has.\n\
- S4's `broker round trip` row is the measurement's floor: the orchestrator produces straight to the topic it reads. The orchestrator's clients turn Nagle's algorithm off (as Kafka's Java clients do); librdkafka leaves it on by default, and so does rill, hence the extra `rill P=1, Nagle off` row.\n\
\n\
## Shared target directories\n\n\
Cargo names the artifacts of workspace members by a hash that leaves out the checkout's path, so two worktrees of this repository sharing one `CARGO_TARGET_DIR` overwrite each other's `rill-*` crates, and a build in one can silently link the other's (seen here: a compile error from another branch's `rill-state`). When several worktrees share the target directory, give this one its own artifacts with a harmless per-package profile override, e.g. `RILL_BENCH_CARGO_FLAGS=\"--config profile.release.package.rill-runtime.codegen-units=15 ...\"` (one `--config` per `rill`, `rill-topology`, `rill-state`, `rill-runtime`); RocksDB and librdkafka are unaffected and stay cached.\n";

pub(crate) fn report(results_dir: &Path) {
    let all = load_results(results_dir);
    if all.is_empty() {
        eprintln!("no results in {}", results_dir.display());
        return;
    }
    let md = Path::new(ROOT).join("BENCHMARKS.md");
    write_markdown(&all, &md);
    let svg = results_dir.join("benchmarks.svg");
    if let Err(e) = write_svg(&all, &svg) {
        eprintln!("could not draw {}: {e}", svg.display());
    }
    eprintln!("wrote {} and {}", md.display(), svg.display());
}
