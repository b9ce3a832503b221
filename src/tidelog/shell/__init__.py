"""The shell around the pure replication core, shared by both drivers.

`replication/` decides; this package performs and schedules, exactly once for the broker that
ships and for the simulator: Kafka's `ReplicaManager` shell (`replica_manager.py`: delayed
operations completed and expired, ISR writes through an `AlterPartitionManager`, the
`isr-expiration`, `isr-change-propagation` and `highwatermark-checkpoint` tasks, the KIP-380
broker-epoch rule applied to controller requests, and the log manager's tasks of `log_tasks.py`:
retention, flusher, recovery-point checkpoint, producer-id expiration) and one
`ReplicaFetcherManager`
(`fetcher_manager.py`: one `ReplicaFetcher` per (source broker, fetcher id), each talking to its
leader through a `LeaderEndPoint`).

A driver supplies only what `interfaces.py` names: a `Time`, a `Scheduler`, an
`AlterPartitionManager` (ZooKeeper) and a `LeaderEndPoint` factory (the transport). The asyncio
broker (`broker/`) and the simulator (`sim/`) both import this package and never each other.
"""
