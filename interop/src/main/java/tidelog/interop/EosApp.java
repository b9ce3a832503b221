package tidelog.interop;

import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * A Kafka Streams application with processing.guarantee=exactly_once_v2 (issue 17 item 4):
 * counts the records of each key of INPUT and writes every new count to OUTPUT (no record
 * cache: one output record per input record), its state store and the output committed in one
 * transaction with the input offsets.
 *
 * Usage: EosApp BOOTSTRAP_SERVERS APP_ID INPUT OUTPUT STATE_DIR EXPECTED_TOTAL
 *
 * Runs until the counts add up to EXPECTED_TOTAL, then prints the table, one "key=count" line
 * per key, sorted, and closes. Exit status 1 if the total is not reached within four minutes.
 * With exactly-once, OUTPUT read with read_committed holds for each key the counts 1..n once
 * each, whatever failed on the way (a broker killed, a task retried).
 */
public final class EosApp {
    private EosApp() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String appId = args[1];
        String input = args[2];
        String output = args[3];
        String stateDir = args[4];
        long expectedTotal = Long.parseLong(args[5]);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts"))
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 3);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        p.put(StreamsConfig.producerPrefix("transaction.timeout.ms"), 30000);

        try (KafkaStreams streams = new KafkaStreams(builder.build(), p)) {
            streams.start();
            long deadline = System.nanoTime() + Duration.ofMinutes(4).toNanos();
            Map<String, Long> table = new TreeMap<>();
            while (true) {
                table.clear();
                if (streams.state() == KafkaStreams.State.RUNNING) {
                    try {
                        ReadOnlyKeyValueStore<String, Long> store = streams.store(
                            StoreQueryParameters.fromNameAndType("counts", QueryableStoreTypes.keyValueStore()));
                        try (KeyValueIterator<String, Long> it = store.all()) {
                            while (it.hasNext()) {
                                KeyValue<String, Long> kv = it.next();
                                table.put(kv.key, kv.value);
                            }
                        }
                    } catch (org.apache.kafka.streams.errors.InvalidStateStoreException e) {
                        // migrating or restoring: ask again
                    }
                }
                long total = table.values().stream().mapToLong(Long::longValue).sum();
                if (total == expectedTotal) {
                    break;
                }
                if (System.nanoTime() > deadline || streams.state() == KafkaStreams.State.ERROR) {
                    System.err.println("state " + streams.state() + ", total " + total + " of " + expectedTotal);
                    System.exit(1);
                }
                Thread.sleep(200);
            }
            streams.close(Duration.ofSeconds(30));
            for (Map.Entry<String, Long> e : table.entrySet()) {
                System.out.println(e.getKey() + "=" + e.getValue());
            }
        }
    }
}
