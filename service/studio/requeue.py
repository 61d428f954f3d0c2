"""Try a generation again, and cancel all of mine at once."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response, read_idempotency, read_json
from ..api.query import bad_field
from ..auth.sessions import SESSION
from ..keys import CONTENT
from ..metrics import METRICS
from .endpoints import generation_id, place
from .keys import GENERATIONS, JOBS

RETRYABLE = frozenset({"failed", "canceled"})


def again(fields: dict[str, str], model_fields: tuple[str, ...]) -> dict[str, Any]:
    """The submit body that asks for the same generation once more.

    The seed goes in the body only where the model has a seed control (submit
    refuses it elsewhere); `retry` keeps it for the others too.
    """
    preset = fields.get("preset")
    prompt = fields["base_prompt"] if preset else fields["prompt"]
    negative = fields["base_negative_prompt"] if preset else fields["negative_prompt"]
    body: dict[str, Any] = {
        "model": fields["model"],
        "prompt": prompt,
        "size": fields["size"],
        "count": int(fields["count"]),
    }
    if negative:
        body["negative_prompt"] = negative
    if "seed" in model_fields:
        body["seed"] = int(fields["seed"])
    for name in ("reference", "preset"):
        if fields.get(name):
            body[name] = fields[name]
    return body


async def retry(request: web.Request) -> web.StreamResponse:
    """Submit a failed or canceled generation again: a new one, charged anew."""
    app = request.app
    gid = generation_id(request)
    fields = await app[GENERATIONS].get(request[SESSION].account_id, gid)
    if fields is None:
        raise ApiError(404, "NOT_FOUND")
    if fields["status"] not in RETRYABLE:
        raise ApiError(409, "NOT_RETRYABLE")
    model = app[CONTENT].model(fields["model"])
    body = again(fields, model.fields if model else ())
    # A key names this retry of this generation: a replay repeats it once.
    idempotency, body_hash = read_idempotency(request, {"retry": gid})
    return await place(
        request, body, idempotency, body_hash, kept_seed=int(fields["seed"])
    )


async def cancel_all(request: web.Request) -> web.StreamResponse:
    """Cancel my queued (or queued and running) generations, each refunded once."""
    app = request.app
    body = await read_json(request, required={"status"}, name_field=True)
    which = body["status"]
    if which not in ("queued", "all"):
        raise bad_field("status")
    account = request[SESSION].account_id
    store, canceled = app[GENERATIONS], 0
    only = ("queued",) if which == "queued" else ()
    for fields in sorted(await store.active(account), key=lambda f: f["id"]):
        # The transition checks the state again: a job that started meanwhile
        # is left running under "queued"; each refund happens once, whoever wins.
        outcome, settled = await store.settle(account, fields["id"], "cancel", *only)
        if outcome == "OK":
            canceled += 1
            app[METRICS].credits.labels("refunded").inc(int(settled["credits"]))
            await app[JOBS].cancel(fields["id"])
    return json_response({"canceled": canceled})


def setup_requeue_routes(api: ApiBoundary) -> None:
    """Register retry and cancel-all behind the /api boundary."""
    api.add_routes(
        [
            web.post("/generations/cancel", cancel_all, name="generations_cancel"),
            web.post("/generations/{gid}/retry", retry, name="generation_retry"),
        ]
    )
