"""Money-moving scripts that a failover cannot undo once they are acknowledged."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from .connect import is_cluster
from .wire import run_script, wire_of

_LOGGER: Final = logging.getLogger(__name__)
# How long one script waits for its replicas before it is refused.
WAIT_MS: Final = 500


class ReplicasBehind(RedisError):
    """Fewer replicas than asked confirmed a write in time: not acknowledged.

    A RedisError, so every boundary answers it as the store being unavailable
    (503 UNAVAILABLE with Retry-After, a notice left for its resend, a job run
    again after its lease).
    """


class DurableScripts:
    """Run a script, then WAIT for `replicas` replicas to hold its writes.

    Replication is asynchronous: a master killed right after a script can take
    the script's writes with it, and its promoted replica would not have the
    ledger entry the client was told about. WAIT counts the replicas that
    acknowledged every write of the connection so far, so it goes in the same
    pipeline as the script (one connection, one round trip; on a cluster, to
    the node of the script's slot). Fewer replicas than asked in WAIT_MS is
    ReplicasBehind: the change is on the master but not acknowledged, so the
    caller answers 503 and the client's retry (with its Idempotency-Key, or
    the provider's resend of a notice) finds it done and moves nothing twice.
    With 0 replicas this is a plain script call.
    """

    def __init__(self, redis: Redis, replicas: int = 0) -> None:
        self._redis = redis
        self.replicas = replicas
        # A script with no replicas to wait for goes out on the client's wire
        # (wire.py): a sixth of redis-py's CPU a round trip.
        self._wire = wire_of(redis)

    async def run(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]
    ) -> Any:
        """Run `script` like `script(keys=..., args=...)`, durably when asked."""
        if self.replicas <= 0:
            return await run_script(self._wire, script, keys, args)
        reply, acked = await self._run_and_wait(script, keys, args)
        if isinstance(reply, NoScriptError):
            await self._redis.script_load(script.script)
            reply, acked = await self._run_and_wait(script, keys, args)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acked, Exception) or int(acked) < self.replicas:
            reached = "?" if isinstance(acked, Exception) else str(acked)
            _LOGGER.warning(
                "a ledger write reached %s of %d replicas in %d ms: not acknowledged",
                reached,
                self.replicas,
                WAIT_MS,
            )
            raise ReplicasBehind(f"{reached} of {self.replicas} replicas")
        return reply

    async def _run_and_wait(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]
    ) -> tuple[Any, Any]:
        target: dict[str, Any] = {}
        if is_cluster(self._redis):
            cluster = cast(RedisCluster, self._redis)
            await cluster.initialize()
            target["target_nodes"] = cluster.get_node_from_key(keys[0])
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.replicas, WAIT_MS, **target)
            reply, acked = await pipe.execute(raise_on_error=False)
        return reply, acked
