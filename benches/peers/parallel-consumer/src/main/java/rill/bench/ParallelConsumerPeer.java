package rill.bench;

import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.locks.LockSupport;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Confluent Parallel Consumer side of rill's S1 benchmark (I/O-bound): KEY ordering, each value
 * starts with a sleep in microseconds (a remote call stand-in); sleep, then produce the record to
 * OUTPUT.
 *
 * <pre>java -jar parallel-consumer-peer.jar BOOTSTRAP GROUP INPUT OUTPUT MAX_CONCURRENCY</pre>
 *
 * Prints "FIRST micros" (wall clock) when the first input record is processed.
 */
public final class ParallelConsumerPeer {
    private static final AtomicBoolean FIRST = new AtomicBoolean();

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
        if (args.length < 5) {
            System.err.println("usage: BOOTSTRAP GROUP INPUT OUTPUT MAX_CONCURRENCY [KEY|UNORDERED|PARTITION]");
            System.exit(2);
        }
        String bootstrap = args[0], output = args[3];
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, args[1]);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        Properties pr = new Properties();
        pr.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pr.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        pr.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);

        ParallelConsumerOptions<String, String> options = ParallelConsumerOptions.<String, String>builder()
                .ordering(ProcessingOrder.valueOf(args.length > 5 ? args[5] : "KEY"))
                .maxConcurrency(Integer.parseInt(args[4]))
                .consumer(new KafkaConsumer<>(c))
                .producer(new KafkaProducer<>(pr))
                .build();
        ParallelStreamProcessor<String, String> pc = ParallelStreamProcessor.createEosStreamProcessor(options);
        pc.subscribe(List.of(args[2]));
        pc.pollAndProduce(ctx -> {
            ConsumerRecord<String, String> r = ctx.getSingleConsumerRecord();
            if (!FIRST.get() && FIRST.compareAndSet(false, true)) {
                System.out.println("FIRST " + System.currentTimeMillis() * 1000L);
                System.out.flush();
            }
            sleepMicros(sleepOf(r.value()));
            return new ProducerRecord<>(output, r.key(), r.value());
        });
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            pc.close();
            done.countDown();
        }));
        done.await();
    }
}
