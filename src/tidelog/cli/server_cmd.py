"""`tidelog server server.properties [--override key=value]...`: run one broker.

Kafka's keys and defaults (`tidelog.broker.config`); a bad file or override is one line on
stderr and exit status 1. SIGTERM / SIGINT shut the broker down gracefully (controlled shutdown
through the controller when enabled, HW checkpoint, clean-shutdown marker, deregistration).
Runs on uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys

import click

__all__ = ["server"]


def _controller_factory() -> object | None:
    """The real controller, when the controller module is present."""
    try:
        from tidelog.controller.controller import KafkaController
    except ImportError:
        return None
    return KafkaController


async def _run(config: object, log: logging.Logger) -> int:
    from tidelog.broker.server import BrokerServer

    factory = _controller_factory()
    server = BrokerServer(config, controller_factory=factory)  # type: ignore[arg-type]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await server.startup()
    except Exception as e:
        log.debug("startup failed", exc_info=True)
        click.echo(f"error: broker startup failed: {' '.join(str(e).split())}", err=True)
        return 1
    click.echo(f"tidelog broker {server.broker_id} started on port {server.port}", err=True)
    await stop.wait()
    log.info("shutting down on signal")
    await server.shutdown()
    return 0


def _unused_keys_epilog() -> str:
    from tidelog.broker.config import CONFIG_DEFS

    unused = [k for k, spec in CONFIG_DEFS.items() if spec.doc.startswith("accepted, unused")]
    only_default = [k for k, spec in CONFIG_DEFS.items()
                    if spec.doc.startswith(("the default only", "delete only", "false only"))]
    return ("\b\nKafka keys accepted but unused by tidelog (DescribeConfigs documents why):\n  "
            + "\n  ".join(unused)
            + "\n\n\b\nKafka keys refused unless they keep tidelog's behaviour (no log "
            "compaction, preallocation or down-conversion):\n  " + "\n  ".join(only_default))


# Net container allocations between two young-generation collections (Python's default: 700).
GC_GEN0_THRESHOLD = 20_000


@click.command("server", epilog=_unused_keys_epilog())
@click.argument("properties", type=click.Path(dir_okay=False))
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one server.properties key (repeatable).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging level of the broker's log on stderr.")
def server(properties: str, overrides: tuple[str, ...], log_level: str) -> None:
    """Run a tidelog broker with a Kafka server.properties file."""
    from tidelog.broker.config import ConfigError, KafkaConfig

    try:
        config = KafkaConfig.from_file(properties, overrides)
        config.zk_connect  # noqa: B018 - a broker cannot start without it: fail now, in one line
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except OSError as e:
        click.echo(f"error: cannot read {properties}: {e.strerror or e}", err=True)
        sys.exit(1)
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log = logging.getLogger("tidelog.server")
    # A broker allocates many short-lived containers per request (request and response
    # objects, futures): with Python's default gen0 threshold (700) the collector ran ~450 times
    # in 15 s at 5,000 produce requests/s, 7% of the brokers' CPU; at 20,000 it ran 4 times,
    # under 1% (a gc.callbacks probe on 3 brokers under bench/cluster.py's load). What is
    # loaded so far (modules, config) is never garbage: frozen out of every collection.
    gc.set_threshold(GC_GEN0_THRESHOLD, 10, 10)
    gc.freeze()
    try:
        import uvloop

        code = uvloop.run(_run(config, log))
    except ImportError:
        code = asyncio.run(_run(config, log))
    sys.exit(code)
