package rill.bench;

import java.time.Duration;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * Kafka Streams side of rill's side-by-side benchmarks: the same topologies as rill's runner
 * (benches/compare.rs), selected by the first argument.
 *
 * <pre>java -jar kafka-streams-peer.jar SCENARIO BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR THREADS</pre>
 *
 * s1: each value starts with a sleep in microseconds (a remote call stand-in); sleep, forward.
 * s2: count by key (KTable), its changes to OUTPUT as 8-byte big-endian longs.
 * s3, s4: drop values containing "omicron", upper-case the rest.
 * s5: count by key in 60 s tumbling windows with 10 s grace, final counts only (suppress until
 * the window closes), to OUTPUT with key "KEY@WINDOW_START_MS" and the count as an 8-byte long.
 * s6: left join of the orders (INPUT, value = amount) with the table INPUT-table (value = tier),
 * to OUTPUT as "AMOUNT|TIER" ("none" without a customer).
 * Prints "FIRST micros" (wall clock) when the first input record is seen; the orchestrator
 * measures everything else from outside.
 */
public final class StreamsPeer {
    private static final AtomicBoolean FIRST = new AtomicBoolean();

    static void first() {
        if (!FIRST.get() && FIRST.compareAndSet(false, true)) {
            long micros = System.currentTimeMillis() * 1000L;
            System.out.println("FIRST " + micros);
            System.out.flush();
        }
    }

    static void sleepMicros(long micros) {
        long deadline = System.nanoTime() + micros * 1000L;
        long left;
        while ((left = deadline - System.nanoTime()) > 0) {
            LockSupport.parkNanos(left);
        }
    }

    static long sleepOf(String v) {
        int sp = v.indexOf(' ');
        return Long.parseLong(sp < 0 ? v : v.substring(0, sp));
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 7) {
            System.err.println("usage: SCENARIO BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR THREADS [GUARANTEE]");
            System.exit(2);
        }
        String scenario = args[0], input = args[3], output = args[4];
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, args[2]);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        p.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[6]));
        // rill commits every 100 ms by default; Kafka Streams' at-least-once default is 30 s,
        // which would also hold back the cached count updates that long.
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // An optional 8th argument: the processing guarantee (at_least_once, exactly_once_v2).
        if (args.length > 7) {
            p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[7]);
        }

        StreamsBuilder b = new StreamsBuilder();
        KStream<String, String> in = b.<String, String>stream(input).peek((k, v) -> first());
        switch (scenario) {
            case "s1" -> in.mapValues(v -> {
                sleepMicros(sleepOf(v));
                return v;
            }).to(output);
            case "s2" -> in.groupByKey().count().toStream()
                    .to(output, Produced.with(Serdes.String(), Serdes.Long()));
            case "s5" -> in.groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(60), Duration.ofSeconds(10)))
                    .count(Materialized.with(Serdes.String(), Serdes.Long()))
                    .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                    .toStream()
                    .map((k, n) -> KeyValue.pair(k.key() + "@" + k.window().start(), n))
                    .to(output, Produced.with(Serdes.String(), Serdes.Long()));
            case "s6" -> {
                KTable<String, String> customers = b.table(input + "-table");
                in.leftJoin(customers, (amount, tier) -> amount + "|" + (tier == null ? "none" : tier))
                        .to(output);
            }
            case "s3", "s4" -> in.filter((k, v) -> !v.contains("omicron"))
                    .mapValues(v -> v.toUpperCase(Locale.ROOT)).to(output);
            default -> {
                System.err.println("unknown scenario " + scenario);
                System.exit(2);
            }
        }
        KafkaStreams streams = new KafkaStreams(b.build(), p);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            System.exit(1);
            return null;
        });
        streams.start();
        done.await();
    }
}
