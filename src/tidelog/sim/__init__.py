"""The deterministic simulator: virtual clock, network, crash-able disks, faults, invariants.

Whole clusters of the real replication core and storage engine run here under one seed:
`runner.run_seed(seed, steps)` for random runs, `scenarios.run_scenario(name, naive=False)` for
the historic bugs of correctness.md, `cluster.SimCluster(SimConfig(...))` to script one by hand.
See docs/simulator.md.
"""
