"""Log compaction (Kafka's log cleaner): see `log_cleaner`."""
