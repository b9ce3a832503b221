"""The controller: election through ZooKeeper, leader election, LeaderAndIsr/UpdateMetadata/StopReplica."""
