"""Partition logs on disk: segments, indexes, leader-epoch cache, checkpoints, recovery.

Public API (see each module): `Log`, `LogAppendInfo`, `FetchDataInfo` (log.py), `LogConfig`
(log_config.py), `LeaderEpochFileCache` (epoch_cache.py), `LogManager` (log_manager.py),
`FileIO`/`FileHandle`/`OsFileIO`/`FileSlice` (file_io.py), checkpoint files (checkpoint.py) and
the errors (errors.py).
"""
