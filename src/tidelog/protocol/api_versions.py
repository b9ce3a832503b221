"""The ApiVersions table tidelog's broker advertises, and the ApiVersions special cases.

Ranges keep the non-flexible versions on purpose: aiokafka and librdkafka's group and admin
paths speak only those (FindCoordinator <= 2, JoinGroup <= 5, SyncGroup <= 3, Heartbeat <= 3,
LeaveGroup <= 1, CreateTopics <= 4). Every API listed here must be implemented by the broker
(``broker/``) for every version in its range; "semantics" comments say what a version adds
that the handler has to honour. Kafka 3.x/4.x clients probe ApiVersions v3/v4 first.
"""

from __future__ import annotations

from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse

__all__ = [
    "BROKER_API_VERSIONS",
    "CONTROLLER_API_VERSIONS",
    "PRODUCE_MIN_ACCEPTED_VERSION",
    "api_versions_response",
    "is_supported",
    "unsupported_api_versions_frame",
    "unsupported_api_versions_response",
]

# Produce is advertised from v0 but v0-2 are refused (KAFKA-18659: librdkafka stops
# compressing when the advertised minimum is 3). As Kafka 4 does, refuse with a Produce
# response whose partitions carry UNSUPPORTED_VERSION rather than by disconnecting: the
# version is in the advertised range, so a disconnect would only confuse the client.
PRODUCE_MIN_ACCEPTED_VERSION = 3

# api key -> (min, max) served to clients. The broker must implement all of these.
BROKER_API_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 9),  # 3+ accepted; v9 flexible
    ApiKey.FETCH: (4, 17),  # v4+: record batch v2 and isolation_level; v7+ fetch sessions
    # (may always answer session_id 0); v9+ current_leader_epoch fencing (KIP-320);
    # v11 rack id; v12 flexible + diverging_epoch; v13+ topic ids (unknown: UNKNOWN_TOPIC_ID);
    # v15+ ReplicaState: a follower's broker epoch reaches the core (KIP-903); v16 node
    # endpoints (none sent); v17 replica directory id (KIP-853, KRaft voters: not used here).
    ApiKey.LIST_OFFSETS: (0, 7),  # v0 old_style_offsets list; v4+ leader epoch; v6 flexible;
    # v7 max timestamp (-3)
    ApiKey.METADATA: (0, 12),  # v1 controller/rack/internal; v4 allow_auto_topic_creation;
    # v7 leader_epoch; v9 flexible; v10+ topic ids (KIP-516)
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 4),  # v2 current_leader_epoch; v3 replica_id
    ApiKey.API_VERSIONS: (0, 4),  # v3 flexible with client software name/version
    ApiKey.CREATE_TOPICS: (0, 7),  # v1 validate_only; v5 flexible + configs in response
    ApiKey.DELETE_TOPICS: (0, 5),  # v4 flexible; v6 (delete by topic id) not served
    ApiKey.DESCRIBE_CONFIGS: (0, 4),  # v1 synonyms; v3 documentation; v4 flexible
    ApiKey.ALTER_CONFIGS: (0, 2),  # topics (broker keys are read-only); v2 flexible
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),  # SET/DELETE/APPEND/SUBTRACT; v1 flexible
    ApiKey.CREATE_PARTITIONS: (0, 3),  # v1 same as v0; v2 flexible; v3 same as v2
    ApiKey.DELETE_RECORDS: (0, 2),  # v2 flexible
    ApiKey.DELETE_GROUPS: (0, 2),  # v2 flexible
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 2),  # v1 election_type (preferred/unclean); v2 flexible
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),  # KIP-455, the controller's
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),  # v1 endpoint_type (brokers only)
    ApiKey.DESCRIBE_LOG_DIRS: (0, 4),  # v2 flexible; v3 top-level error; v4 total/usable bytes
    ApiKey.ALTER_REPLICA_LOG_DIRS: (0, 2),  # JBOD moves between this broker's log dirs; v2 flexible
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),  # each replica's producer state, open transactions too
    ApiKey.INIT_PRODUCER_ID: (0, 4),  # v3 producer id/epoch for bumping; v2 flexible
    ApiKey.FIND_COORDINATOR: (0, 4),  # v1 key_type; v3 flexible; v4 batched coordinator_keys
    # Transactions (broker/txn_apis.py). v2 (v4 for InitProducerId): PRODUCER_FENCED, else
    # INVALID_PRODUCER_EPOCH; v3 flexible. AddPartitionsToTxn v4: KIP-890's batched form the
    # partition leaders send to verify a transactional produce (verify_only); v5
    # (TRANSACTION_ABORTABLE, KIP-890 part 2) is not served.
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 4),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 3),
    ApiKey.WRITE_TXN_MARKERS: (0, 1),  # the coordinator's, to partition leaders
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),  # v2 leader epoch; v3 member/generation (KIP-447)
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),  # v1 duration filter
    ApiKey.JOIN_GROUP: (0, 7),  # v4 MEMBER_ID_REQUIRED round trip; v5 group_instance_id;
    # v6 flexible; v7 protocol_type/name in the response
    ApiKey.SYNC_GROUP: (0, 5),  # v3 group_instance_id; v4 flexible; v5 protocol_type/name
    ApiKey.HEARTBEAT: (0, 4),  # v3 group_instance_id; v4 flexible
    ApiKey.LEAVE_GROUP: (0, 4),  # v3 batch members; v4 flexible
    ApiKey.OFFSET_COMMIT: (0, 8),  # v1 generation/member; v2-4 retention_time_ms; v6 leader
    # epoch; v7 group_instance_id; v8 flexible
    ApiKey.OFFSET_FETCH: (0, 7),  # v2 all partitions (null topics); v5 leader epoch;
    # v6 flexible; v7 require_stable. v8 (several groups per request) not served.
    ApiKey.LIST_GROUPS: (0, 4),  # v3 flexible; v4 states filter
    ApiKey.DESCRIBE_GROUPS: (0, 5),  # v3 authorized operations; v4 group_instance_id; v5 flexible
    # No authorizer: each answered SECURITY_DISABLED, as Kafka without one. v2 flexible.
    ApiKey.DESCRIBE_ACLS: (0, 3),
    ApiKey.CREATE_ACLS: (0, 3),
    ApiKey.DELETE_ACLS: (0, 3),
}

# The inter-broker and controller channel (tidelog <-> tidelog): every schema version.
# AlterPartition (KIP-497, v0-3 as Kafka 3.9's ZooKeeper-mode controller serves it): a leader's
# ISR changes go to the controller, which writes them (v2+ topic ids, v3 members' broker epochs).
CONTROLLER_API_VERSIONS: dict[int, tuple[int, int]] = {
    key: (api_spec(key).min_version, api_spec(key).max_version)
    for key in (
        ApiKey.LEADER_AND_ISR,
        ApiKey.STOP_REPLICA,
        ApiKey.UPDATE_METADATA,
        ApiKey.CONTROLLED_SHUTDOWN,
        ApiKey.ALTER_PARTITION,
    )
}


def _check_tables() -> None:
    for table in (BROKER_API_VERSIONS, CONTROLLER_API_VERSIONS):
        for key, (lo, hi) in table.items():
            spec = api_spec(key)
            if not spec.min_version <= lo <= hi <= spec.max_version:
                raise AssertionError(f"{spec.name} {lo}-{hi} outside the schema's range")


_check_tables()


def advertised(include_controller_apis: bool = True) -> dict[int, tuple[int, int]]:
    table = dict(BROKER_API_VERSIONS)
    if include_controller_apis:
        table.update(CONTROLLER_API_VERSIONS)
    return dict(sorted(table.items()))


def is_supported(api_key: int, api_version: int, include_controller_apis: bool = True) -> bool:
    """Whether the broker serves this API version (Produce v0-2 is advertised, not served)."""
    rng = advertised(include_controller_apis).get(api_key)
    if rng is None or not rng[0] <= api_version <= rng[1]:
        return False
    return not (api_key == ApiKey.PRODUCE and api_version < PRODUCE_MIN_ACCEPTED_VERSION)


def api_versions_response(
    include_controller_apis: bool = True, throttle_time_ms: int = 0
) -> ApiVersionsResponse:
    """The successful ApiVersions answer (encode it at the version the client asked for)."""
    return ApiVersionsResponse(
        error_code=ErrorCode.NONE,
        api_keys=[
            ApiVersion(key, lo, hi) for key, (lo, hi) in advertised(include_controller_apis).items()
        ],
        throttle_time_ms=throttle_time_ms,
    )


def unsupported_api_versions_response() -> ApiVersionsResponse:
    """Kafka's answer to an ApiVersions version it does not know: UNSUPPORTED_VERSION in a
    v0 body whose only entry is ApiVersions' own range, so the client can retry lower."""
    lo, hi = BROKER_API_VERSIONS[ApiKey.API_VERSIONS]
    return ApiVersionsResponse(
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        api_keys=[ApiVersion(ApiKey.API_VERSIONS, lo, hi)],
    )


def unsupported_api_versions_frame(correlation_id: int) -> list[bytes | memoryview]:
    """The framed answer to an ApiVersions request whose version is unknown (see
    ``codec.UnsupportedVersionError``): response header v0 and a v0 body, as Kafka sends."""
    from tidelog.protocol.codec import encode_response

    return encode_response(0, correlation_id, unsupported_api_versions_response(), 0)
