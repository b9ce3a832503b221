"""`tidelog configs describe|alter --bootstrap-server B (--topic T | --broker ID |
--broker-defaults)` (Kafka's kafka-configs): DescribeConfigs with each entry's source and
synonyms; IncrementalAlterConfigs with `--add-config k1=v1,k2=[a,b]` (SET) and `--delete-config
k1,k2` (DELETE), `--validate-only`. Broker resources take the dynamic log defaults
(`tidelog.broker.dynamic_config`), per broker or cluster-wide.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
OP_SET, OP_DELETE = 0, 1
# DescribeConfigsResponse config_source values, as kafka-configs prints them.
SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
           3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
           6: "DYNAMIC_BROKER_LOGGER_CONFIG"}


def _err(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(1)


def parse_add_config(text: str) -> dict[str, str]:
    """kafka-configs' syntax: `k1=v1,k2=[a,b]` (square brackets keep a list's commas)."""
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            raise click.BadParameter(f"{text[i:]!r} is not of the form key=value")
        key = text[i:eq].strip()
        j = eq + 1
        if j < n and text[j] == "[":
            close = text.find("]", j)
            if close < 0:
                raise click.BadParameter(f"unclosed [ in the value of {key}")
            value, i = text[j + 1:close], close + 1
            if i < n and text[i] != ",":
                raise click.BadParameter(f"expected , after the value of {key}")
            i += 1
        else:
            comma = text.find(",", j)
            value, i = (text[j:], n) if comma < 0 else (text[j:comma], comma + 1)
        if not key:
            raise click.BadParameter(f"an empty key in {text!r}")
        out[key] = value
    return out


def _resource(topic: str | None, broker: int | None, defaults: bool) -> tuple[int, str]:
    if [topic is not None, broker is not None, defaults].count(True) != 1:
        _err("name exactly one of --topic, --broker and --broker-defaults")
    if topic is not None:
        return RESOURCE_TOPIC, topic
    return RESOURCE_BROKER, "" if defaults else str(broker)


async def _send(bootstrap: str, request: Any, broker: int | None) -> Any:
    """To `broker`, else to the first broker that answers (any broker serves topic configs)."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.errors import KafkaConnectionError

    async with KafkaClient(bootstrap, retries=2) as client:
        meta = await client.refresh_metadata([])
        targets = [broker] if broker is not None else sorted(meta.brokers)
        for target in targets[:-1]:
            try:
                return await client.send(target, request)
            except KafkaConnectionError:
                continue  # down, and not yet out of the metadata
        return await client.send(targets[-1], request)


def _run(coro: Any) -> Any:
    from tidelog.client.errors import KafkaClientError

    try:
        return asyncio.run(coro)
    except KafkaClientError as e:
        _err(str(e))


def _error_name(code: int) -> str:
    from tidelog.protocol.errors import ErrorCode

    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


@click.group()
def configs() -> None:
    """Describe and change topic and broker configs (Kafka's kafka-configs)."""


@configs.command()
@click.option("--bootstrap-server", "bootstrap", required=True, envvar="TIDELOG_BOOTSTRAP_SERVERS")
@click.option("--topic", default=None)
@click.option("--broker", type=int, default=None)
@click.option("--broker-defaults", "defaults", is_flag=True,
              help="The cluster-wide dynamic broker defaults (kafka-configs --entity-default).")
@click.option("--all", "show_all", is_flag=True, help="Every config, not only the overrides.")
def describe(bootstrap: str, topic: str | None, broker: int | None, defaults: bool,
             show_all: bool) -> None:
    """A topic's (or broker's) configs with their sources."""
    from tidelog.protocol.messages import describe_configs as m_dc

    rtype, name = _resource(topic, broker, defaults)
    request = m_dc.DescribeConfigsRequest(include_synonyms=True, resources=[
        m_dc.DescribeConfigsResource(rtype, name, None)])
    [result] = _run(_send(bootstrap, request, broker)).results
    if result.error_code:
        _err(f"{_error_name(result.error_code)}: {result.error_message or name}")
    dynamic = (1, 2, 3)
    entries = [c for c in result.configs if show_all or c.config_source in dynamic]
    if rtype == RESOURCE_BROKER and not name:
        click.echo("Default configs for brokers in the cluster are:")
    else:
        kind = "topic" if rtype == RESOURCE_TOPIC else "broker"
        click.echo(f"{'All' if show_all else 'Dynamic'} configs for {kind} {name} are:")
    for c in sorted(entries, key=lambda c: c.name):
        value = "null" if c.value is None else c.value
        synonyms = ", ".join(f"{SOURCES.get(s.source, s.source)}:{s.name}={s.value}"
                             for s in c.synonyms)
        click.echo(f"  {c.name}={value} sensitive={str(c.is_sensitive).lower()} "
                   f"synonyms={{{synonyms}}}")


@configs.command()
@click.option("--bootstrap-server", "bootstrap", required=True, envvar="TIDELOG_BOOTSTRAP_SERVERS")
@click.option("--topic", default=None)
@click.option("--broker", type=int, default=None)
@click.option("--broker-defaults", "defaults", is_flag=True,
              help="The cluster-wide dynamic broker defaults (kafka-configs --entity-default).")
@click.option("--add-config", "add", default="", metavar="K1=V1,K2=[A,B]",
              help="Set these configs.")
@click.option("--delete-config", "delete", default="", metavar="K1,K2",
              help="Remove these overrides.")
@click.option("--validate-only", is_flag=True, help="Check the change, apply nothing.")
def alter(bootstrap: str, topic: str | None, broker: int | None, defaults: bool, add: str,
          delete: str, validate_only: bool) -> None:
    """Change configs (IncrementalAlterConfigs): applied by every broker without a restart."""
    from tidelog.protocol.messages import incremental_alter_configs as m_iac

    rtype, name = _resource(topic, broker, defaults)
    sets = parse_add_config(add) if add else {}
    deletes = [k.strip() for k in delete.split(",") if k.strip()]
    if not sets and not deletes:
        _err("nothing to change: give --add-config and/or --delete-config")
    ops = [m_iac.AlterableConfig(k, OP_SET, v) for k, v in sets.items()]
    ops += [m_iac.AlterableConfig(k, OP_DELETE, None) for k in deletes]
    request = m_iac.IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[
        m_iac.AlterConfigsResource(rtype, name, ops)])
    [result] = _run(_send(bootstrap, request, broker)).responses
    if result.error_code:
        _err(f"{_error_name(result.error_code)}: {result.error_message or name}")
    if rtype == RESOURCE_TOPIC:
        what = f"topic {name}"
    else:
        what = f"broker {name}" if name else "default brokers"
    click.echo(f"{'Validated' if validate_only else 'Completed updating'} config for {what}.")
