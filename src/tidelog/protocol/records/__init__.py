"""Kafka RecordBatch v2 (magic 2): zero-copy header view, builder, compression."""
