"""tidelog's own asyncio Kafka client (fetchers, controller channel, CLI, Spark)."""
