"""The consumer group coordinator (Kafka 2.x, classic protocol): `group` is the pure state
machine, `offsets` the `__consumer_offsets` record formats and partition loading,
`group_coordinator` the asyncio shell the broker's `group_apis` call."""
