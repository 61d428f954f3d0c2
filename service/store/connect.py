"""The one place Redis clients are made: a single server or a Redis Cluster."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Final, cast

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from .cancel_safe import cancel_safe_class, make_cluster_cancel_safe
from .wire import WiredBlockingPool, WiredPool

# URL schemes that name one node of a Redis Cluster (redis_url).
CLUSTER_SCHEMES: Final = ("redis+cluster://", "rediss+cluster://")
# What a store call raises when Redis cannot answer. The cluster client adds
# RedisClusterException (no node answered, a slot without a master during a
# failover), which is not a RedisError.
STORE_ERRORS: Final = (RedisError, RedisClusterException, OSError)
# How long start-up waits to reach Redis before serving anyway.
WARM_SECONDS: Final = 2.0
_LOGGER: Final = logging.getLogger(__name__)
# Connections per cluster node; the cluster client has no blocking pool.
CLUSTER_CONNECTIONS: Final = 1024
# redis-py 8 caps a pool at 100 and then raises at once: a burst of 100
# concurrent requests plus a subscriber would answer 503s. One process may open
# this many (Redis accepts 10,000 clients by default).
SERVER_CONNECTIONS: Final = 2048


def plain_url(url: str) -> str:
    """Turn redis+cluster:// (rediss+cluster://) into the URL redis-py parses."""
    for scheme in CLUSTER_SCHEMES:
        if url.startswith(scheme):
            return scheme.replace("+cluster", "") + url[len(scheme) :]
    return url


def _cluster_options(url: str) -> dict[str, Any]:
    """Read a cluster URL whose host part may list several seed nodes.

    redis+cluster://h1:p1,h2:p2 names more than one node to start from, so a
    process that starts while one of them is down still finds the cluster.
    """
    scheme, _, rest = plain_url(url).partition("://")
    userinfo, _, hosts_and_path = rest.rpartition("@")
    hosts, slash, path = hosts_and_path.partition("/")
    seeds = []
    for seed in hosts.split(","):
        host, _, port = seed.rpartition(":") if ":" in seed else (seed, "", "6379")
        seeds.append(ClusterNode(host.strip("[]"), int(port or 6379)))
    first = f"{scheme}://{userinfo + '@' if userinfo else ''}{hosts.split(',')[0]}"
    options: dict[str, Any] = dict(parse_url(first + slash + path))
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    options.pop("host", None)
    options.pop("port", None)
    return {"startup_nodes": seeds, **options}


def connect(
    url: str,
    *,
    cluster: bool,
    socket_timeout: float,
    connect_timeout: float,
    retries: int = 1,
    pool_size: int | None = None,
    pool_wait: float | None = None,
    **options: Any,
) -> Redis:
    """Make a lazily connecting client; RedisCluster when `cluster` is set.

    The cluster client implements every command, script, pipeline and pub/sub
    call this service makes (each keyed by one hash tag, see CONTRACT §5), so
    the rest of the code is typed against `Redis` and runs on either.
    `pool_size` with `pool_wait` gives a single server a blocking pool; on a
    cluster it caps each node's connections.
    """
    if cluster:
        nodes = RedisCluster(
            **_cluster_options(url),
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), retries),
            max_connections=pool_size or CLUSTER_CONNECTIONS,
            **options,
        )
        make_cluster_cancel_safe(nodes)
        return cast(Redis, nodes)
    # As Redis.from_url builds it, with connections that keep a task's
    # cancellation (cancel_safe.py).
    common: dict[str, Any] = dict(parse_url(url))
    common["connection_class"] = cancel_safe_class(
        common.get("connection_class", Connection)
    )
    common |= {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), retries),
        **options,
    }
    pool: ConnectionPool
    if pool_size is not None:
        pool = WiredBlockingPool(max_connections=pool_size, timeout=pool_wait, **common)
    else:
        pool = WiredPool(max_connections=SERVER_CONNECTIONS, **common)
    client = Redis(connection_pool=pool, retry=Retry(NoBackoff(), retries))
    client.auto_close_connection_pool = True  # aclose closes the pool, as from_url
    return client


def is_cluster(redis: Redis) -> bool:
    """Tell whether a client made by `connect` talks to a Redis Cluster."""
    return isinstance(redis, RedisCluster)


async def warm(
    redis: Redis, scripts: Sequence[str] = (), seconds: float = WARM_SECONDS
) -> bool:
    """Connect (on a cluster, learn its slots) and load scripts before any request.

    Otherwise a process's first request pays for discovery, a connection and a
    NOSCRIPT round trip inside its own short budget, and a fail-closed route
    refuses it. Redis down or hung here costs start-up `seconds` at most; the
    app starts anyway and its first requests connect.
    """

    async def reach() -> None:
        await redis.ping()
        for script in scripts:
            await redis.script_load(script)

    try:
        await asyncio.wait_for(reach(), seconds)
    except (TimeoutError, *STORE_ERRORS) as err:
        _LOGGER.warning("Redis not reached at start-up: %s", type(err).__name__)
        return False
    return True
