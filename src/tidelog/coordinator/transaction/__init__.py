"""The transaction coordinator (Kafka's `kafka.coordinator.transaction`): the state machine
(`metadata`), the `__transaction_state` record format (`log`), the owned partitions and their
loading (`state_manager`), the markers sent to partition leaders (`marker_channel`) and the
request logic (`coordinator`)."""
