"""The ACL APIs (DescribeAcls, CreateAcls, DeleteAcls) of a cluster without an authorizer: Kafka
3.9 advertises them and answers every one with SECURITY_DISABLED and its message; tidelog, which
has no authorizer either, must advertise the same versions and answer the same."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from differential import Pair, Target, error_name, raw

from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import create_acls as m_create
from tidelog.protocol.messages import delete_acls as m_delete
from tidelog.protocol.messages import describe_acls as m_describe
from tidelog.protocol.messages.api_versions import ApiVersionsRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ACL_APIS = (ApiKey.DESCRIBE_ACLS, ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS)
TOPIC_READ = dict(resource_type=2, resource_name="t", operation=3, permission_type=3)  # ALLOW READ


def _first(t: Target) -> str:
    return t.bootstrap.split(",")[0]


def test_acl_apis_are_advertised_with_kafkas_versions(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        r = raw(_first(t), ApiVersionsRequest(client_software_name="compat",
                                               client_software_version="1"), 3)
        return {k.api_key: (k.min_version, k.max_version) for k in r.api_keys
                if k.api_key in ACL_APIS}

    assert len(pair.same(scenario)) == 3


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_acl_requests_are_refused_with_security_disabled(pair: Pair, version: int) -> None:
    pattern = 3  # LITERAL: the only pattern type v0 carries

    def scenario(t: Target) -> object:
        describe = raw(_first(t), m_describe.DescribeAclsRequest(
            resource_type_filter=2, resource_name_filter=None, pattern_type_filter=pattern,
            principal_filter=None, host_filter=None, operation=1, permission_type=1), version)
        create = raw(_first(t), m_create.CreateAclsRequest(creations=[
            m_create.AclCreation(resource_pattern_type=pattern, principal="User:alice",
                                 host="*", **TOPIC_READ),
            m_create.AclCreation(resource_pattern_type=pattern, principal="User:bob",
                                 host="*", **TOPIC_READ)]), version)
        delete = raw(_first(t), m_delete.DeleteAclsRequest(filters=[
            m_delete.DeleteAclsFilter(resource_type_filter=1, resource_name_filter=None,
                                      pattern_type_filter=pattern, principal_filter=None,
                                      host_filter=None, operation=1, permission_type=1)]),
                     version)
        return {
            "describe": (ErrorCode(describe.error_code).name, describe.error_message,
                         describe.resources),
            "create": [(ErrorCode(c.error_code).name, c.error_message) for c in create.results],
            "delete": [(ErrorCode(f.error_code).name, f.error_message, f.matching_acls)
                       for f in delete.filter_results],
        }

    got = pair.same(scenario)
    assert got["describe"][0] == "SECURITY_DISABLED"
    assert [e for e, _ in got["create"]] == ["SECURITY_DISABLED"] * 2


def test_admin_client_acl_calls(pair: Pair) -> None:
    """What an application sees through librdkafka's AdminClient."""
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)

    def outcome(f: Any) -> object:
        try:
            return ("ok", f.result(timeout=30))
        except Exception as e:  # noqa: BLE001 - the error's name is what is compared
            return error_name(e)

    def scenario(t: Target) -> object:
        admin = t.admin()
        return {
            "describe": outcome(admin.describe_acls(everything, request_timeout=30)),
            "create": outcome(admin.create_acls([binding], request_timeout=30)[binding]),
            "delete": outcome(admin.delete_acls([everything], request_timeout=30)[everything]),
        }

    # librdkafka drops DescribeAcls' top-level error: an empty list on both.
    assert pair.same(scenario) == {"describe": ("ok", []), "create": "SECURITY_DISABLED",
                                   "delete": "SECURITY_DISABLED"}
