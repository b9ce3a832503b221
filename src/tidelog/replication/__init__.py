"""The pure replication core: Replica, Partition (ISR, HW, leader epoch), fetch states, election, purgatory.

Nothing here imports asyncio, socket, kazoo, time or random: the shell passes now_ms and inputs in,
and gets decisions out.
"""
