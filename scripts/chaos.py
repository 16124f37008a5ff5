#!/usr/bin/env python3
"""The chaos run of issue 48; run it through scripts/chaos (which prepares the binaries and the
Python venv). See scripts/chaos for what it does and does not do."""

import argparse
import datetime
import http.client
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
KAFKA = os.path.join(HERE, "kafka")
CLUSTER_PORT = int(os.environ.get("RILL_CLUSTER_PORT", "19092"))
BOOTSTRAP = ",".join(f"127.0.0.1:{CLUSTER_PORT + i}" for i in range(3))
PARTITIONS = 6
INSTANCES = 3
FACTOR = 4
LIVE_FACTORS = [2, 3, 4, 6, 8]
# Closing records cover every key range of every factor up to this (live changes and restarts
# never go above it).
MAX_FACTOR = 16
SESSION_TIMEOUT_MS = 10000
# Windows workload, as tests/kafka_windows.rs.
WINDOW_MS = 1000
GRACE_MS = 300
USERS = 60
MARGIN_MS = 50

# Join workload: orders joined with a versioned customers table (examples/enrich_orders.rs).
CUSTOMERS = 30
# A tier change is produced this long before its timestamp comes, so the orders it applies to
# are produced long after it (broker faults delay a send by seconds, not half a minute).
LEAD_MS = 30_000
HISTORY_MS = 3_600_000

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"]

T0 = time.time()
LOCK = threading.Lock()
EVENTS = []      # (unix time, kind, detail): faults, recoveries, notes
FAULT_LOG = None


def utc(t=None):
    return datetime.datetime.fromtimestamp(t if t is not None else time.time(),
                                           datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def log(kind, detail, t=None):
    """Logs an event (a fault, a recovery, a note) with its UTC time (`t`: when it happened, if
    earlier than now) to stdout and the fault log."""
    t = time.time() if t is None else t
    with LOCK:
        EVENTS.append((t, kind, detail))
        line = f"{utc(t)} +{t - T0:7.1f}s {kind:<18} {detail}"
        print(line, flush=True)
        if FAULT_LOG:
            FAULT_LOG.write(line + "\n")
            FAULT_LOG.flush()


def kafka_cmd(*args, timeout=120):
    """Runs scripts/kafka; returns (rc, stdout, stderr)."""
    try:
        p = subprocess.run([KAFKA, *args], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout.strip(), p.stderr.strip()
    except subprocess.TimeoutExpired:
        return 124, "", f"timeout after {timeout}s"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def be_long(v):
    return int.from_bytes(v, "big", signed=True) if v is not None and len(v) == 8 else None


# ---- Network path of an instance ----------------------------------------------------------------

class NetPath:
    """An instance's own TCP path to the brokers: one listener per broker, forwarding both ways,
    which `partition()` blackholes (bytes stop flowing, connections stay open, as a cut cable or a
    dropped route: clients see timeouts, not resets) until `heal()`. The shim (chaos_faults.c)
    redirects the instance's connect() to a broker port to its listener here."""

    CHUNK = 65536

    def __init__(self, name, upstreams):
        self.name = name
        self.open_ = threading.Event()   # set: traffic flows; clear: partitioned
        self.open_.set()
        self.ports = {}                  # broker port -> listener port
        self.conns = []
        for upstream in upstreams:
            ls = socket.socket()
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("127.0.0.1", 0))
            ls.listen(128)
            self.ports[upstream] = ls.getsockname()[1]
            threading.Thread(target=self.accept, args=(ls, upstream), daemon=True).start()

    def redirect(self):
        return ",".join(f"{b}={p}" for b, p in self.ports.items())

    def accept(self, ls, upstream):
        while True:
            c, _ = ls.accept()
            try:
                u = socket.create_connection(("127.0.0.1", upstream), timeout=10)
                u.settimeout(None)
            except OSError:
                c.close()   # the broker is down: the client sees a refused connection, as without us
                continue
            for s_ in (c, u):
                s_.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with LOCK:
                self.conns.append((c, u))
            threading.Thread(target=self.pump, args=(c, u), daemon=True).start()
            threading.Thread(target=self.pump, args=(u, c), daemon=True).start()

    def pump(self, src, dst):
        try:
            while True:
                self.open_.wait()
                data = src.recv(self.CHUNK)
                if not data:
                    break
                self.open_.wait()   # read during a partition: held until it heals
                dst.sendall(data)
        except OSError:
            pass
        for s_ in (src, dst):
            try:
                s_.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s_.close()
        with LOCK:
            self.conns = [(a, b) for a, b in self.conns if a is not src and b is not src]

    def partition(self):
        self.open_.clear()

    def heal(self):
        self.open_.set()


def build_shim(work):
    """Compiles scripts/chaos_faults.c into the work dir; returns its path, or None (logged)."""
    out = os.path.join(work, "chaos_faults.so")
    r = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", out, os.path.join(HERE, "chaos_faults.c"),
                        "-ldl", "-lpthread"], capture_output=True, text=True)
    if r.returncode != 0:
        log("note", f"the fault shim did not build (no network partition, slow disk or clock jump): {r.stderr[-500:]}")
        return None
    return out


# ---- Instances -----------------------------------------------------------------------------------

class Instance:
    """One process of an application: its env, tmpfs state dir, log, HTTP port."""

    def __init__(self, app, idx, args, work, shim):
        self.app, self.idx, self.args = app, idx, args
        self.name = f"{app.short}-{idx}"
        self.port = free_port()
        self.state_dir = os.path.join(work, f"{self.name}-state")
        self.log_path = os.path.join(work, f"{self.name}.log")
        os.makedirs(self.state_dir, exist_ok=True)
        # A tmpfs of its own, so that the disk-full fault fills this instance's disk only.
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", self.state_dir],
                           capture_output=True, text=True)
        self.tmpfs = r.returncode == 0
        if not self.tmpfs:
            log("note", f"{self.name}: no tmpfs for the state dir ({r.stderr.strip()}); disk-full faults skip it")
        # The instances' config comes only from the RILL_* variables below (rill rejects unknown
        # RILL_* keys, e.g. RILL_CHAOS_BIN_DIR).
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RILL_")}
        self.env.update({
            "RILL_BOOTSTRAP_SERVERS": BOOTSTRAP,
            "RILL_APPLICATION_ID": app.app_id,
            "RILL_STATE_DIR": self.state_dir,
            "RILL_PROCESSING_GUARANTEE": args.guarantee,
            "RILL_PARALLELISING_FACTOR": str(FACTOR),
            "RILL_METRICS_ADDR": f"127.0.0.1:{self.port}",
            "RILL_ADMIN_ENABLED": "true",
            "RILL_REPLICATION_FACTOR": "3",
            "RILL_KAFKA_GROUP_INSTANCE_ID": f"{app.app_id}-{idx}",
            "RILL_KAFKA_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            "RILL_COMMIT_INTERVAL_MS": "500",
            "RILL_LOG": "info,rill_runtime::kafka::rebalance=debug,rill_runtime::engine::restore=debug",
        })
        # The shim's faults: its own path to the brokers, a control dir for its clock and disk.
        self.net = None
        self.ctl_dir = os.path.join(work, f"{self.name}-ctl")
        if shim:
            os.makedirs(self.ctl_dir, exist_ok=True)
            self.net = NetPath(self.name, [CLUSTER_PORT + i for i in range(3)])
            self.env.update({"LD_PRELOAD": shim, "CHAOS_REDIRECT": self.net.redirect(),
                             "CHAOS_CTL_DIR": self.ctl_dir, "CHAOS_SLOW_PREFIX": self.state_dir})
        self.proc = None
        self.busy = False          # a fault holds it (killed, stopped, disk full)
        self.expect_down = False   # exits now are the fault's, not by itself
        self.stopped = False
        self.starts = 0
        self.self_exits = []

    def spawn(self):
        with open(self.log_path, "a") as f:
            f.write(f"\n===== chaos: start {self.starts + 1} at {utc()} =====\n")
            f.flush()
            self.proc = subprocess.Popen([self.app.binary, *self.app.bin_args], env=self.env,
                                         stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        self.stopped = False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.proc.pid, sig)

    def sigkill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def pid(self):
        return self.proc.pid if self.alive() else None

    def rss_mib(self):
        pid = self.pid()
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, TypeError):
            return None
        return None

    def fds(self):
        pid = self.pid()
        try:
            return len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, TypeError):
            return None

    def transactional_id(self):
        try:
            with open(os.path.join(self.state_dir, "TRANSACTIONAL_ID")) as f:
                return f.read().strip() or None
        except OSError:
            for root, _, files in os.walk(self.state_dir):
                if "TRANSACTIONAL_ID" in files:
                    with open(os.path.join(root, "TRANSACTIONAL_ID")) as f:
                        return f.read().strip() or None
        return None

    def control(self, name, value):
        """Sets one of the shim's control files (clock-offset-ms, slow-disk-ms)."""
        tmp = os.path.join(self.ctl_dir, f".{name}")
        with open(tmp, "w") as f:
            f.write(str(value))
        os.replace(tmp, os.path.join(self.ctl_dir, name))

    def umount(self):
        if self.tmpfs:
            subprocess.run(["umount", self.state_dir], capture_output=True)


# ---- Workloads -----------------------------------------------------------------------------------

def line_words(n):
    """The words of input line n, as tests/common/service.rs `line`."""
    return [WORDS[(n * 5 + j * 7) % len(WORDS)] for j in range(n % 4 + 1)]


class Workload:
    """An application (3 instances), its input feeder, its output reader and its checker."""

    def __init__(self, short, run_id, args, bin_dir):
        self.short = short
        self.args = args
        self.app_id = f"{run_id}-{short}"
        self.input = f"{run_id}-{short}-in"
        self.output = f"{run_id}-{short}-out"
        self.sent = []           # what was sent, in order (the oracle's input)
        self.acked = 0
        self.acked_at = {}       # index -> when the broker acknowledged it
        self.failed = []         # (index, error) of sends the broker never acknowledged
        self.out_records = []    # live reader: (arrival time, partition, offset, key, value)
        self.stop_feed = threading.Event()
        self.stop_read = threading.Event()
        self.feed_done = threading.Event()
        self.last_out = None
        self.gaps = []           # (start, end) of output silences longer than 3 s
        self.instances = []

    # -- feeder --
    def producer(self):
        return Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "enable.idempotence": True,
                         "delivery.timeout.ms": 600000, "request.timeout.ms": 20000,
                         "linger.ms": 20, "message.timeout.ms": 600000, "log_level": 4})

    def delivery(self, index):
        def cb(err, _msg):
            with LOCK:
                if err is None:
                    self.acked += 1
                    self.acked_at[index] = time.time()
                else:
                    self.failed.append((index, str(err)))
        return cb

    def feed(self):
        p = self.producer()
        per_tick = max(1, int(self.args.rate / 4))
        while not self.stop_feed.is_set():
            t = time.time()
            for _ in range(per_tick):
                self.send_next(p)
            p.poll(0)
            time.sleep(max(0.0, 0.25 - (time.time() - t)))
        self.closing(p)
        left = p.flush(600)
        if left:
            log("note", f"{self.short}: {left} input records still unacknowledged after 600 s")
        self.feed_done.set()

    def send(self, p, topic, key, value, partition=None, ts=None):
        kw = {"key": key, "value": value, "on_delivery": self.delivery(len(self.sent))}
        if partition is not None:
            kw["partition"] = partition
        if ts is not None:
            kw["timestamp"] = ts
        while True:
            try:
                p.produce(topic, **kw)
                return
            except BufferError:
                p.poll(0.1)

    def closing(self, p):
        pass

    def topics(self):
        """The topics the run creates for it."""
        return [self.input, self.output]

    # -- reader --
    def reader_config(self, group):
        c = {"bootstrap.servers": BOOTSTRAP, "group.id": group, "enable.auto.commit": False,
             "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 4}
        if self.args.guarantee == "exactly_once_v2":
            c["isolation.level"] = "read_committed"
        else:
            c["isolation.level"] = "read_uncommitted"
        return c

    def read_live(self):
        c = Consumer(self.reader_config(f"chaos-live-{uuid.uuid4()}"))
        c.assign([TopicPartition(self.output, p, -2) for p in range(PARTITIONS)])
        while not self.stop_read.is_set():
            msgs = c.consume(500, 0.5)
            now = time.time()
            got = 0
            for m in msgs:
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        pass
                    continue
                self.out_records.append((now, m.partition(), m.offset(), m.key(), m.value()))
                got += 1
            if got:
                if self.last_out is not None and now - self.last_out > 3:
                    self.gaps.append((self.last_out, now))
                self.last_out = now
        c.close()

    def read_all(self):
        """A fresh read of the whole output topic to its end (every instance stopped): the
        records the checker judges, in offset order per partition."""
        c = Consumer(self.reader_config(f"chaos-final-{uuid.uuid4()}"))
        c.assign([TopicPartition(self.output, p, -2) for p in range(PARTITIONS)])
        at_end, out, deadline = set(), [], time.time() + 300
        while len(at_end) < PARTITIONS and time.time() < deadline:
            for m in c.consume(1000, 1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                    continue
                at_end.discard(m.partition())
                out.append((m.partition(), m.offset(), m.key(), m.value()))
        c.close()
        complete = len(at_end) == PARTITIONS
        out.sort(key=lambda r: (r[0], r[1]))
        return out, complete


class Wordcount(Workload):
    def __init__(self, *a):
        super().__init__("wc", *a)
        self.binary = os.path.join(self.bin_dir_, "wordcount")
        self.bin_args = ["--input", self.input, "--output", self.output]

    def send_next(self, p):
        n = len(self.sent)
        words = line_words(n)
        self.sent.append(words)
        self.send(p, self.input, None, " ".join(words).encode())

    def truth(self):
        failed = {i for i, _ in self.failed}
        counts = {}
        for i, words in enumerate(self.sent):
            if i in failed:
                continue
            for w in words:
                counts[w] = counts.get(w, 0) + 1
        return counts

    def satisfied(self, records):
        latest = {}
        for r in records:
            latest[r[-2]] = r[-1]
        truth = self.truth()
        return all(be_long(latest.get(w.encode())) == n for w, n in truth.items())

    def check(self, records):
        """Final counts exact: the latest count of every word (records in offset order per
        partition; a word's counts all go to one partition) equals the truth."""
        truth = self.truth()
        latest, bad_values = {}, 0
        for _, _, k, v in records:
            if be_long(v) is None:
                bad_values += 1
                continue
            latest[k.decode(errors="replace")] = be_long(v)
        lost = {w: (n, latest.get(w)) for w, n in truth.items() if (latest.get(w) or 0) < n}
        over = {w: (n, latest.get(w)) for w, n in truth.items() if (latest.get(w) or 0) > n}
        unknown = sorted(w for w in latest if w not in truth)
        res = {
            "workload": "wordcount",
            "input_records": len(self.sent) - len(self.failed),
            "words_expected": sum(truth.values()),
            "output_records": len(records),
            "lost_counts": sum(n - (g or 0) for n, g in lost.values()),
            "over_counts": sum((g or 0) - n for n, g in over.values()),
            "words_lost": {w: {"want": n, "got": g} for w, (n, g) in lost.items()},
            "words_over": {w: {"want": n, "got": g} for w, (n, g) in over.items()},
            "unknown_words": unknown,
            "undecodable_values": bad_values,
        }
        res["ok"] = not lost and not over and not unknown and not bad_values
        res["loss"] = bool(lost)
        res["forbidden_duplicate"] = bool(over)   # a count above the truth: input counted twice
        return res


class Clicks:
    """tests/kafka_windows.rs `Clicks`: 81% advance their partition's event time, 15% are out of
    order inside grace against the partition's time, 4% are late by more than window + grace
    against their own user's time; so no click's fate depends on the key-range layout."""

    def __init__(self, rng, base):
        self.rng = rng
        self.clock = [base] * PARTITIONS
        self.user_time = {}

    def next(self):
        u = self.rng.randrange(USERS)
        part = u % PARTITIONS
        self.clock[part] += self.rng.randrange(20)
        now = self.clock[part]
        roll = self.rng.randrange(100)
        own = self.user_time.get(u)
        if 81 <= roll <= 95:
            ts = now - self.rng.randrange(GRACE_MS - MARGIN_MS)
        elif roll >= 96 and own is not None:
            ts = own - WINDOW_MS - GRACE_MS - MARGIN_MS - self.rng.randrange(3000)
        else:
            ts = now
        self.user_time[u] = max(self.user_time.get(u, ts), ts)
        return (part, f"user-{u}", ts)


def range_of(h, p):
    return (h * p) >> 64


def closing_keys():
    """Keys covering every key range of every factor 1..MAX_FACTOR (tests/kafka_windows.rs
    `flush`): one far-future record per key range closes every window whatever the layout."""
    want = {(f, r) for f in range(1, MAX_FACTOR + 1) for r in range(f)}
    keys, covered, i = [], set(), 0
    while covered != want:
        k = f"flush-{i}"
        h = xxhash.xxh3_64_intdigest(k.encode())
        new = {(f, range_of(h, f)) for f in range(1, MAX_FACTOR + 1)} - covered
        if new:
            keys.append(k)
            covered |= new
        i += 1
    return keys


class Windows(Workload):
    def __init__(self, *a):
        super().__init__("win", *a)
        self.binary = os.path.join(self.bin_dir_, "windowed_count")
        self.bin_args = ["--input", self.input, "--output", self.output,
                         "--window-ms", str(WINDOW_MS), "--grace-ms", str(GRACE_MS)]
        now_ms = int(time.time() * 1000)
        # Event time an hour back: within the broker's timestamp bounds and topic retention.
        self.clicks = Clicks(random.Random(self.args.seed ^ 0x5eed), now_ms - 3_600_000)

    def send_next(self, p):
        c = self.clicks.next()
        self.sent.append(c)
        self.send(p, self.input, c[1].encode(), b"click", partition=c[0], ts=c[2])

    def closing(self, p):
        end = max((c[2] for c in self.sent), default=int(time.time() * 1000)) + 100_000
        keys = closing_keys()
        for part in range(PARTITIONS):
            for k in keys:
                c = (part, k, end)
                self.sent.append(c)
                self.send(p, self.input, k.encode(), b"click", partition=part, ts=end)
        log("note", f"win: sent {len(keys) * PARTITIONS} closing records at event time {end} "
                    f"({len(keys)} keys covering every range of factors 1..{MAX_FACTOR})")

    def oracle(self):
        """tests/kafka_windows.rs `oracle`: final count per `user@start`; a click counts unless its
        window's end plus grace is at or below its range's stream time, which lies between the
        user's own largest time and the partition's; both bounds must agree."""
        failed = {i for i, _ in self.failed}
        part_time, user_time, counts = {}, {}, {}
        late = ambiguous = 0
        for i, (part, user, ts) in enumerate(self.sent):
            if i in failed:
                continue
            part_time[part] = max(part_time.get(part, ts), ts)
            user_time[user] = max(user_time.get(user, ts), ts)
            start = ts - ts % WINDOW_MS
            closes = start + WINDOW_MS + GRACE_MS
            everywhere, somewhere = closes > part_time[part], closes > user_time[user]
            if everywhere != somewhere:
                ambiguous += 1
            if everywhere:
                if not user.startswith("flush"):
                    k = f"{user}@{start}"
                    counts[k] = counts.get(k, 0) + 1
            else:
                late += 1
        return counts, late, ambiguous

    def satisfied(self, records):
        want, _, _ = self.oracle()
        latest = {}
        for r in records:
            latest[r[-2]] = r[-1]
        return all(be_long(latest.get(k.encode())) == n for k, n in want.items())

    def check(self, records):
        """Every oracle window present with exactly its count; none with another count; none the
        oracle lacks; under exactly_once_v2 (read_committed) none twice."""
        want, late, ambiguous = self.oracle()
        emitted, wrong, unknown = {}, [], []
        for part, off, k, v in records:
            name = k.decode(errors="replace")
            n = be_long(v)
            emitted.setdefault(name, []).append(n)
            if name not in want:
                unknown.append((name, n, part, off))
            elif n != want[name]:
                wrong.append((name, want[name], n, part, off))
        missing = sorted(k for k in want if k not in emitted)
        never_right = sorted(k for k in want if k in emitted and want[k] not in emitted[k])
        repeated = {k: len(v) for k, v in emitted.items() if len(v) > 1}
        eos = self.args.guarantee == "exactly_once_v2"
        res = {
            "workload": "windows",
            "input_records": len(self.sent) - len(self.failed),
            "late_clicks": late,
            "generator_ambiguous_clicks": ambiguous,
            "windows_expected": len(want),
            "output_records": len(records),
            "windows_missing": len(missing),
            "windows_never_right": len(never_right),
            "records_wrong_count": len(wrong),
            "records_not_in_oracle": len(unknown),
            "windows_emitted_more_than_once": len(repeated),
            "extra_emissions": sum(n - 1 for n in repeated.values()),
            "examples_missing": missing[:10],
            "examples_wrong": [{"window": w, "want": a, "got": b, "partition": p, "offset": o}
                               for w, a, b, p, o in wrong[:10]],
            "examples_not_in_oracle": [{"window": w, "got": n, "partition": p, "offset": o}
                                       for w, n, p, o in unknown[:10]],
            "examples_repeated": dict(list(repeated.items())[:10]),
        }
        res["loss"] = bool(missing or never_right)
        res["forbidden_duplicate"] = bool(eos and repeated)
        res["ok"] = not (missing or never_right or wrong or unknown or ambiguous) and not (eos and repeated)
        if late == 0:
            res["ok"] = False
            res["note"] = "no late click: the run could not see one counted"
        return res


class Join(Workload):
    """Orders (stream) joined with customers' tiers (a versioned table), co-partitioned by
    customer: each order must come out once (under exactly_once_v2) with the tier its customer
    had at the order's timestamp. A tier change is sent LEAD_MS before its timestamp, so every
    order it applies to is sent half a minute after it; an order sent before the broker
    acknowledged the change it needs is ambiguous (reported, not judged)."""

    def __init__(self, *a):
        super().__init__("join", *a)
        self.input = f"{self.app_id}-orders"
        self.customers = f"{self.app_id}-customers"
        self.binary = os.path.join(self.bin_dir_, "enrich_orders")
        self.bin_args = ["--customers", self.customers, "--orders", self.input,
                         "--output", self.output, "--versioned-history-ms", str(HISTORY_MS)]
        self.rng = random.Random(self.args.seed ^ 0x7ab1e)
        # Event time an hour back, as the windows workload's.
        self.offset_ms = 3_600_000
        self.started = False

    def topics(self):
        return [self.customers, self.input, self.output]

    def now_ms(self):
        return int(time.time() * 1000) - self.offset_ms

    def send_next(self, p):
        now = self.now_ms()
        if not self.started:
            self.started = True
            for c in range(CUSTOMERS):
                self.update(p, c, now - 60_000)
        if self.rng.randrange(10) == 0:
            self.update(p, self.rng.randrange(CUSTOMERS), now + LEAD_MS)
        else:
            c = self.rng.randrange(CUSTOMERS)
            oid = f"o{len(self.sent)}"
            self.sent.append(("order", c, now, oid, time.time()))
            self.send(p, self.input, f"cust-{c}".encode(), oid.encode(), partition=c % PARTITIONS, ts=now)

    def update(self, p, c, ts):
        tier = f"tier-{len(self.sent)}"
        self.sent.append(("tier", c, ts, tier, time.time()))
        self.send(p, self.customers, f"cust-{c}".encode(), tier.encode(), partition=c % PARTITIONS, ts=ts)

    def oracle(self):
        """Per order id: (customer, the tier as of its timestamp, whether it is ambiguous)."""
        failed = {i for i, _ in self.failed}
        tiers = {}
        for i, (kind, c, ts, tier, _) in enumerate(self.sent):
            if kind == "tier" and i not in failed:
                tiers.setdefault(c, []).append((ts, i, tier))
        for h in tiers.values():
            h.sort()
        want = {}
        for i, (kind, c, ts, oid, sent_at) in enumerate(self.sent):
            if kind != "order" or i in failed:
                continue
            applies = [u for u in tiers.get(c, []) if u[0] <= ts]
            if not applies:
                continue
            _, idx, tier = applies[-1]
            ambiguous = self.acked_at.get(idx, float("inf")) > sent_at - 1.0
            want[oid] = (c, tier, ambiguous)
        return want

    def satisfied(self, records):
        got = {v.decode(errors="replace").partition("|")[0] for _, v in records if v is not None}
        return all(oid in got for oid in self.oracle())

    def check(self, records):
        """Every order present, each with the tier as of its timestamp; none the oracle lacks;
        under exactly_once_v2 (read_committed) none twice."""
        want = self.oracle()
        emitted, wrong, unknown, bad = {}, [], [], 0
        for part, off, k, v in records:
            if v is None or b"|" not in v:
                bad += 1
                continue
            oid, _, tier = v.decode(errors="replace").partition("|")
            emitted.setdefault(oid, []).append(tier)
            if oid not in want:
                unknown.append((oid, tier, part, off))
            elif tier != want[oid][1] and not want[oid][2]:
                wrong.append((oid, want[oid][1], tier, part, off))
        missing = sorted(o for o in want if o not in emitted)
        repeated = {o: len(t) for o, t in emitted.items() if len(t) > 1}
        ambiguous = sum(1 for w in want.values() if w[2])
        eos = self.args.guarantee == "exactly_once_v2"
        res = {
            "workload": "join",
            "input_records": len(self.sent) - len(self.failed),
            "orders_expected": len(want),
            "tier_changes": sum(1 for s in self.sent if s[0] == "tier"),
            "generator_ambiguous_orders": ambiguous,
            "output_records": len(records),
            "orders_missing": len(missing),
            "records_wrong_tier": len(wrong),
            "records_not_in_oracle": len(unknown),
            "undecodable_values": bad,
            "orders_emitted_more_than_once": len(repeated),
            "extra_emissions": sum(n - 1 for n in repeated.values()),
            "examples_missing": missing[:10],
            "examples_wrong": [{"order": o, "want": a, "got": b, "partition": p, "offset": f}
                               for o, a, b, p, f in wrong[:10]],
            "examples_not_in_oracle": [{"order": o, "got": t, "partition": p, "offset": f}
                                       for o, t, p, f in unknown[:10]],
            "examples_repeated": dict(list(repeated.items())[:10]),
        }
        res["loss"] = bool(missing)
        res["forbidden_duplicate"] = bool(eos and repeated)
        res["ok"] = not (missing or wrong or unknown or bad) and not (eos and repeated)
        return res


def _mk(cls, run_id, args, bin_dir):
    cls.bin_dir_ = bin_dir
    return cls(run_id, args, bin_dir)


# ---- Faults --------------------------------------------------------------------------------------

class Chaos:
    def __init__(self, args, workloads, work):
        self.args, self.workloads, self.work = args, workloads, work
        self.rng = random.Random(args.seed)
        self.instances = [i for w in workloads for i in w.instances]
        self.broker_lock = threading.Lock()   # at most one broker down: two would lose the quorum
        self.broker_turn = 0
        self.threads = []
        self.stop = threading.Event()
        self.counts = {}
        self.down_nodes = set()
        self.factor_of = {}

    def run(self, end):
        kinds = [("instance-sigkill", 3), ("instance-sigstop", 3), ("broker-sigkill", 3),
                 ("disk-full", 1)]
        if any(i.net for i in self.instances):
            kinds += [("network-partition", 2), ("slow-disk", 1), ("clock-jump", 1)]
        if self.args.guarantee == "at_least_once":
            kinds.append(("factor-change", 2))
        if self.args.faults != "all":
            wanted = set(self.args.faults.split(","))
            kinds = [(k, n) for k, n in kinds if k in wanted]
            log("note", f"fault kinds limited to {', '.join(k for k, _ in kinds)} (--faults)")
        if not kinds:
            log("note", "no fault kind to inject")
            while time.time() < end:
                time.sleep(1)
            return
        # A first fault soon, then one every gap_min..gap_max seconds; they overlap (each runs on
        # a thread of its own until its recovery).
        next_at = time.time() + self.rng.uniform(10, 20)
        while time.time() < end and not self.stop.is_set():
            if time.time() < next_at:
                time.sleep(0.5)
                continue
            next_at = time.time() + self.rng.uniform(self.args.gap_min, self.args.gap_max)
            kind = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            t = threading.Thread(target=self.inject, args=(kind,), daemon=True)
            t.start()
            self.threads.append(t)

    def pick_instance(self, need_tmpfs=False):
        free = [i for i in self.instances if not i.busy and i.alive() and (i.tmpfs or not need_tmpfs)]
        if not free:
            return None
        inst = self.rng.choice(free)
        inst.busy = True
        return inst

    def inject(self, kind):
        try:
            getattr(self, kind.replace("-", "_"))(kind)
        except Exception as e:  # a fault that fails to inject is logged, never skipped silently
            log("fault-error", f"{kind}: {type(e).__name__}: {e}")

    def count(self, kind):
        with LOCK:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def skipped(self, kind, why):
        log("fault-skipped", f"{kind}: {why}")

    def instance_sigkill(self, kind):
        inst = self.pick_instance()
        if inst is None:
            return self.skipped(kind, "every instance is already under a fault")
        try:
            inst.expect_down = True
            pid = inst.pid()
            t_fault = time.time()
            inst.sigkill()
            down = self.rng.uniform(2, 6)
            self.count(kind)
            log(kind, f"{inst.name} pid {pid} SIGKILLed; restart in {down:.1f}s", t_fault)
            time.sleep(down)
            inst.spawn()
            log("recover", f"{inst.name} restarted (pid {inst.pid()})")
        finally:
            inst.expect_down = False
            inst.busy = False

    def instance_sigstop(self, kind):
        inst = self.pick_instance()
        if inst is None:
            return self.skipped(kind, "every instance is already under a fault")
        try:
            long_stop = self.rng.random() < 0.5
            secs = (self.rng.uniform(SESSION_TIMEOUT_MS / 1000 + 2, SESSION_TIMEOUT_MS / 1000 + 10)
                    if long_stop else self.rng.uniform(2, 5))
            inst.signal(signal.SIGSTOP)
            inst.stopped = True
            self.count(kind)
            log(kind, f"{inst.name} pid {inst.pid()} SIGSTOPped for {secs:.1f}s "
                      f"({'longer' if long_stop else 'shorter'} than the {SESSION_TIMEOUT_MS} ms session timeout)")
            time.sleep(secs)
            inst.signal(signal.SIGCONT)
            inst.stopped = False
            log("recover", f"{inst.name} SIGCONT")
        finally:
            inst.busy = False

    def busiest_leader(self):
        """The leader of the input partition with the highest end offset (across workloads)."""
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
        c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "chaos-probe"})
        best = None
        try:
            for w in self.workloads:
                md = admin.list_topics(w.input, timeout=10).topics[w.input]
                for p, pm in md.partitions.items():
                    _, hi = c.get_watermark_offsets(TopicPartition(w.input, p), timeout=10)
                    if best is None or hi > best[0]:
                        best = (hi, f"{w.input}-{p}", pm.leader)
        finally:
            c.close()
        return best

    def broker_sigkill(self, kind):
        if not self.broker_lock.acquire(blocking=False):
            return self.skipped(kind, "a broker is already down (two down would lose the KRaft quorum)")
        try:
            eos = self.args.guarantee == "exactly_once_v2"
            targets = ["busiest-leader", "group-coordinator",
                       "transaction-coordinator" if eos else "controller"]
            target = targets[self.broker_turn % len(targets)]
            self.broker_turn += 1
            node, why = None, ""
            if target == "busiest-leader":
                hi, tp, node = self.busiest_leader()
                why = f"leader of {tp} (end offset {hi})"
            elif target == "group-coordinator":
                w = self.rng.choice(self.workloads)
                rc, out, err = kafka_cmd("coordinator", "--brokers", "3", "group", w.app_id)
                if rc == 0 and out.strip().isdigit():
                    node, why = int(out), f"coordinator of group {w.app_id}"
                else:
                    why = f"coordinator query for group {w.app_id} failed: {err[-200:]}"
            elif target == "transaction-coordinator":
                insts = [i for i in self.instances if i.transactional_id()]
                if insts:
                    tid = self.rng.choice(insts).transactional_id()
                    rc, out, err = kafka_cmd("coordinator", "--brokers", "3", "transaction", tid)
                    if rc == 0 and out.strip().isdigit():
                        node, why = int(out), f"transaction coordinator of {tid}"
                    else:
                        why = f"coordinator query for transactional id {tid} failed: {err[-200:]}"
                else:
                    why = "no TRANSACTIONAL_ID file found in any state dir"
            else:
                rc, out, err = kafka_cmd("quorum", "--brokers", "3")
                for ln in out.splitlines():
                    if ln.strip().startswith("LeaderId:"):
                        node = int(ln.split(":")[1])
                        why = "active controller (KRaft quorum leader; no transactions under at_least_once)"
                if node is None:
                    why = f"quorum query failed: {err[-200:]}"
            if node not in (1, 2, 3):
                node2 = self.rng.randint(1, 3)
                log("note", f"{kind}: target {target}: {why}; killing random node {node2} instead")
                node, why = node2, f"random (the {target} query gave no node)"
            t_fault = time.time()
            rc, out, err = kafka_cmd("stop-node", str(node), "--kill")
            if rc != 0:
                return log("fault-error", f"{kind}: stop-node {node} failed: {err[-300:]}")
            self.down_nodes.add(node)
            self.count(kind)
            self.count(f"{kind} ({target})")
            down = self.rng.uniform(5, 15)
            log(kind, f"node {node} SIGKILLed: {target}: {why}; restart in {down:.1f}s", t_fault)
            time.sleep(down)
            for attempt in range(5):
                rc, out, err = kafka_cmd("start-node", str(node), timeout=180)
                if rc == 0:
                    break
                log("note", f"start-node {node} attempt {attempt + 1} failed: {err[-300:]}")
                time.sleep(5)
            if rc == 0:
                self.down_nodes.discard(node)
                log("recover", f"node {node} started again")
            else:
                log("fault-error", f"node {node} did not start again")
        finally:
            self.broker_lock.release()

    def disk_full(self, kind):
        inst = self.pick_instance(need_tmpfs=True)
        if inst is None:
            return self.skipped(kind, "no instance with a tmpfs state dir is free")
        filler = os.path.join(inst.state_dir, "chaos-disk-filler")
        try:
            inst.expect_down = True   # rill documents: a full state dir is a clear error and an exit
            secs = self.rng.uniform(5, 15)
            written = 0
            t_fault = time.time()
            with open(filler, "wb") as f:
                chunk = b"\0" * (1 << 20)
                try:
                    while True:
                        f.write(chunk)
                        f.flush()
                        written += 1
                except OSError:
                    pass
            self.count(kind)
            st = os.statvfs(inst.state_dir)
            log(kind, f"{inst.name} state dir (tmpfs {self.args.disk_mb} MiB) filled with {written} MiB "
                      f"({st.f_bavail * st.f_frsize // 1024} KiB left) for {secs:.1f}s", t_fault)
            time.sleep(secs)
            os.remove(filler)
            log("recover", f"{inst.name} state dir freed; process {'alive' if inst.alive() else 'exited'}")
            if not inst.alive():
                log("note", f"{inst.name} exited on the full disk (rc {inst.proc.returncode}); restarting")
                inst.spawn()
        finally:
            if os.path.exists(filler):
                os.remove(filler)
            inst.expect_down = False
            inst.busy = False

    def factor_change(self, kind):
        inst = self.pick_instance()
        if inst is None:
            return self.skipped(kind, "every instance is already under a fault")
        try:
            to = self.rng.choice([f for f in LIVE_FACTORS if f != self.factor_of.get(inst.name, FACTOR)])
            self.count(kind)
            log(kind, f"{inst.name}: POST /admin/parallelising-factor factor {to}")
            t = time.time()
            body = json.dumps({"factor": to, "timeout_ms": 60000})
            try:
                conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=90)
                conn.request("POST", "/admin/parallelising-factor", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                text = r.read().decode(errors="replace")
                if r.status == 200:
                    self.factor_of[inst.name] = to
                log("recover", f"{inst.name}: factor change to {to}: HTTP {r.status} after "
                               f"{time.time() - t:.1f}s: {text.strip()[:300]}")
            except Exception as e:
                log("recover", f"{inst.name}: factor change to {to}: no answer ({type(e).__name__}: {e}) "
                               f"after {time.time() - t:.1f}s (the endpoint cuts connections; see the log)")
        finally:
            inst.busy = False

    def pick_shimmed(self, kind):
        inst = self.pick_instance()
        if inst is not None and inst.net is None:
            inst.busy = False
            inst = None
        if inst is None:
            self.skipped(kind, "no free instance runs with the fault shim")
        return inst

    def network_partition(self, kind):
        inst = self.pick_shimmed(kind)
        if inst is None:
            return
        try:
            long_cut = self.rng.random() < 0.5
            secs = (self.rng.uniform(SESSION_TIMEOUT_MS / 1000 + 5, 45) if long_cut else self.rng.uniform(2, 8))
            inst.net.partition()
            self.count(kind)
            log(kind, f"{inst.name} cut from every broker (blackhole, connections kept) for {secs:.1f}s "
                      f"({'longer' if long_cut else 'shorter'} than the {SESSION_TIMEOUT_MS} ms session timeout)")
            time.sleep(secs)
            inst.net.heal()
            log("recover", f"{inst.name} network healed")
        finally:
            inst.net.heal()
            inst.busy = False

    def shim_fault(self, kind, control, value, secs, what, back):
        """Sets one of the shim's controls on a free instance for `secs`, then resets it."""
        inst = self.pick_shimmed(kind)
        if inst is None:
            return
        try:
            inst.control(control, value)
            self.count(kind)
            log(kind, f"{inst.name} {what} for {secs:.1f}s")
            time.sleep(secs)
            inst.control(control, 0)
            log("recover", f"{inst.name} {back}")
        finally:
            inst.control(control, 0)
            inst.busy = False

    def slow_disk(self, kind):
        ms = self.rng.choice([50, 200, 1000])
        self.shim_fault(kind, "slow-disk-ms", ms, self.rng.uniform(10, 40),
                        f"state dir slow (each fsync/fdatasync {ms} ms, each write {ms / 10:.0f} ms)",
                        "state dir at full speed")

    def clock_jump(self, kind):
        offset = self.rng.choice([-1, 1]) * int(self.rng.uniform(60, 3600) * 1000)
        self.shim_fault(kind, "clock-offset-ms", offset, self.rng.uniform(10, 60),
                        f"wall clock jumps {offset / 1000:+.0f} s (CLOCK_REALTIME only)",
                        "wall clock back")

    def wait(self):
        for t in self.threads:
            t.join()


# ---- Supervision and sampling --------------------------------------------------------------------

GDB_LOCK = threading.Lock()


def dump_stacks(inst, work, gdb=False):
    """The threads' kernel states of an instance (from /proc: no pause) and, with `gdb`, every
    thread's stack (gdb attaches and so stops the process, for a minute or more with a debug
    build: only for an instance that is about to be killed anyway), into the work dir; returns
    the file's path."""
    path = os.path.join(work, f"{inst.name}-stacks-{time.strftime('%H%M%S', time.gmtime())}.txt")
    pid = inst.pid()
    with open(path, "w") as f:
        f.write(f"{inst.name} pid {pid} at {utc()}\n")
        try:
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                base = f"/proc/{pid}/task/{tid}"
                comm = open(f"{base}/comm").read().strip()
                state = open(f"{base}/stat").read().split(")")[1].split()[0]
                wchan = open(f"{base}/wchan").read().strip()
                f.write(f"thread {tid} {comm} state {state} wchan {wchan}\n")
        except OSError as e:
            f.write(f"/proc read failed: {e}\n")
        if gdb and shutil.which("gdb"):
            with GDB_LOCK:   # one at a time: each takes a core and ~0.5 GiB
                try:
                    r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                                       capture_output=True, text=True, timeout=300)
                    f.write(r.stdout + r.stderr)
                except subprocess.TimeoutExpired:
                    f.write("gdb timed out after 300 s\n")
                finally:
                    # A gdb killed while attached can leave its tracee stopped.
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except OSError:
                        pass
    log("note", f"{inst.name}: thread {'stacks' if gdb else 'states'} written to {path}")
    return path


def supervise(instances, stop):
    """Restarts an instance that exited by itself (not during a fault that expects it)."""
    while not stop.is_set():
        for i in instances:
            if i.proc is not None and i.proc.poll() is not None and not i.expect_down and not i.busy:
                rc = i.proc.returncode
                i.self_exits.append((time.time(), rc))
                log("self-exit", f"{i.name} exited by itself (rc {rc}); restarting in 2s; log {i.log_path}")
                time.sleep(2)
                if not stop.is_set():
                    i.spawn()
        time.sleep(1)


def metric_sums(inst, names):
    """Sums of the named metrics on the instance's /metrics (None when it does not answer)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=1)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode(errors="replace")
    except Exception:
        return None
    out = {n: 0.0 for n in names}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in out:
            try:
                out[name] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


STUCK_S = 60


def sample(*a):
    try:
        sample_loop(*a)
    except Exception as e:  # a dead sampler would leave the chart silently short
        log("note", f"the sampler failed: {type(e).__name__}: {e}")
        raise


def sample_loop(workloads, samples, stop, every, feeding, work):
    """Every `every` s: records in/out, each instance's RSS, fds and counters. An instance whose
    range commits stay still for STUCK_S s while input flows (and it is not SIGSTOPped) is logged,
    with its threads' kernel states (no gdb: it would stop the process), once per process."""
    last_change = {}
    reported = set()
    names = ["rill_commits_total", "rill_records_processed_total"]
    while not stop.is_set():
        row = {"t": time.time(), "in": {}, "out": {}, "rss": {}, "fds": {}, "commits": {}, "processed": {}}
        for w in workloads:
            row["in"][w.short] = w.acked
            row["out"][w.short] = len(w.out_records)
            for i in w.instances:
                row["rss"][i.name] = i.rss_mib()
                row["fds"][i.name] = i.fds()
                m = metric_sums(i, names) if i.alive() and not i.stopped else None
                if m is None:
                    continue
                row["commits"][i.name] = m["rill_commits_total"]
                row["processed"][i.name] = m["rill_records_processed_total"]
                key = (i.name, i.pid())
                prev = last_change.get(key)
                if prev is None or prev[1] != m["rill_commits_total"]:
                    last_change[key] = (row["t"], m["rill_commits_total"])
                elif (feeding.is_set() and row["t"] - prev[0] > STUCK_S and key not in reported
                      and not i.busy):
                    reported.add(key)
                    log("no-commit", f"{i.name} pid {i.pid()}: rill_commits_total still at "
                                     f"{m['rill_commits_total']:.0f} for {row['t'] - prev[0]:.0f}s while input flows")
                    threading.Thread(target=dump_stacks, args=(i, work), daemon=True).start()
        samples.append(row)
        stop.wait(every)


# ---- Report --------------------------------------------------------------------------------------

KIND_COLOURS = {"instance-sigkill": "#d62728", "instance-sigstop": "#ff7f0e", "broker-sigkill": "#9467bd",
                "disk-full": "#8c564b", "factor-change": "#2ca02c", "self-exit": "#000000",
                "no-commit": "#7f7f7f"}


def svg_chart(path, samples, events, workloads, title):
    W, H, L, R = 1100, 640, 70, 200
    panels = [(50, 300), (360, 580)]
    if len(samples) < 2:
        return
    t0, t1 = samples[0]["t"], samples[-1]["t"]
    span = max(1.0, t1 - t0)
    x = lambda t: L + (t - t0) / span * (W - L - R)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    # rates
    series = []
    colours = ["#1f77b4", "#17becf", "#e377c2", "#bcbd22"]
    for w in workloads:
        for d in ("in", "out"):
            pts = []
            for a, b in zip(samples, samples[1:]):
                dt = b["t"] - a["t"]
                if dt > 0:
                    pts.append((b["t"], (b[d][w.short] - a[d][w.short]) / dt))
            series.append((f"{w.short} records {d}/s", pts))
    rss = []
    names = [i.name for w in workloads for i in w.instances]
    for n in names:
        rss.append((f"{n} RSS MiB", [(s["t"], s["rss"][n]) for s in samples if s["rss"].get(n) is not None]))
    for (top, bottom), group, label in [(panels[0], series, "records/s"), (panels[1], rss, "RSS (MiB)")]:
        vmax = max([v for _, pts in group for _, v in pts] + [1])
        vmax *= 1.1
        y = lambda v, top=top, bottom=bottom, vmax=vmax: bottom - v / vmax * (bottom - top)
        out.append(f'<rect x="{L}" y="{top}" width="{W - L - R}" height="{bottom - top}" fill="none" stroke="#888"/>')
        for k in range(5):
            v = vmax * k / 4
            out.append(f'<text x="{L - 5}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
            out.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="15" y="{(top + bottom) / 2}" transform="rotate(-90 15 {(top + bottom) / 2})" text-anchor="middle">{label}</text>')
        for idx, (name, pts) in enumerate(group):
            col = colours[idx % len(colours)] if group is series else \
                ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"][idx % 6]
            if pts:
                d = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
                out.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="1.3"/>')
            ly = top + 14 + idx * 14
            out.append(f'<line x1="{W - R + 10}" x2="{W - R + 30}" y1="{ly - 4}" y2="{ly - 4}" stroke="{col}" stroke-width="2"/>')
            out.append(f'<text x="{W - R + 35}" y="{ly}">{name}</text>')
        for t, kind, detail in events:
            if kind in KIND_COLOURS and t0 <= t <= t1:
                out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}" '
                           f'stroke="{KIND_COLOURS[kind]}" stroke-width="1" stroke-dasharray="3,2" opacity="0.7">'
                           f'<title>{utc(t)} {kind} {detail}</title></line>')
    # time axis and fault legend
    for k in range(6):
        t = t0 + span * k / 5
        out.append(f'<text x="{x(t):.1f}" y="{panels[1][1] + 15}" text-anchor="middle">{(t - t0) / 60:.1f} min</text>')
    ly = panels[1][1] + 35
    lx = L
    for kind, col in KIND_COLOURS.items():
        out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{col}" stroke-width="2" stroke-dasharray="3,2"/>')
        out.append(f'<text x="{lx + 22}" y="{ly}">{kind}</text>')
        lx += 140
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def longest_stall(w, feed_start, feed_end):
    """The longest silence of the output topic while input flowed, and the fault before it."""
    gaps = list(w.gaps)
    if w.last_out is not None and feed_end - w.last_out > 3:
        gaps.append((w.last_out, feed_end))
    best = None
    for a, b in gaps:
        a2, b2 = max(a, feed_start), min(b, feed_end)
        if b2 > a2 and (best is None or b2 - a2 > best[1] - best[0]):
            best = (a2, b2)
    if best is None:
        return None
    before = sorted(e for e in EVENTS if e[1] not in ("note", "recover", "check", "fault-skipped")
                    and best[0] - 60 <= e[0] <= best[0] + 5)
    return {"start": utc(best[0]), "end": utc(best[1]), "seconds": round(best[1] - best[0], 1),
            "preceding_faults": [f"{utc(t)} {k} {d}" for t, k, d in before[-4:]]}


def write_report(path, ctx):
    a = ctx["args"]
    L = []
    L.append(f"# Chaos run: {a.guarantee}\n")
    L.append(f"Generated by `scripts/chaos` at {utc()}. Everything below was measured in this run.\n")
    L.append("## Command\n")
    L.append("```sh\n" + ctx["command"] + "\n```\n")
    L.append(f"- seed {a.seed}, {a.minutes} min of faults, input {a.rate} records/s per workload, "
             f"fault every {a.gap_min:.0f}-{a.gap_max:.0f} s (they overlap)")
    L.append(f"- started {ctx['start']}, input stopped {ctx['feed_end']}, finished {ctx['end']}")
    L.append(f"- cluster: 3 KRaft nodes (scripts/kafka --brokers 3) at {BOOTSTRAP}; topics of {PARTITIONS} "
             f"partitions, replication factor 3, min.insync.replicas 2")
    L.append(f"- {INSTANCES} instances per workload, parallelising.factor {FACTOR}, session timeout "
             f"{SESSION_TIMEOUT_MS} ms, commit interval 500 ms, static membership, binaries: `{ctx['bin_dir']}`")
    L.append(f"- evidence (instance logs, fault log, samples, checker output): `{ctx['work']}`")
    for w in ctx["workloads"]:
        inputs = ", ".join(f"`{t}`" for t in w.topics() if t != w.output)
        L.append(f"- {w.short}: application `{w.app_id}`, input {inputs}, output `{w.output}`")
    L.append("")
    L.append("## Verdict\n")
    L.append(f"**{'PASS' if ctx['ok'] else 'FAIL'}**: " + ctx["verdict"] + "\n")
    L.append("## Faults injected\n")
    L.append("| kind | count | times (UTC) |\n|---|---|---|")
    for kind in sorted(ctx["counts"]):
        if "(" in kind:
            continue
        times = ", ".join(utc(t)[11:19] for t, k, _ in EVENTS if k == kind)
        L.append(f"| {kind} | {ctx['counts'][kind]} | {times} |")
    sub = {k: v for k, v in ctx["counts"].items() if "(" in k}
    if sub:
        L.append("\nBroker kills by target: " + ", ".join(f"{k.split('(')[1].rstrip(')')} {v}" for k, v in sorted(sub.items())) + ".")
    skipped = [e for e in EVENTS if e[1] in ("fault-skipped", "fault-error")]
    L.append(f"\nFaults skipped or failed to inject: {len(skipped)}" +
             ("".join(f"\n- {utc(t)} {k}: {d}" for t, k, d in skipped)))
    exits = [e for e in EVENTS if e[1] == "self-exit"]
    L.append(f"\nInstances that exited by themselves outside a fault that expects it: {len(exits)}" +
             ("".join(f"\n- {utc(t)} {d}" for t, _, d in exits)))
    unclean = [e for e in EVENTS if e[1] == "unclean-stop"]
    L.append(f"\nInstances that did not exit 0 within 90 s of the final SIGTERM: {len(unclean)}" +
             ("".join(f"\n- {utc(t)} {d}" for t, _, d in unclean)))
    still = [e for e in EVENTS if e[1] == "no-commit"]
    L.append(f"\nInstances with no range commit for {STUCK_S} s while input flowed (idle or stuck; "
             f"threads' kernel states in the evidence dir): {len(still)}" +
             ("".join(f"\n- {utc(t)} {d}" for t, _, d in still)))
    if ctx["shim"]:
        L.append("\nHow the faults without a tool on this machine are made:\n")
        for k, how in SHIM_FAULTS:
            L.append(f"- **{k}**: {how}")
    else:
        L.append("\nNot injected: " + ", ".join(k for k, _ in SHIM_FAULTS) +
                 " (the fault shim scripts/chaos_faults.c did not build; see the fault log)")
    L.append("\n## Records and checkers\n")
    for w, res in ctx["results"]:
        L.append(f"### {res['workload']}\n")
        L.append(f"- records in (acknowledged with acks=all): {w.acked}; sends that failed: {len(w.failed)}")
        L.append(f"- records out (final read of `{w.output}`, "
                 f"{'read_committed' if a.guarantee == 'exactly_once_v2' else 'read_uncommitted'}): "
                 f"{res['output_records']} (read to the end of every partition: {res.get('read_complete')})")
        L.append(f"- output matched the oracle {res.get('matched_after')}")
        st = res.get("stall")
        if st:
            L.append(f"- longest stall of output progress while input flowed: **{st['seconds']} s** "
                     f"({st['start']} to {st['end']}); faults from a minute before its start to 5 s after it: "
                     + ("; ".join(st["preceding_faults"]) or "none"))
        else:
            L.append("- longest stall of output progress: none over 3 s")
        if res["workload"] == "wordcount":
            L.append(f"- words expected {res['words_expected']}; **lost counts {res['lost_counts']}**, "
                     f"**counted twice {res['over_counts']}**, unknown words {len(res['unknown_words'])}, "
                     f"undecodable values {res['undecodable_values']}")
            if res["words_lost"] or res["words_over"]:
                L.append(f"- words short: {json.dumps(res['words_lost'])}; words over: {json.dumps(res['words_over'])}")
        elif res["workload"] == "join":
            L.append(f"- orders expected {res['orders_expected']} (tier changes {res['tier_changes']}, "
                     f"generator ambiguities {res['generator_ambiguous_orders']})")
            L.append(f"- **lost**: {res['orders_missing']} orders missing")
            L.append(f"- **wrong**: {res['records_wrong_tier']} records with another tier than the one "
                     f"as of the order's timestamp, {res['records_not_in_oracle']} orders the oracle lacks, "
                     f"{res['undecodable_values']} undecodable")
            L.append(f"- **duplicated**: {res['orders_emitted_more_than_once']} orders emitted more than once "
                     f"({res['extra_emissions']} extra records; "
                     f"{'forbidden' if a.guarantee == 'exactly_once_v2' else 'allowed (same tier) under at_least_once'})")
            for key in ("examples_missing", "examples_wrong", "examples_not_in_oracle", "examples_repeated"):
                if res[key]:
                    L.append(f"- {key.replace('_', ' ')}: `{json.dumps(res[key])[:800]}`")
        else:
            L.append(f"- windows expected {res['windows_expected']} (late clicks {res['late_clicks']}, "
                     f"generator ambiguities {res['generator_ambiguous_clicks']})")
            L.append(f"- **lost** (missing or never with the oracle's count): {res['windows_missing']} missing, "
                     f"{res['windows_never_right']} never right")
            L.append(f"- **wrong**: {res['records_wrong_count']} records with another count, "
                     f"{res['records_not_in_oracle']} windows the oracle lacks")
            L.append(f"- **duplicated**: {res['windows_emitted_more_than_once']} windows emitted more than once "
                     f"({res['extra_emissions']} extra records; "
                     f"{'forbidden' if a.guarantee == 'exactly_once_v2' else 'allowed (same count) under at_least_once'})")
            for key in ("examples_missing", "examples_wrong", "examples_not_in_oracle", "examples_repeated"):
                if res[key]:
                    L.append(f"- {key.replace('_', ' ')}: `{json.dumps(res[key])[:800]}`")
        L.append(f"- verdict: {'ok' if res['ok'] else 'NOT OK'}\n")
    L.append("## Processes over time\n")
    L.append(f"Sampled every {a.sample_every} s from /proc (RSS, open fds) and the topics (records in/out).\n")
    L.append("| instance | starts | RSS MiB min / max / last | fds min / max / last |\n|---|---|---|---|")
    for w in ctx["workloads"]:
        for i in w.instances:
            r = [s["rss"][i.name] for s in ctx["samples"] if s["rss"].get(i.name) is not None]
            f = [s["fds"][i.name] for s in ctx["samples"] if s["fds"].get(i.name) is not None]
            fmt = lambda v: f"{min(v):.0f} / {max(v):.0f} / {v[-1]:.0f}" if v else "-"
            L.append(f"| {i.name} | {i.starts} | {fmt(r)} | {fmt(f)} |")
    L.append(f"\n![throughput, RSS and faults]({os.path.basename(ctx['svg'])})\n")
    L.append("## Fault log\n")
    L.append("```text")
    for t, k, d in sorted(EVENTS):
        L.append(f"{utc(t)} +{t - T0:7.1f}s {k:<18} {d}")
    L.append("```")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


SHIM_FAULTS = [
    ("network partition of one instance", "no iptables/nftables on this machine, so scripts/chaos_faults.c "
     "(LD_PRELOAD) redirects the instance's connections to the brokers through a proxy of its own, "
     "which the fault blackholes"),
    ("slow disk", "no device-mapper delay target or FUSE here, so the shim sleeps in fsync, fdatasync, "
     "sync_file_range and writes of files under the instance's state dir"),
    ("clock jump", "the shim offsets CLOCK_REALTIME (clock_gettime, gettimeofday, time) of the instance "
     "only, where rill and librdkafka read the wall clock; monotonic clocks do not move, as on a real "
     "machine whose clock is stepped"),
]


# ---- Checker self-test ----------------------------------------------------------------------------

WAITER_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <sys/time.h>
#include <threads.h>
#include <time.h>
static long long mono_ms(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}
static struct timespec deadline(int ms) {   /* as librdkafka's cnd_timedwait_ms */
    struct timeval tv; gettimeofday(&tv, NULL);
    struct timespec ts = {tv.tv_sec, tv.tv_usec * 1000L + ms * 1000000L};
    ts.tv_sec += ts.tv_nsec / 1000000000L; ts.tv_nsec %= 1000000000L; return ts;
}
int main(void) {
    cnd_t c; mtx_t m; cnd_init(&c); mtx_init(&m, mtx_plain); mtx_lock(&m);
    long long t = mono_ms(); struct timespec ts = deadline(300);
    cnd_timedwait(&c, &m, &ts); printf("%lld ", mono_ms() - t);
    pthread_cond_t pc = PTHREAD_COND_INITIALIZER; pthread_mutex_t pm = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&pm); t = mono_ms(); ts = deadline(300);
    pthread_cond_timedwait(&pc, &pm, &ts); printf("%lld\n", mono_ms() - t);
    return 0;
}
"""


def shim_self_test(expect):
    """The fault shim and the instance's network path do what the faults claim."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        shim = build_shim(d)
        expect("the fault shim builds", shim is not None)
        if shim is None:
            return
        ctl, slowdir = os.path.join(d, "ctl"), os.path.join(d, "state")
        os.makedirs(ctl)
        os.makedirs(slowdir)
        env = dict(os.environ, LD_PRELOAD=shim, CHAOS_CTL_DIR=ctl, CHAOS_SLOW_PREFIX=slowdir)
        with open(os.path.join(ctl, "clock-offset-ms"), "w") as f:
            f.write("-3600000")
        probe = "import time; print(time.time(), time.monotonic())"
        shifted = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout.split()
        plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split()
        jump = float(plain[0]) - float(shifted[0])
        expect(f"clock jump: the wall clock moves back an hour ({jump:.1f} s) and the monotonic clock "
               f"does not ({float(plain[1]) - float(shifted[1]):.1f} s)",
               3590 < jump < 3610 and abs(float(plain[1]) - float(shifted[1])) < 10)
        # librdkafka's timed waits (tinycthread's cnd_timedwait_ms) take a deadline on the wall
        # clock: under a shifted clock they must still last their timeout, not the shift.
        for offset in ("3600000", "-3600000"):
            with open(os.path.join(ctl, "clock-offset-ms"), "w") as f:
                f.write(offset)
            waiter = os.path.join(d, "waiter")
            with open(waiter + ".c", "w") as f:
                f.write(WAITER_C)
            subprocess.run(["gcc", "-O1", "-o", waiter, waiter + ".c", "-lpthread"], check=True)
            try:
                out = subprocess.run([waiter], env=env, capture_output=True, text=True, timeout=10).stdout.split()
            except subprocess.TimeoutExpired:
                out = ["over 10000"]
            expect(f"clock jump {int(offset) // 1000:+d} s: a 300 ms cnd_timedwait and pthread_cond_timedwait "
                   f"on a wall-clock deadline last {out} ms", len(out) == 2 and all(x.isdigit() and 250 <= int(x) < 2000 for x in out))
        os.remove(os.path.join(ctl, "clock-offset-ms"))
        with open(os.path.join(ctl, "slow-disk-ms"), "w") as f:
            f.write("200")
        writer = ("import os, sys, time\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nt = time.monotonic()\n"
                  "for _ in range(3):\n    os.write(fd, b'x'); os.fsync(fd)\nprint(time.monotonic() - t)")
        slow_s = float(subprocess.run([sys.executable, "-c", writer, os.path.join(slowdir, "f")], env=env,
                                      capture_output=True, text=True).stdout)
        fast_s = float(subprocess.run([sys.executable, "-c", writer, os.path.join(d, "f")], env=env,
                                      capture_output=True, text=True).stdout)
        expect(f"slow disk: 3 writes and fsyncs in the state dir take >= 0.6 s ({slow_s:.2f} s), "
               f"elsewhere < 0.3 s ({fast_s:.2f} s)", slow_s >= 0.6 and fast_s < 0.3)
    # The network path: an echo server behind a NetPath, reached through the shim's redirect.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    echo_port = srv.getsockname()[1]

    def echo():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=lambda c=c: [c.sendall(b) for b in iter(lambda: c.recv(100), b"")],
                             daemon=True).start()
    threading.Thread(target=echo, daemon=True).start()
    net = NetPath("self-test", [echo_port])
    unused = free_port()
    client = ("import socket, sys\ns = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
              "s.settimeout(1.5)\nout = []\nfor m in (b'one', b'two'):\n    s.sendall(m)\n"
              "    try:\n        out.append(s.recv(100).decode())\n    except socket.timeout:\n"
              "        out.append('timeout')\n    sys.stdin.readline()\nprint(' '.join(out))")
    with tempfile.TemporaryDirectory() as d:
        shim = build_shim(d)
        env = dict(os.environ, LD_PRELOAD=shim, CHAOS_REDIRECT=f"{unused}={net.ports[echo_port]}")
        p = subprocess.Popen([sys.executable, "-c", client, str(unused)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        net.partition()        # after 'one' went through, before 'two'
        p.stdin.write("\n")
        p.stdin.flush()
        time.sleep(2)
        net.heal()
        p.stdin.write("\n")
        p.stdin.flush()
        out = p.communicate(timeout=10)[0].strip()
    expect(f"network partition: a redirected connection echoes, then times out while cut ({out!r})",
           out == "one timeout")


def self_test(bin_dir):
    """Feeds the checkers synthetic outputs with a loss, a double count, a wrong count, a window
    the oracle lacks and a repeated window, and fails unless each is flagged (no Kafka needed)."""
    def long_(n):
        return int(n).to_bytes(8, "big", signed=True)
    failures = []

    def expect(what, cond):
        print(f"self-test: {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(what)

    for guarantee in ("at_least_once", "exactly_once_v2"):
        args = argparse.Namespace(guarantee=guarantee, seed=7, rate=100)
        wc = _mk(Wordcount, "selftest", args, bin_dir)
        wc.sent = [line_words(n) for n in range(500)]
        truth = wc.truth()
        good = [(0, i, w.encode(), long_(n)) for i, (w, n) in enumerate(sorted(truth.items()))]
        expect(f"{guarantee} wordcount: exact counts pass", wc.check(good)["ok"])
        w0 = good[0][2]
        short = good + [(0, 999, w0, long_(truth[w0.decode()] - 1))]
        r = wc.check(short)
        expect(f"{guarantee} wordcount: a count one short is a loss", r["loss"] and not r["ok"])
        over = good + [(0, 999, w0, long_(truth[w0.decode()] + 1))]
        r = wc.check(over)
        expect(f"{guarantee} wordcount: a count one over is a duplicate", r["forbidden_duplicate"] and not r["ok"])
        r = wc.check(good[1:])
        expect(f"{guarantee} wordcount: a missing word is a loss", r["loss"])

        win = _mk(Windows, "selftest", args, bin_dir)
        win.sent = [win.clicks.next() for _ in range(3000)]
        end = max(c[2] for c in win.sent) + 100_000
        win.sent += [(p, "flush-0", end) for p in range(PARTITIONS)]
        want, late, amb = win.oracle()
        expect(f"{guarantee} windows: the generator makes late clicks ({late}) and no ambiguity ({amb})",
               late > 0 and amb == 0)
        good = [(0, i, k.encode(), long_(n)) for i, (k, n) in enumerate(sorted(want.items()))]
        expect(f"{guarantee} windows: exact windows pass", win.check(good)["ok"])
        r = win.check(good[1:])
        expect(f"{guarantee} windows: a missing window is a loss", r["loss"] and not r["ok"])
        k0, n0 = good[0][2], want[good[0][2].decode()]
        r = win.check([(0, 0, k0, long_(n0 + 1))] + good[1:])
        expect(f"{guarantee} windows: a window only with another count is lost and wrong",
               r["loss"] and r["records_wrong_count"] == 1 and not r["ok"])
        r = win.check(good + [(0, 9999, k0, long_(n0 - 1))])
        expect(f"{guarantee} windows: an extra emission with another count is wrong",
               r["records_wrong_count"] == 1 and not r["ok"])
        r = win.check(good + [(0, 9999, b"user-999@0", long_(1))])
        expect(f"{guarantee} windows: a window the oracle lacks is wrong", r["records_not_in_oracle"] == 1 and not r["ok"])
        r = win.check(good + [good[0]])
        if guarantee == "exactly_once_v2":
            expect("exactly_once_v2 windows: a window twice is a forbidden duplicate",
                   r["forbidden_duplicate"] and not r["ok"])
        else:
            expect("at_least_once windows: a window twice with its count is allowed",
                   r["ok"] and r["windows_emitted_more_than_once"] == 1)

        jn = _mk(Join, "selftest", args, bin_dir)
        jn.sent = [("tier", 0, 0, "tier-0", 0.0), ("tier", 1, 0, "tier-1", 0.0),
                   ("tier", 0, 1000, "tier-2", 0.0), ("order", 0, 500, "o3", 10.0),
                   ("order", 0, 1500, "o4", 10.0), ("order", 1, 1300, "o5", 10.0),
                   ("tier", 1, 1400, "tier-6", 20.0), ("order", 1, 1600, "o7", 15.0)]
        jn.acked_at = {0: 1.0, 1: 1.0, 2: 1.0, 3: 11.0, 4: 11.0, 5: 11.0, 6: 21.0, 7: 16.0}
        want = jn.oracle()
        expect(f"{guarantee} join: the oracle takes the tier as of each order's timestamp",
               {o: t for o, (_, t, _) in want.items()} == {"o3": "tier-0", "o4": "tier-2", "o5": "tier-1", "o7": "tier-6"})
        expect(f"{guarantee} join: an order sent before its tier change was acknowledged is ambiguous",
               want["o7"][2] and not any(want[o][2] for o in ("o3", "o4", "o5")))
        good = [(c % PARTITIONS, i, f"cust-{c}".encode(), f"{o}|{t}".encode())
                for i, (o, (c, t, _)) in enumerate(sorted(want.items()))]
        expect(f"{guarantee} join: exact orders pass", jn.check(good)["ok"])
        r = jn.check(good[1:])
        expect(f"{guarantee} join: a missing order is a loss", r["loss"] and not r["ok"])
        wrong = [(0, 99, b"cust-0", b"o4|tier-0")]
        r = jn.check(good[:1] + wrong + good[2:])
        expect(f"{guarantee} join: an order with the tier before its timestamp's is wrong",
               r["records_wrong_tier"] == 1 and not r["ok"])
        r = jn.check([x for x in good if not x[3].startswith(b"o7")] + [(1, 98, b"cust-1", b"o7|tier-1")])
        expect(f"{guarantee} join: an ambiguous order is not judged", r["ok"])
        r = jn.check(good + [good[0]])
        if guarantee == "exactly_once_v2":
            expect("exactly_once_v2 join: an order twice is a forbidden duplicate",
                   r["forbidden_duplicate"] and not r["ok"])
        else:
            expect("at_least_once join: an order twice with its tier is allowed",
                   r["ok"] and r["orders_emitted_more_than_once"] == 1)
    shim_self_test(expect)
    keys = closing_keys()
    cover = {(f, range_of(xxhash.xxh3_64_intdigest(k.encode()), f)) for k in keys for f in range(1, MAX_FACTOR + 1)}
    expect(f"closing keys ({len(keys)}) cover every range of factors 1..{MAX_FACTOR}",
           len(cover) == sum(range(1, MAX_FACTOR + 1)))
    # rill's key_hash is xxh3_64 with the default seed (topology/src/keyrange.rs); were the
    # Python xxhash to differ, some range would keep its windows open and the run would report
    # them missing: a loud failure, not a silent pass.
    print(f"self-test: {len(failures)} failures")
    return 1 if failures else 0


# ---- Main ----------------------------------------------------------------------------------------

def main():
    global FAULT_LOG
    ap = argparse.ArgumentParser(description="chaos run on the 3-broker cluster (issue 48)")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--guarantee", choices=["at_least_once", "exactly_once_v2"])
    ap.add_argument("--workload", choices=["wordcount", "windows", "join", "all"], default="all")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rate", type=int, default=100, help="input records/s per workload")
    ap.add_argument("--gap-min", type=float, default=10, help="seconds between faults, least")
    ap.add_argument("--gap-max", type=float, default=30, help="seconds between faults, most")
    ap.add_argument("--faults", default="all",
                    help="comma-separated kinds to inject (instance-sigkill, instance-sigstop, "
                         "broker-sigkill, disk-full, factor-change, network-partition, slow-disk, "
                         "clock-jump), default all")
    ap.add_argument("--sample-every", type=float, default=3)
    ap.add_argument("--drain-timeout", type=float, default=420)
    ap.add_argument("--disk-mb", type=int, default=512)
    ap.add_argument("--results", default=os.path.join(REPO, "benches", "results"))
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--self-test", action="store_true", help="check the checkers on synthetic outputs, then exit")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(self_test(args.bin_dir))
    if not args.guarantee:
        ap.error("--guarantee is required")
    # A SIGTERM ends the run through the finally below: instances killed, tmpfs mounts released.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    run_id = f"chaos-{'alo' if args.guarantee == 'at_least_once' else 'eos'}-{time.strftime('%m%d%H%M%S', time.gmtime())}"
    work = os.path.expanduser(f"~/.cache/rill/chaos/{run_id}")
    os.makedirs(work, exist_ok=True)
    FAULT_LOG = open(os.path.join(work, "faults.log"), "a")
    command = args.command or "scripts/chaos " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    log("note", f"run {run_id}, seed {args.seed}, work dir {work}")

    # The cluster: started here if it does not run, stopped at the end only then.
    started_cluster = False
    rc, out, _ = kafka_cmd("status", "--brokers", "3")
    if rc != 0:
        log("note", "cluster not running: scripts/kafka start --brokers 3")
        rc, out, err = kafka_cmd("start", "--brokers", "3", timeout=300)
        if rc != 0:
            sys.exit(f"chaos: the cluster did not start: {err[-1000:]}")
        started_cluster = True
    log("note", f"cluster at {BOOTSTRAP} ({'started by this run' if started_cluster else 'already running'})")

    workloads = []
    if args.workload in ("wordcount", "all"):
        workloads.append(_mk(Wordcount, run_id, args, args.bin_dir))
    if args.workload in ("windows", "all"):
        workloads.append(_mk(Windows, run_id, args, args.bin_dir))
    if args.workload in ("join", "all"):
        workloads.append(_mk(Join, run_id, args, args.bin_dir))
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    topics = [t for w in workloads for t in w.topics()]
    fs = admin.create_topics([NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"}) for t in topics])
    for t, f in fs.items():
        f.result(30)
    log("note", f"created topics {', '.join(topics)} ({PARTITIONS} partitions, RF 3)")

    shim = build_shim(work)
    all_instances = []
    for w in workloads:
        w.instances = [Instance(w, i, args, work, shim) for i in range(INSTANCES)]
        all_instances += w.instances
    stop_all = threading.Event()
    feeding = threading.Event()
    feeding.set()
    samples = []
    exit_code = 2
    try:
        for i in all_instances:
            i.spawn()
        log("note", "instances: " + ", ".join(f"{i.name} pid {i.pid()} http 127.0.0.1:{i.port}" for i in all_instances))
        threads = [threading.Thread(target=supervise, args=(all_instances, stop_all), daemon=True),
                   threading.Thread(target=sample, args=(workloads, samples, stop_all, args.sample_every, feeding, work),
                                    daemon=True)]
        feeders = [threading.Thread(target=w.feed, daemon=True) for w in workloads]
        readers = [threading.Thread(target=w.read_live, daemon=True) for w in workloads]
        for t in threads + feeders + readers:
            t.start()
        feed_start = time.time()
        end = feed_start + args.minutes * 60
        chaos = Chaos(args, workloads, work)
        chaos.run(end)
        log("note", "fault phase over; waiting for the faults' recoveries")
        chaos.wait()
        feed_end = time.time()
        # Everything back: every node up, every instance running and not stopped.
        for n in (1, 2, 3):
            kafka_cmd("start-node", str(n), timeout=180)
        for i in all_instances:
            if i.stopped:
                i.signal(signal.SIGCONT)
            if i.net:
                i.net.heal()
        log("note", "stopping the input (then the closing records)")
        feeding.clear()
        for w in workloads:
            w.stop_feed.set()
        for w in workloads:
            w.feed_done.wait(900)
        log("note", "input flushed: " + ", ".join(f"{w.short} {w.acked} acknowledged, {len(w.failed)} failed" for w in workloads))
        # Wait for the outputs to match the oracle (live reader), as tests' read_until.
        matched_after = {}
        deadline = time.time() + args.drain_timeout
        t_stop = time.time()
        pending = list(workloads)
        while pending and time.time() < deadline:
            for w in list(pending):
                if w.satisfied([(r[3], r[4]) for r in list(w.out_records)]):
                    matched_after[w.short] = f"{time.time() - t_stop:.0f} s after the input stopped"
                    log("note", f"{w.short}: live output matches the oracle")
                    pending.remove(w)
            time.sleep(2)
        for w in pending:
            matched_after[w.short] = f"not within {args.drain_timeout:.0f} s after the input stopped"
            log("note", f"{w.short}: live output did NOT match the oracle within {args.drain_timeout:.0f}s")
        stop_all.set()
        # Clean stop: SIGTERM, each must drain, commit and exit 0.
        sigterm_at = time.time()
        for i in all_instances:
            i.expect_down = True
            i.signal(signal.SIGTERM)
        for i in all_instances:
            try:
                rc = i.proc.wait(max(1, sigterm_at + 90 - time.time()))
            except subprocess.TimeoutExpired:
                dump = dump_stacks(i, work, gdb=True)
                i.sigkill()
                rc = f"killed after 90 s; thread stacks in {dump}"
            log("note", f"{i.name} stopped by SIGTERM: exit {rc}")
            if rc != 0:
                log("unclean-stop", f"{i.name}: SIGTERM did not end in exit 0 ({rc})")
        for w in workloads:
            w.stop_read.set()
        results, ok, verdicts = [], True, []
        any_loss = any_dup = False
        for w in workloads:
            records, complete = w.read_all()
            res = w.check(records)
            res["read_complete"] = complete
            res["matched_after"] = matched_after.get(w.short)
            res["stall"] = longest_stall(w, feed_start, feed_end)
            if w.failed:
                res["ok"] = False
                res["note"] = f"{len(w.failed)} input sends failed: the oracle excludes them, which may be wrong"
            if not complete:
                res["ok"] = False
            results.append((w, res))
            any_loss |= res["loss"]
            any_dup |= res["forbidden_duplicate"]
            ok &= res["ok"]
            with open(os.path.join(work, f"check-{w.short}.json"), "w") as f:
                json.dump(res, f, indent=1)
            log("check", f"{w.short}: {json.dumps({k: v for k, v in res.items() if not k.startswith(('examples', 'words_'))})}")
        exits = [e for e in EVENTS if e[1] in ("self-exit", "unclean-stop")]
        if exits:
            ok = False
        verdict = []
        verdict.append("loss found" if any_loss else "no loss")
        verdict.append("forbidden duplicates found" if any_dup else "no forbidden duplicate")
        if exits:
            verdict.append(f"{len(exits)} unexpected exits or unclean stops")
        if not all(r["ok"] for _, r in results):
            verdict.append("a checker is not ok (see below)")
        os.makedirs(args.results, exist_ok=True)
        md = os.path.join(args.results, f"chaos-{args.guarantee}.md")
        svg = os.path.join(args.results, f"chaos-{args.guarantee}.svg")
        with open(os.path.join(work, "samples.json"), "w") as f:
            json.dump(samples, f)
        svg_chart(svg, samples, EVENTS, workloads,
                  f"chaos {args.guarantee}: records/s in and out, RSS per instance, faults (dashed)")
        write_report(md, {"args": args, "command": command, "start": utc(feed_start), "feed_end": utc(feed_end),
                          "end": utc(), "bin_dir": args.bin_dir, "work": work, "workloads": workloads,
                          "ok": ok, "verdict": "; ".join(verdict), "counts": chaos.counts, "shim": shim,
                          "results": results, "samples": samples, "svg": svg})
        log("note", f"report {md}, chart {svg}")
        exit_code = 1 if (any_loss or any_dup) else (0 if ok else 3)
    finally:
        stop_all.set()
        for i in all_instances:
            if i.alive():
                i.signal(signal.SIGCONT)
                i.sigkill()
        for i in all_instances:
            i.umount()
        if started_cluster:
            log("note", "stopping the cluster this run started")
            kafka_cmd("stop", "--brokers", "3", timeout=120)
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
