"""The tidelog command: server, local cluster, topics, produce/consume, sim, bench."""
