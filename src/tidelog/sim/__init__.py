"""The deterministic simulator: virtual clock, network, crash-able disks, faults, invariants."""
