package tidelog.interop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's own Java clients (kafka-clients 3.9) driven through fixed scenarios; each prints what
 * a client observes as "key: value" lines, free of anything that differs between two correct
 * clusters (broker ids, ids, times), so that tests/compat can compare Apache Kafka and tidelog.
 *
 * Usage: Harness (admin|clients) BOOTSTRAP_SERVERS
 */
public final class Harness {
    private Harness() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[1];
        switch (args[0]) {
            case "admin": admin(bootstrap); break;
            case "clients": clients(bootstrap); break;
            case "transactions": transactions(bootstrap); break;
            default: throw new IllegalArgumentException("unknown scenario " + args[0]);
        }
    }

    private static void out(String key, Object value) {
        System.out.println(key + ": " + value);
    }

    /** The outcome of a future: "ok" or the simple name of the exception it failed with. */
    private static String outcome(KafkaFuture<?> future) throws InterruptedException {
        try {
            future.get(60, TimeUnit.SECONDS);
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        } catch (java.util.concurrent.TimeoutException e) {
            return "timed out";
        }
    }

    private static Admin newAdmin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(p);
    }

    private static void admin(String bootstrap) throws Exception {
        try (Admin admin = newAdmin(bootstrap)) {
            out("create", outcome(admin.createTopics(List.of(new NewTopic("java-t", 3, (short) 3))).all()));
            out("create again", outcome(admin.createTopics(List.of(new NewTopic("java-t", 1, (short) 1))).all()));
            out("create rf 4", outcome(admin.createTopics(List.of(new NewTopic("java-rf", 1, (short) 4))).all()));
            out("create bad config", outcome(admin.createTopics(List.of(new NewTopic("java-cfg", 1, (short) 1)
                .configs(Map.of("cleanup.policy", "sideways")))).all()));
            out("create bad name", outcome(admin.createTopics(List.of(new NewTopic("bad name", 1, (short) 1))).all()));
            TopicDescription d = null;
            for (int i = 0; i < 100 && d == null; i++) {
                try {
                    d = admin.describeTopics(List.of("java-t")).allTopicNames().get().get("java-t");
                    if (d.partitions().stream().anyMatch(p -> p.leader() == null || p.isr().size() < 3)) {
                        d = null;
                    }
                } catch (ExecutionException e) {
                    d = null;
                }
                if (d == null) {
                    Thread.sleep(200);
                }
            }
            out("describe partitions", d.partitions().size());
            out("describe replicas", d.partitions().stream().map(p -> p.replicas().size()).toList());
            out("describe isr", d.partitions().stream().map(p -> p.isr().size()).toList());
            out("describe topic id set", !Uuid.ZERO_UUID.equals(d.topicId()));
            out("describe internal", d.isInternal());
            out("describe unknown", outcome(admin.describeTopics(List.of("java-none")).allTopicNames()));
            out("listed", admin.listTopics().names().get().contains("java-t"));
            out("cluster nodes", admin.describeCluster().nodes().get().size());
            out("cluster controller known", admin.describeCluster().controller().get() != null);
            out("delete", outcome(admin.deleteTopics(List.of("java-t")).all()));
            out("delete unknown", outcome(admin.deleteTopics(List.of("java-none")).all()));
        }
    }

    private static void clients(String bootstrap) throws Exception {
        try (Admin admin = newAdmin(bootstrap)) {
            out("create", outcome(admin.createTopics(List.of(new NewTopic("java-c", 2, (short) 3))).all()));
        }
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.ACKS_CONFIG, "all");  // and idempotence, the Java producer's default
        List<String> acked = new ArrayList<>();
        // Explicit CreateTimes a minute back, printed relative to that base: well inside the
        // default retention.ms (7 days). Times in 1970 breach it, and Kafka's first retention
        // check (30 s after startup) deletes the whole log: the consumer then finds nothing,
        // or everything, depending on when that check runs.
        long timestampBase = System.currentTimeMillis() - 60_000;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            for (int i = 0; i < 10; i++) {
                RecordMetadata m = producer.send(new ProducerRecord<>("java-c", i % 2, timestampBase + i, "k" + i, "v" + i))
                    .get(60, TimeUnit.SECONDS);
                acked.add(m.partition() + "@" + m.offset() + " t=+" + (m.timestamp() - timestampBase));
            }
        }
        out("acked", acked);
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, "java-g");
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Map<String, String> seen = new TreeMap<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            consumer.subscribe(List.of("java-c"));
            long deadline = System.currentTimeMillis() + 60_000;
            while (seen.size() < 10 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    seen.put(r.partition() + "@" + r.offset(), r.key() + "=" + r.value() + " t=+" + (r.timestamp() - timestampBase));
                }
            }
            out("consumed", seen);
            out("assignment", new TreeMap<>(Map.of("partitions", consumer.assignment().size())));
            consumer.commitSync();
            Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(
                Set2.of(new TopicPartition("java-c", 0), new TopicPartition("java-c", 1)));
            Map<String, Long> c = new TreeMap<>();
            committed.forEach((tp, om) -> c.put(tp.toString(), om == null ? null : om.offset()));
            out("committed", c);
        }
        try (Admin admin = newAdmin(bootstrap)) {
            ConsumerGroupDescription g = admin.describeConsumerGroups(List.of("java-g"))
                .describedGroups().get("java-g").get();
            out("group state after close", g.state());
            out("group members after close", g.members().size());
            Map<String, Long> offsets = new TreeMap<>();
            admin.listConsumerGroupOffsets("java-g").partitionsToOffsetAndMetadata().get()
                .forEach((tp, om) -> offsets.put(tp.toString(), om.offset()));
            out("group offsets", offsets);
        }
    }

    private static Properties txnProducerProps(String bootstrap, String transactionalId) {
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        return pp;
    }

    private static Map<String, String> readAll(String bootstrap, String topic, String isolation) {
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Map<String, String> seen = new TreeMap<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            List<TopicPartition> tps = List.of(new TopicPartition(topic, 0), new TopicPartition(topic, 1));
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps);  // the LSO for read_committed
            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline
                   && tps.stream().anyMatch(tp -> consumer.position(tp) < end.get(tp))) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    seen.put(r.partition() + "@" + r.offset(), r.value());
                }
            }
        }
        return seen;
    }

    /** A consume-transform-produce loop with exactly-once: input read by a group consumer,
     * output and the input offsets committed in one transaction (sendOffsetsToTransaction with
     * the group's metadata, KIP-447), one transaction aborted, a zombie fenced, and what
     * read_committed and read_uncommitted consumers then read; Admin's view of the ids. */
    private static void transactions(String bootstrap) throws Exception {
        try (Admin admin = newAdmin(bootstrap)) {
            out("create", outcome(admin.createTopics(List.of(new NewTopic("java-tx-in", 2, (short) 3),
                new NewTopic("java-tx-out", 2, (short) 3))).all()));
        }
        Properties plain = new Properties();
        plain.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        plain.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        plain.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(plain)) {
            for (int i = 0; i < 6; i++) {
                producer.send(new ProducerRecord<>("java-tx-in", i % 2, "k" + i, "in" + i)).get(60, TimeUnit.SECONDS);
            }
        }
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, "java-tx-g");
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        KafkaProducer<String, String> producer = new KafkaProducer<>(txnProducerProps(bootstrap, "java-tx-1"));
        producer.initTransactions();
        out("init", "ok");
        int transformed = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            consumer.subscribe(List.of("java-tx-in"));
            long deadline = System.currentTimeMillis() + 60_000;
            while (transformed < 6 && System.currentTimeMillis() < deadline) {
                var records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) continue;
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> next = new java.util.HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    producer.send(new ProducerRecord<>("java-tx-out", r.partition(), r.key(), r.value().toUpperCase()));
                    next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    transformed++;
                }
                producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                producer.commitTransaction();
            }
        }
        out("transformed", transformed);
        producer.beginTransaction();
        producer.send(new ProducerRecord<>("java-tx-out", 0, "x", "ABORTED")).get(60, TimeUnit.SECONDS);
        producer.abortTransaction();
        out("aborted", "ok");
        // A second instance with the same transactional.id fences the first.
        KafkaProducer<String, String> newer = new KafkaProducer<>(txnProducerProps(bootstrap, "java-tx-1"));
        newer.initTransactions();
        try {
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("java-tx-out", 1, "z", "ZOMBIE")).get(60, TimeUnit.SECONDS);
            producer.commitTransaction();
            out("zombie", "committed");
        } catch (Exception e) {
            Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
            out("zombie", cause.getClass().getSimpleName());
        } finally {
            producer.close(Duration.ofSeconds(10));
        }
        newer.beginTransaction();
        newer.send(new ProducerRecord<>("java-tx-out", 1, "n", "NEWER")).get(60, TimeUnit.SECONDS);
        newer.commitTransaction();
        out("newer", "committed");
        try (Admin admin = newAdmin(bootstrap)) {
            // The markers go out after the commit is answered: wait for their completion.
            var d = admin.describeTransactions(List.of("java-tx-1")).all().get().get("java-tx-1");
            for (long until = System.currentTimeMillis() + 30_000;
                 !d.state().toString().equals("CompleteCommit") && System.currentTimeMillis() < until;
                 Thread.sleep(50)) {
                d = admin.describeTransactions(List.of("java-tx-1")).all().get().get("java-tx-1");
            }
            out("describe", d.state() + " timeout=" + d.transactionTimeoutMs() + " partitions=" + d.topicPartitions().size());
            out("listed", admin.listTransactions().all().get().stream()
                .filter(l -> l.transactionalId().equals("java-tx-1")).map(l -> l.state().toString()).toList());
            Map<String, Long> offsets = new TreeMap<>();
            admin.listConsumerGroupOffsets("java-tx-g").partitionsToOffsetAndMetadata().get()
                .forEach((tp, om) -> offsets.put(tp.toString(), om.offset()));
            out("group offsets", offsets);
        }
        newer.close(Duration.ofSeconds(10));
        out("read_committed", readAll(bootstrap, "java-tx-out", "read_committed"));
        out("read_uncommitted", readAll(bootstrap, "java-tx-out", "read_uncommitted"));
    }

    /** Set.of with a stable iteration order, for printing. */
    private static final class Set2 {
        static java.util.Set<TopicPartition> of(TopicPartition... tps) {
            return new java.util.LinkedHashSet<>(List.of(tps));
        }
    }
}
