"""Kafka's wire format: framing, generated message codecs, record batches, error codes."""
