"""Local clusters on this machine: a private ZooKeeper and broker processes."""
