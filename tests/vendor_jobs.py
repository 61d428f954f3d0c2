"""Cases every task vendor must pass, through real worker processes and the ledger.

Each test module of a task protocol (ark, dashscope, kling, minimax) binds these
to its fake and its catalogue rows; the checks are the same for all of them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from redis.asyncio import Redis

from service.studio.upstreams.tasks import memo_key

from .conftest import Client
from .upstream_jobs import assert_books, finished, submit, until
from .vendor_fakes import FakeTasks
from .workbench import wait_for_status, worker_process


async def sigkilled_while_polling(
    client: Client,
    fake: FakeTasks,
    env: Mapping[str, str],
    redis: Redis,
    model: str,
    price: int,
) -> None:
    """A worker SIGKILLed mid-poll: the next worker polls the same task, one create."""
    fake.hold = True
    with worker_process(env) as first:
        generation = await submit(client, model=model, prompt="a slow one")
        await wait_for_status(client, generation["id"], {"running"}, 30)
        await until(lambda: any(task.polls >= 2 for task in fake.tasks.values()))
        (task,) = fake.tasks.values()
        kept = await redis.get(memo_key(generation["id"]))
        assert isinstance(kept, bytes)
        assert task.id in kept.decode()  # kept with the job before polling
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    polls = task.polls
    fake.hold = False
    with worker_process(env):
        done = await finished(client, generation, within=60)
    assert done["status"] == "succeeded", done
    assert fake.creates == 1
    assert task.polls > polls  # the second worker polled the task the first created
    await assert_books(client, price, refunded=False)


async def canceled_while_queued(
    client: Client, fake: FakeTasks, env: Mapping[str, str], model: str, price: int
) -> None:
    """Cancel while the vendor queues the task: the vendor's cancel, one refund."""
    fake.queued = True
    with worker_process(env):
        generation = await submit(client, model=model, prompt="never mind")
        await until(lambda: any(task.polls >= 2 for task in fake.tasks.values()))
        response = await client.post(f"/api/generations/{generation['id']}/cancel")
        assert response.status == 200
        await until(lambda: bool(fake.canceled()))
    assert fake.canceled() == list(fake.tasks)
    body = await (await client.get(f"/api/generations/{generation['id']}")).json()
    assert (body["status"], body["refunded"]) == ("canceled", True)
    await assert_books(client, price, refunded=True)
