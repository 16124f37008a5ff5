//! Tests of the configuration: sources, precedence, values, the key table of docs/operating.md.

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn environment_variables_map_to_keys() {
    let c = ConfigBuilder::new()
        .with_env_vars(env(&[
            ("RILL_APPLICATION_ID", "wc"),
            ("RILL_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            ("RILL_PARALLELISING_FACTOR", "8"),
            ("RILL_KAFKA_SECURITY_PROTOCOL", "plaintext"),
            ("RILL_TEST_BOOTSTRAP", "ignored"),
            ("RILL_BROKER_PORT", "9092"),
            ("RILL_BENCH_LINES", "1000"),
            ("PATH", "/bin"),
        ]))
        .build()
        .unwrap();
    assert_eq!(c.application_id, "wc");
    assert_eq!(c.bootstrap_servers.as_deref(), Some("127.0.0.1:9092"));
    assert_eq!(c.parallelising_factor, 8);
    assert_eq!(
        c.kafka.get("security.protocol").map(String::as_str),
        Some("plaintext")
    );
}

#[test]
fn bad_values_name_the_key() {
    let base = ConfigBuilder::new().set("application.id", "a");
    let err = base
        .clone()
        .set("parallelising.factor", 0)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("parallelising.factor"), "{err}");
    let err = base
        .clone()
        .set("commit.interval.ms", "soon")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("commit.interval.ms"), "{err}");
    let err = base
        .clone()
        .set("metrics.addr", "nowhere")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("metrics.addr"), "{err}");
    let err = base
        .clone()
        .set("paralellising.factor", 2)
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::UnknownKey("paralellising.factor".into()));
    let err = base
        .clone()
        .set("deserialization.error.handler", "dead_letter:")
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("deserialization.error.handler"),
        "{err}"
    );
    assert_eq!(
        ConfigBuilder::new().build().unwrap_err(),
        ConfigError::Missing("application.id")
    );
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
    f
}

#[test]
fn toml_file_sets_keys_with_dotted_keys_and_tables() {
    let f = file(
        "application.id = \"orders\"\nparallelising.factor = 16\nmetrics.addr = \"off\"\n\
         [kafka]\n\"security.protocol\" = \"plaintext\"\nsocket.timeout.ms = 5000\n",
    );
    let c = ConfigBuilder::new()
        .with_config_file(f.path())
        .build()
        .unwrap();
    assert_eq!(c.application_id, "orders");
    assert_eq!(c.parallelising_factor, 16);
    assert_eq!(c.metrics_addr, MetricsAddr::Off);
    assert_eq!(c.kafka["security.protocol"], "plaintext");
    assert_eq!(c.kafka["socket.timeout.ms"], "5000");
}

#[test]
fn toml_file_errors_name_the_file_or_the_key() {
    let broken = file("application.id = \n");
    let err = ConfigBuilder::new()
        .with_config_file(broken.path())
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::File { path, .. } if *path == broken.path().display().to_string()),
        "{err}"
    );
    let err = ConfigBuilder::new()
        .with_config_file("/nonexistent/rill.toml")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/rill.toml"), "{err}");
    let unknown = file("application.id = \"a\"\nparallelism = 4\n");
    assert_eq!(
        ConfigBuilder::new()
            .with_config_file(unknown.path())
            .build()
            .unwrap_err(),
        ConfigError::UnknownKey("parallelism".into())
    );
    let zero = file("application.id = \"a\"\nparallelising.factor = 0\n");
    let err = ConfigBuilder::new()
        .with_config_file(zero.path())
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::BadValue { key, .. } if key == "parallelising.factor"),
        "{err}"
    );
    let array = file("application.id = \"a\"\nbootstrap.servers = [\"x:1\"]\n");
    let err = ConfigBuilder::new()
        .with_config_file(array.path())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("bootstrap.servers"), "{err}");
}

#[test]
fn precedence_is_code_then_file_then_environment() {
    let f = file("parallelising.factor = 4\ncommit.interval.ms = 250\n");
    let c = ConfigBuilder::new()
        .set("application.id", "code")
        .set("parallelising.factor", 2)
        .set("commit.interval.ms", 50)
        .set("mailbox.capacity", 7)
        .with_config_file_and_env_from(Some(f.path()), env(&[("RILL_COMMIT_INTERVAL_MS", "500")]))
        .build()
        .unwrap();
    assert_eq!(
        c.application_id, "code",
        "code value kept when nothing overrides"
    );
    assert_eq!(c.mailbox_capacity, 7);
    assert_eq!(c.parallelising_factor, 4, "the file overrides code");
    assert_eq!(
        c.commit_interval,
        Duration::from_millis(500),
        "env overrides the file"
    );
}

#[test]
fn the_file_comes_from_the_argument_else_rill_config() {
    let a = file("application.id = \"from-arg\"\n");
    let b = file("application.id = \"from-env\"\n");
    let vars = env(&[("RILL_CONFIG", &b.path().display().to_string())]);
    let id = |arg: Option<&Path>| {
        ConfigBuilder::new()
            .with_config_file_and_env_from(arg, vars.clone())
            .build()
            .map(|c| c.application_id)
    };
    assert_eq!(id(Some(a.path())).unwrap(), "from-arg");
    assert_eq!(id(None).unwrap(), "from-env");
    assert!(matches!(
        id(Some(Path::new("/nonexistent/rill.toml"))),
        Err(ConfigError::File { .. })
    ));
}

#[test]
fn effective_config_lists_defaults_and_redacts_secrets() {
    let c = ConfigBuilder::new()
        .set("application.id", "a")
        .set("kafka.sasl.password", "hunter2")
        .set("kafka.ssl.key.location", "/k.pem")
        .set("kafka.sasl.jaas.config", "x")
        .set("kafka.client.secret", "s")
        .build()
        .unwrap();
    let r = c.redacted();
    assert_eq!(r["metrics.addr"], "127.0.0.1:9898");
    assert_eq!(r["shutdown.timeout.ms"], "30000");
    assert_eq!(r["parallelising.factor"], "1");
    for k in [
        "kafka.sasl.password",
        "kafka.ssl.key.location",
        "kafka.sasl.jaas.config",
        "kafka.client.secret",
    ] {
        assert_eq!(r[k], "[redacted]", "{k}");
    }
    assert!(!format!("{r:?}").contains("hunter2"));
}

#[test]
fn secrets_are_redacted() {
    let b = ConfigBuilder::new()
        .set("kafka.sasl.password", "hunter2")
        .set("application.id", "a");
    assert_eq!(b.redacted()["kafka.sasl.password"], "[redacted]");
    assert_eq!(b.redacted()["application.id"], "a");
}

#[test]
fn rocksdb_memory_says_the_minimum_it_requires() {
    let err = ConfigBuilder::new()
        .set("application.id", "a")
        .set("rocksdb.memory.bytes", 1000)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::BadValue {
            key: "rocksdb.memory.bytes".into(),
            value: "1000".into(),
            expected: "a whole number of at least 4194304 (4 MiB)".into(),
        }
    );
    let c = ConfigBuilder::new()
        .set("application.id", "a")
        .set("rocksdb.memory.bytes", 4 << 20)
        .build()
        .unwrap();
    assert_eq!(c.rocksdb_memory_bytes, 4 << 20);
}

#[test]
fn rocksdb_open_files_take_minus_one_or_a_bound_of_at_least_twenty() {
    let open_files = |v: &str| {
        ConfigBuilder::new()
            .set("application.id", "a")
            .set("rocksdb.max.open.files", v)
            .build()
    };
    assert_eq!(open_files("-1").unwrap().rocksdb_max_open_files, None);
    assert_eq!(open_files("500").unwrap().rocksdb_max_open_files, Some(500));
    let c = ConfigBuilder::new()
        .set("application.id", "a")
        .build()
        .unwrap();
    assert_eq!(c.rocksdb_max_open_files, None);
    assert_eq!(c.redacted()["rocksdb.max.open.files"], "-1");
    for bad in ["19", "0", "-2", "many"] {
        assert_eq!(
            open_files(bad).unwrap_err(),
            ConfigError::BadValue {
                key: "rocksdb.max.open.files".into(),
                value: bad.into(),
                expected: "-1 (no bound) or a whole number of at least 20".into(),
            }
        );
    }
}

#[test]
fn kafka_settings_that_break_the_idempotent_producer_are_refused() {
    let with = |k: &str, v: &str| {
        ConfigBuilder::new()
            .set("application.id", "a")
            .set(k, v)
            .build()
    };
    for (k, v) in [
        ("kafka.enable.idempotence", "false"),
        ("kafka.enable.idempotence", "0"),
        ("kafka.acks", "1"),
        ("kafka.acks", "0"),
        ("kafka.request.required.acks", "1"),
        ("kafka.max.in.flight.requests.per.connection", "6"),
        ("kafka.max.in.flight", "100"),
        ("kafka.enable.gapless.guarantee", "false"),
    ] {
        match with(k, v) {
            Err(ConfigError::Refused { key, value, why }) => {
                assert_eq!((key.as_str(), value.as_str()), (k, v));
                assert!(!why.is_empty());
                let text = with(k, v).unwrap_err().to_string();
                assert!(text.contains(k) && text.contains("refused"), "{text}");
            }
            other => panic!("{k}={v}: {other:?}"),
        }
    }
    for (k, v) in [
        ("kafka.enable.idempotence", "true"),
        ("kafka.acks", "all"),
        ("kafka.acks", "-1"),
        ("kafka.max.in.flight.requests.per.connection", "5"),
        ("kafka.enable.gapless.guarantee", "true"),
        ("kafka.linger.ms", "0"),
    ] {
        let c = with(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        assert_eq!(c.kafka[&k["kafka.".len()..]], v);
    }
}

/// docs/operating.md shows each default as the effective config does (machine-dependent ones
/// aside).
#[test]
fn shown_defaults_match_the_effective_defaults() {
    let c = ConfigBuilder::new()
        .set("application.id", "a")
        .build()
        .unwrap();
    let r = c.redacted();
    for k in KEYS {
        let effective = &r[k.name];
        match k.name {
            "application.id" => assert_eq!(k.default, "(required)"),
            "bootstrap.servers" => assert_eq!(effective, "(embedded cluster)"),
            "worker.threads" => assert_eq!(*effective, cores().to_string()),
            "async.threads" => assert_eq!(*effective, (cores() / 2).max(1).to_string()),
            "parallelising.factor.max" => assert_eq!(effective, "4", "4 x the default factor 1"),
            "state.dir" => assert!(effective.ends_with("/rill/a"), "{effective}"),
            _ => assert_eq!(k.default.trim_matches('`'), effective, "{}", k.name),
        }
    }
    let mut logged: Vec<&str> = r.keys().map(String::as_str).collect();
    logged.sort_unstable();
    let mut keys: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    keys.sort_unstable();
    assert_eq!(logged, keys, "the effective config logs every key");
}

#[test]
fn every_key_is_settable_from_the_environment() {
    for k in KEYS {
        let var = format!("RILL_{}", k.name.to_ascii_uppercase().replace('.', "_"));
        let b = ConfigBuilder::new().with_env_vars(env(&[(&var, "x")]));
        assert_eq!(b.values.get(k.name).map(String::as_str), Some("x"), "{var}");
    }
}

#[test]
fn the_key_table_lists_every_key_with_its_default() {
    let table = key_table();
    for k in KEYS {
        assert!(
            table.contains(&format!("| `{}` | {} |", k.name, k.default)),
            "{}",
            k.name
        );
    }
    assert!(table.contains("| `kafka.*` |"));
}

#[test]
fn the_auto_factor_bound_defaults_to_four_times_the_factor_and_is_never_below_it() {
    let base = || ConfigBuilder::new().set("application.id", "a");
    let c = base().set("parallelising.factor", 3).build().unwrap();
    assert_eq!(c.parallelising_factor_max, 12);
    assert!(!c.parallelising_auto, "off by default");
    let c = base()
        .set("parallelising.auto", true)
        .set("parallelising.factor.max", 3)
        .set("parallelising.auto.queue.time.ms", 250)
        .build()
        .unwrap();
    assert!(c.parallelising_auto);
    assert_eq!(c.parallelising_factor_max, 3);
    assert_eq!(c.parallelising_auto_queue_time, Duration::from_millis(250));
    let err = base()
        .set("parallelising.factor", 8)
        .set("parallelising.factor.max", 4)
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::BadValue { key, .. } if key == "parallelising.factor.max"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("at least `parallelising.factor` (8)"),
        "{err}"
    );
}

#[test]
fn exactly_once_v2_is_accepted_with_brokers_and_refused_where_it_cannot_hold() {
    let eos = |extra: &[(&str, &str)]| {
        let mut b = ConfigBuilder::new()
            .set("application.id", "wc")
            .set("processing.guarantee", "exactly_once_v2");
        for (k, v) in extra {
            b = b.set(k, v);
        }
        b.build()
    };
    let ok = eos(&[("bootstrap.servers", "127.0.0.1:9092")]).unwrap();
    assert_eq!(ok.processing_guarantee, ProcessingGuarantee::ExactlyOnceV2);
    assert_eq!(
        ok.redacted()
            .get("processing.guarantee")
            .map(String::as_str),
        Some("exactly_once_v2")
    );
    let refused = |extra: &[(&str, &str)], key: &str| {
        let e = eos(extra).unwrap_err().to_string();
        assert!(e.contains(key), "{extra:?}: {e}");
    };
    // The embedded cluster has no transactions.
    refused(&[], "processing.guarantee");
    let b = ("bootstrap.servers", "127.0.0.1:9092");
    refused(&[b, ("parallelising.auto", "true")], "processing.guarantee");
    refused(
        &[b, ("parallelising.factor", "129")],
        "parallelising.factor",
    );
    refused(
        &[b, ("kafka.transactional.id", "mine")],
        "kafka.transactional.id",
    );
    refused(
        &[b, ("kafka.isolation.level", "read_uncommitted")],
        "kafka.isolation.level",
    );
    let e = ConfigBuilder::new()
        .set("application.id", "wc")
        .set("processing.guarantee", "exactly_once")
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("at_least_once or exactly_once_v2"), "{e}");
}

#[test]
fn application_server_takes_host_and_port_and_names_the_key_otherwise() {
    let base = ConfigBuilder::new().set("application.id", "a");
    for good in [
        "localhost:9898",
        "10.0.0.5:1",
        "node-1.example.com:65535",
        "[::1]:9898",
    ] {
        let c = base
            .clone()
            .set("application.server", good)
            .build()
            .unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(c.application_server.as_deref(), Some(good));
    }
    for bad in [
        "localhost",
        ":9898",
        "host:0",
        "host:99999",
        "a b:1",
        "[zz]:1",
        "h:p",
    ] {
        let err = base
            .clone()
            .set("application.server", bad)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadValue { key, .. } if key == "application.server"),
            "{bad}: {err:?}"
        );
    }
    assert_eq!(base.build().expect("config").application_server, None);
}

#[test]
fn replication_factor_takes_minus_one_or_at_least_one() {
    let base = ConfigBuilder::new().set("application.id", "a");
    assert_eq!(base.build().expect("config").replication_factor, -1);
    for good in [-1, 1, 3] {
        let c = base.clone().set("replication.factor", good).build();
        assert_eq!(c.expect("config").replication_factor, good);
    }
    for bad in ["0", "-2", "three"] {
        let err = base
            .clone()
            .set("replication.factor", bad)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadValue { key, .. } if key == "replication.factor"),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn worker_threads_nice_takes_0_to_19_and_names_the_key_otherwise() {
    let base = ConfigBuilder::new().set("application.id", "a");
    assert_eq!(base.build().expect("config").worker_threads_nice, 0);
    for good in [0, 5, 19] {
        let c = base.clone().set("worker.threads.nice", good).build();
        assert_eq!(c.expect("config").worker_threads_nice, good);
    }
    for bad in ["20", "-1", "low"] {
        let err = base
            .clone()
            .set("worker.threads.nice", bad)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadValue { key, .. } if key == "worker.threads.nice"),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn the_group_protocol_takes_kafka_streams_values_and_refuses_what_cannot_run() {
    let build = |pairs: &[(&str, &str)]| {
        let mut b = ConfigBuilder::new().set("application.id", "a");
        for (k, v) in pairs {
            b = b.set(k, v);
        }
        b.build()
    };
    let protocol = |pairs: &[(&str, &str)]| build(pairs).map(|c| c.group_protocol);
    assert_eq!(protocol(&[]).unwrap(), GroupProtocol::Classic);
    assert_eq!(
        protocol(&[("group.protocol", "consumer")]).unwrap(),
        GroupProtocol::Consumer
    );
    // The older way to ask for KIP-848 still works.
    assert_eq!(
        protocol(&[("kafka.group.protocol", "consumer")]).unwrap(),
        GroupProtocol::Consumer
    );
    let brokers = ("bootstrap.servers", "127.0.0.1:9092");
    assert_eq!(
        protocol(&[brokers, ("group.protocol", "streams")]).unwrap(),
        GroupProtocol::Streams
    );
    let refused = |pairs: &[(&str, &str)], key: &str| match build(pairs) {
        Err(ConfigError::Refused { key: k, .. }) => assert_eq!(k, key, "{pairs:?}"),
        other => panic!("{pairs:?}: {other:?}"),
    };
    refused(&[("group.protocol", "streams")], "group.protocol");
    refused(
        &[
            ("group.protocol", "consumer"),
            ("kafka.group.protocol", "classic"),
        ],
        "kafka.group.protocol",
    );
    refused(
        &[brokers, ("kafka.group.protocol", "streams")],
        "kafka.group.protocol",
    );
    match build(&[("group.protocol", "eager")]) {
        Err(e) => assert!(
            e.to_string().contains("classic, consumer or streams"),
            "{e}"
        ),
        Ok(_) => panic!("eager accepted"),
    }
}

/// On `group.protocol=streams` rill's own coordinator client must honour the security
/// settings: what it cannot is refused before anything connects, naming the key; what it can,
/// and anything under the other protocols (librdkafka alone), passes.
#[test]
fn streams_refuses_security_settings_its_coordinator_client_cannot_honour() {
    let build = |protocol: &str, pairs: &[(&str, &str)]| {
        let mut b = ConfigBuilder::new()
            .set("application.id", "a")
            .set("bootstrap.servers", "127.0.0.1:9092")
            .set("group.protocol", protocol);
        for (k, v) in pairs {
            b = b.set(k, v);
        }
        b.build()
    };
    let sasl = [
        ("kafka.security.protocol", "SASL_PLAINTEXT"),
        ("kafka.sasl.username", "u"),
        ("kafka.sasl.password", "p"),
    ];
    let with = |extra: (&'static str, &'static str)| {
        let mut pairs = sasl.to_vec();
        pairs.push(extra);
        pairs
    };
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "scram-sha-512"] {
        build("streams", &with(("kafka.sasl.mechanism", mechanism)))
            .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
    }
    match build("streams", &with(("kafka.sasl.mechanism", "GSSAPI"))) {
        Err(ConfigError::BadValue { key, .. }) => assert_eq!(key, "kafka.sasl.mechanism"),
        other => panic!("GSSAPI on streams: {other:?}"),
    }
    // Under the other protocols librdkafka alone connects: this check does not apply.
    build("classic", &with(("kafka.sasl.mechanism", "OAUTHBEARER"))).expect("classic");
    match build(
        "streams",
        &[
            ("kafka.security.protocol", "SSL"),
            ("kafka.ssl.certificate.location", "/c.pem"),
        ],
    ) {
        Err(e) => assert!(
            e.to_string().contains("kafka.ssl.certificate.location"),
            "{e}"
        ),
        Ok(_) => panic!("a client certificate accepted on streams"),
    }
}
