"""Test support that runs real outside software next to tidelog (Apache Kafka's reference cluster)."""
