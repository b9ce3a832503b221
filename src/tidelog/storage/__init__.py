"""Partition logs on disk: segments, indexes, leader-epoch cache, checkpoints, recovery.

Modules (one concept each):
- `file_io`: `FileIO` / `FileHandle` (the only I/O the log does), `OsFileIO`, `FileSlice`,
  `write_file_atomically`. The simulator's crash-able `MemoryFileIO` is in `tidelog.sim.disk`.
- `log_config`: `LogConfig` (Kafka's topic keys, `LogConfig.from_dict({...})`).
- `index`: `OffsetIndex` (`.index`, 8-byte entries), `TimeIndex` (`.timeindex`, 12-byte).
- `segment`: `LogSegment` (`<20-digit base offset>.log` + its indexes; recovery of one segment).
- `log`: `Log` (leader/follower append, read, roll, truncation, retention, flush, recovery),
  `LogAppendInfo`, `FetchDataInfo`.
- `epoch_cache`: `LeaderEpochFileCache` (`leader-epoch-checkpoint`, KIP-101/279 end offsets).
- `checkpoint`: Kafka's checkpoint text files (`OffsetCheckpointFile` for HW, recovery point,
  log start offset).
- `log_manager`: `LogManager` (log.dirs, `<topic>-<partition>` dirs, clean-shutdown marker).
- `errors`: `OffsetOutOfRangeError`, `RecordTooLargeError`, `InvalidOffsetError`,
  `KafkaStorageError`, `CorruptIndexError` (and `CorruptRecordError` from protocol.records),
  each with its Kafka `error_code`.

Nothing here reads a clock: time-dependent calls take `now_ms`. Not thread-safe: one caller
(the broker's event loop or the simulator) drives a log.
"""
