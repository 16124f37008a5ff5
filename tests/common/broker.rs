//! A broker of a test's own, started through `scripts/kafka` on ports of its own, for the fault
//! tests that restart a broker or need a secure one: they cannot disturb the broker the other
//! tests share.
//!
//! Its port is derived from the shared broker's ([`super::bootstrap`], so it panics rather than
//! skips when the suite runs without a broker): shared port + 2 x `slot`, controller port one
//! above. Each test binary that starts one uses its own slot.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use super::{bootstrap, Cluster};

/// How a broker of a test's own is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// PLAINTEXT listener, like the shared broker.
    Plaintext,
    /// `scripts/kafka start --secure`: SASL_SSL with SCRAM-SHA-512.
    SaslSsl,
}

/// A broker started by `scripts/kafka` for one test binary; stopped (data deleted) on drop.
pub struct OwnBroker {
    port: u16,
    /// The cluster as a client reaches it (with the security settings for a secure broker).
    pub cluster: Cluster,
}

/// The port of the broker the other tests share ([`bootstrap`]).
fn shared_port() -> u16 {
    let shared = bootstrap();
    shared
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("RILL_TEST_BOOTSTRAP={shared}: expected host:port"))
}

/// `scripts/kafka` of this checkout.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka")
}

impl OwnBroker {
    /// Starts the broker of slot `slot` (1, 2, ...): port = shared broker port + 2 x slot.
    pub fn start(slot: u16, security: Security) -> Self {
        Self::start_with(slot, security, None)
    }

    /// [`OwnBroker::start`], advertising `advertise` (a proxy's port) to clients when `Some`:
    /// the cluster's bootstrap address is then the proxy's too.
    pub fn start_with(slot: u16, security: Security, advertise: Option<u16>) -> Self {
        let shared_port = shared_port();
        let port = shared_port + 2 * slot;
        let mut broker = OwnBroker {
            port,
            cluster: Cluster {
                bootstrap: format!("127.0.0.1:{}", advertise.unwrap_or(port)),
                kafka: BTreeMap::new(),
            },
        };
        // A broker left by an aborted earlier run of this test on this port goes first.
        broker.run(&["stop"]);
        let mut args = vec!["start".to_string()];
        if security == Security::SaslSsl {
            args.push("--secure".into());
        }
        if let Some(p) = advertise {
            args.extend(["--advertise-port".into(), p.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = broker.run(&args);
        assert!(
            out.status.success(),
            "scripts/kafka {} on port {port} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        let config = broker.run(&["client-config"]);
        assert!(config.status.success(), "scripts/kafka client-config");
        broker.cluster.kafka = String::from_utf8_lossy(&config.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        broker
    }

    /// The broker's own listener port (a proxy in front forwards to it).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `scripts/kafka ARGS` against this broker's ports.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(script())
            .args(args)
            .env("RILL_BROKER_PORT", self.port.to_string())
            .env("RILL_BROKER_CONTROLLER_PORT", (self.port + 1).to_string())
            .output()
            .expect("run scripts/kafka")
    }

    /// `scripts/kafka restart [--kill] --down-seconds N`: down for `down_seconds`, data kept;
    /// returns once it answers again.
    pub fn restart(&self, kill: bool, down_seconds: u32) {
        let down = down_seconds.to_string();
        let mut args = vec!["restart", "--down-seconds", &down];
        if kill {
            args.push("--kill");
        }
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "scripts/kafka {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.run(&["stop"]);
    }
}

/// The three-node cluster of `scripts/kafka start --brokers 3` on ports of a test binary's own
/// (`RILL_CLUSTER_PORT` = the shared broker's port + 20000, so 29092-29094 and 29192-29194 beside
/// a shared 9092): for faults only replication has (leader and coordinator moves, an ISR below
/// `min.insync.replicas`). Stopped, data deleted, on drop.
pub struct ThreeNodes {
    port: u16,
    /// The cluster as a client reaches it (all three nodes as bootstrap servers).
    pub cluster: Cluster,
}

impl ThreeNodes {
    /// Starts the cluster (a cluster left by an aborted earlier run on these ports goes first).
    pub fn start() -> Self {
        let shared_port = shared_port();
        let port = shared_port + 20000;
        let nodes = ThreeNodes {
            port,
            cluster: Cluster {
                bootstrap: (0..3)
                    .map(|i| format!("127.0.0.1:{}", port + i))
                    .collect::<Vec<_>>()
                    .join(","),
                kafka: BTreeMap::new(),
            },
        };
        nodes.run(&["stop", "--brokers", "3"]);
        nodes.expect(&["start", "--brokers", "3"]);
        nodes
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(script())
            .args(args)
            .env("RILL_CLUSTER_PORT", self.port.to_string())
            .output()
            .expect("run scripts/kafka")
    }

    /// Runs `scripts/kafka ARGS`; panics with its stderr unless it succeeds; its stdout.
    fn expect(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "scripts/kafka {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn node(&self, args: &[&str]) -> u32 {
        let out = self.expect(args);
        out.parse()
            .unwrap_or_else(|_| panic!("scripts/kafka {}: not a node id: {out}", args.join(" ")))
    }

    /// The node leading `partition` of `topic`.
    pub fn leader(&self, topic: &str, partition: u32) -> u32 {
        self.node(&["leader", "--brokers", "3", topic, &partition.to_string()])
    }

    /// The node coordinating `id`: `kind` is `group`, `streams` or `transaction`.
    pub fn coordinator(&self, kind: &str, id: &str) -> u32 {
        self.node(&["coordinator", "--brokers", "3", kind, id])
    }

    /// SIGKILLs node `n` (its data kept).
    pub fn kill_node(&self, n: u32) {
        self.expect(&["stop-node", &n.to_string(), "--kill"]);
    }

    /// Starts node `n` again on its data; returns once it answers.
    pub fn start_node(&self, n: u32) {
        self.expect(&["start-node", &n.to_string()]);
    }
}

impl Drop for ThreeNodes {
    fn drop(&mut self) {
        let _ = self.run(&["stop", "--brokers", "3"]);
    }
}
