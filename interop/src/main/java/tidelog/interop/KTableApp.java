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
 * A Kafka Streams application whose state lives in a compacted topic: a KTable counting the
 * records of each key of INPUT (written to OUTPUT too), kept in the store "counts" whose
 * changelog, APP_ID-counts-changelog, Streams creates with cleanup.policy=compact. The changelog
 * gets small segments (1 KiB; the producer's batches stay below) and a low dirty ratio so that
 * the broker's cleaner compacts it soon.
 *
 * Usage: KTableApp BOOTSTRAP_SERVERS APP_ID INPUT OUTPUT STATE_DIR EXPECTED_TOTAL [GUARANTEE]
 *
 * GUARANTEE is processing.guarantee, at_least_once unless given; with exactly_once_v2 every
 * update of a count and the input offsets are committed in one transaction (issue 17), so that
 * OUTPUT read with read_committed holds for each key the counts 1..n once each.
 *
 * It runs until the counts add up to EXPECTED_TOTAL (every input record counted), or, started
 * again with an empty STATE_DIR after the input was consumed, until the table has been restored
 * from the changelog to that total; then prints the table, one "key=count" line per key, sorted,
 * and closes. Exit status 1 if the total is not reached within two minutes.
 */
public final class KTableApp {
    private KTableApp() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String appId = args[1];
        String input = args[2];
        String output = args[3];
        String stateDir = args[4];
        long expectedTotal = Long.parseLong(args[5]);
        String guarantee = args.length > 6 ? args[6] : StreamsConfig.AT_LEAST_ONCE;

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
                .withLoggingEnabled(Map.of(
                    "segment.bytes", "1024",
                    "min.cleanable.dirty.ratio", "0.01")))
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 3);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        // No record cache: every update of a count goes to the changelog (many per key).
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // A batch larger than the changelog's segment.bytes is refused (RecordBatchTooLarge).
        p.put(StreamsConfig.producerPrefix("batch.size"), 512);

        try (KafkaStreams streams = new KafkaStreams(builder.build(), p)) {
            streams.start();
            long deadline = System.nanoTime() + Duration.ofMinutes(2).toNanos();
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
