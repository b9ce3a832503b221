"""Partition logs on disk: segments, indexes, leader-epoch cache, checkpoints, recovery."""
