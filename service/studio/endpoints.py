"""The workbench's /api endpoints: models, credits, generations, uploads, events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.multipart import BodyPartReader
from aiohttp_sse import sse_response

from ..api.boundary import ApiBoundary
from ..api.codings import body_coding
from ..api.errors import ApiError
from ..api.payloads import (
    UPLOAD_READ_SECONDS,
    body_deadline,
    json_response,
    read_idempotency,
    read_json,
)
from ..api.query import bad_field, list_params, read_cursor
from ..auth.sessions import SESSION, anonymous
from ..content import Model
from ..keys import CLOCK, CONTENT, REDIS, SETTINGS
from ..limits.http import enforce
from ..metrics import METRICS
from ..moderation.prompts import MODERATION
from ..moderation.providers.base import Picture
from ..web.hardening import MALFORMED_FORM
from ..web.keys import SECURITY
from .events import CLOSE, Furthest
from .generations import (
    MAX_NEGATIVE_PROMPT,
    MAX_PROMPT,
    MAX_SEED,
    SubmitRefused,
)
from .keys import (
    EVENT_VIEWS,
    EVENTS,
    GENERATIONS,
    JOBS,
    LEDGER,
    MEDIA,
    POSITIONS,
    ROUTING,
    WORKS,
)
from .ledger import account_key
from .media.fetchable import fetchable_url
from .media.images import InvalidImage, inspect_image
from .media.store import new_key
from .positions import LineWatch
from .presets import with_preset
from .search import generations_with, read_query, walk

_LOGGER: Final = logging.getLogger(__name__)
MAX_UPLOAD_BYTES: Final = 10 * 1024 * 1024
# Multipart framing around the file: boundaries and part headers.
_MULTIPART_SLACK: Final = 64 * 1024
HEARTBEAT_SECONDS: Final = 14.0  # a comment within any 15 s without an event
# Routes whose handlers charge a per-account write limit (headers on every answer).
ACCOUNT_LIMITED: Final = frozenset({"uploads"})
_SUBMIT_FIELDS: Final = frozenset(
    {"negative_prompt", "size", "count", "seed", "reference", "preset"}
)


def _account(request: web.Request) -> str:
    return request[SESSION].account_id


@anonymous
async def list_models(request: web.Request) -> web.StreamResponse:
    """List the catalog with what each model costs and whether it runs now."""
    app = request.app
    routing = app[ROUTING]
    today = app[CLOCK]().date()
    models = []
    for model in app[CONTENT].models:
        item: dict[str, Any] = {
            "id": model.id,
            "name": model.name,
            "vendor": model.vendor,
            "kind": model.kind,
            "credits": model.credits,
        }
        if model.kind == "video":
            item["seconds"] = model.seconds
        item |= {
            "sizes": list(model.sizes),
            "max_count": model.max_count,
            "accepts_reference": model.accepts_reference,
            "fields": list(model.fields),
            "available": routing.available(model, today),
            "retires_at": model.retires_at.isoformat() if model.retires_at else None,
        }
        models.append(item)
    demo = app[SETTINGS].workbench.demo_upstream
    return json_response({"demo": demo, "models": models})


async def credits(request: web.Request) -> web.StreamResponse:
    """Show the balance, the lots with credits left and a page of the ledger."""
    limit, cursor = list_params(request.query, frozenset())
    before = read_cursor(cursor, "e")
    page = await request.app[LEDGER].page(_account(request), before=before, limit=limit)
    return json_response(
        {
            "balance": page.balance,
            "credits_owed": page.owed,
            "lots": page.lots,
            "entries": page.entries,
            "next_cursor": f"e{page.next_before}" if page.next_before else None,
        }
    )


def _visible(text: str) -> bool:
    """Tell whether a text shows anything: not only controls, zero-width or
    format characters (U+200B, a BOM, bidi marks), which strip() leaves."""
    return any(char.isprintable() and not char.isspace() for char in text)


def _integer(body: Mapping[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(name)
    return value


async def _fields(
    request: web.Request, body: Mapping[str, Any], kept_seed: int | None = None
) -> tuple[Model, dict[str, str | int]]:
    """Check every field against the catalog; return the model and what to store.

    A new generation draws its seed unless the body names one; a retry keeps
    its original's (`kept_seed`), on models without a seed control too.
    """
    app = request.app
    model = (
        app[CONTENT].model(body["model"]) if isinstance(body["model"], str) else None
    )
    if model is None:
        raise bad_field("model")
    if refused := model.refused_field(body):
        raise bad_field(refused)  # the model has no such control
    prompt = body["prompt"].strip() if isinstance(body["prompt"], str) else ""
    if not 1 <= len(prompt) <= MAX_PROMPT or not _visible(prompt):
        raise bad_field("prompt")
    negative = body.get("negative_prompt", "")
    if not isinstance(negative, str) or len(negative.strip()) > MAX_NEGATIVE_PROMPT:
        raise bad_field("negative_prompt")
    size = body.get("size", model.sizes[0])
    if size not in model.sizes:
        raise bad_field("size")
    count = _integer(body, "count", 1)
    if not 1 <= count <= model.max_count or (model.kind == "video" and count != 1):
        raise bad_field("count")
    drawn = secrets.randbelow(MAX_SEED + 1) if kept_seed is None else kept_seed
    seed = _integer(body, "seed", drawn)
    if not 0 <= seed <= MAX_SEED:
        raise bad_field("seed")
    stored: dict[str, str | int] = {"model": model.id, "kind": model.kind}
    stored |= with_preset(app[CONTENT].presets, model, body, prompt, negative.strip())
    if model.max_prompt is not None and len(str(stored["prompt"])) > model.max_prompt:
        raise bad_field("prompt")  # more than its upstream takes (Wan: 800)
    stored |= {"size": size, "count": count, "seed": seed}
    if "reference" in body:
        reference = body["reference"]
        if not (model.accepts_reference and isinstance(reference, str)):
            raise bad_field("reference")
        key = f"{account_key(_account(request))}:upload:{reference}"
        size = await app[GENERATIONS].upload_size(key) if reference.isalnum() else None
        if size is None:
            raise bad_field("reference")
        stored["reference"] = reference
        body = {**body, "reference_size": size}  # what its upstream may check
    if refused := app[ROUTING].refused_field(model, body):
        raise bad_field(refused)  # the model's upstream has no such field
    today = app[CLOCK]().date()
    if not app[ROUTING].available(model, today):
        raise ApiError(400, "MODEL_UNAVAILABLE")
    return model, stored


async def submit(request: web.Request) -> web.StreamResponse:
    """Charge and queue a generation in one step; replay a repeated key."""
    body = await read_json(
        request, required={"model", "prompt"}, optional=_SUBMIT_FIELDS, name_field=True
    )
    idempotency, body_hash = read_idempotency(request, body)
    return await place(request, body, idempotency, body_hash)


async def place(
    request: web.Request,
    body: Mapping[str, Any],
    idempotency: str,
    body_hash: str,
    *,
    kept_seed: int | None = None,
) -> web.StreamResponse:
    """Check a submission's fields, then charge and queue it (or replay its key)."""
    app = request.app
    settings = app[SETTINGS].workbench
    account = _account(request)
    store = app[GENERATIONS]
    # The moderation answers after the fields and before the key (CONTRACT §11);
    # a bad field answers after the key (§6, details 1): it waits its turn.
    try:
        model, fields = await _fields(request, body, kept_seed)
    except ApiError as err:
        bad_field: ApiError | None = err
    else:
        bad_field = None
        texts = {name: str(fields[name]) for name in ("prompt", "negative_prompt")}
        await app[MODERATION].screen(texts, source="prompt", account=account)
    if idempotency and (seen := await store.remembered(account, idempotency)):
        return await _replay(request, account, seen, body_hash)
    if bad_field is not None:
        raise bad_field
    gid = secrets.token_hex(10)
    deadline = time.time() + (
        settings.video_deadline if model.kind == "video" else settings.image_deadline
    )
    price = model.credits * int(fields["count"])
    try:
        submitted = await store.submit(
            account,
            gid,
            price=price,
            cap=settings.jobs_per_user,
            idempotency=idempotency,
            body_hash=body_hash,
            deadline=deadline,
            fields=fields,
        )
    except SubmitRefused as err:
        raise _refusal(err, price) from None
    if submitted.replayed:
        return await generation_response(
            request, submitted.fields, status=200, replayed=True
        )
    app[METRICS].credits.labels("debited").inc(int(submitted.fields["credits"]))
    return await generation_response(
        request, submitted.fields, status=202, place=submitted.place
    )


async def _replay(
    request: web.Request, account: str, seen: tuple[str, str], body_hash: str
) -> web.StreamResponse:
    stored_hash, gid = seen
    if stored_hash != body_hash:
        raise ApiError(422, "IDEMPOTENCY_KEY_REUSED")
    fields = await request.app[GENERATIONS].get(account, gid)
    if fields is None:
        raise ApiError(409, "IDEMPOTENCY_KEY_IN_USE")
    return await generation_response(request, fields, status=200, replayed=True)


def _refusal(err: SubmitRefused, price: int) -> ApiError:
    if err.code == "INSUFFICIENT_CREDITS":
        return ApiError(402, err.code, balance=err.balance, required=price)
    if err.code == "TOO_MANY_JOBS":
        return ApiError(429, err.code)
    if err.code == "ACCOUNT_DELETING":  # a request that raced the deletion
        return ApiError(409, err.code)
    if err.code == "PAYMENT_HOLD":
        return ApiError(402, err.code)
    if err.code == "IDEMPOTENCY_KEY_REUSED":
        return ApiError(422, err.code)
    return ApiError(401, "NO_SESSION")  # the account is gone (deleted meanwhile)


async def generation_response(
    request: web.Request,
    fields: Mapping[str, str],
    *,
    status: int = 200,
    replayed: bool = False,
    place: int | None = None,
) -> web.Response:
    known = {fields["id"]: place} if place is not None else {}
    (shown,) = await request.app[POSITIONS].views([fields], known)
    response = json_response(shown, status=status)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


async def list_generations(request: web.Request) -> web.StreamResponse:
    """List my generations, newest first."""
    limit, cursor = list_params(request.query, frozenset({"q"}))
    before = read_cursor(cursor, "g")
    if (words := read_query(request.query)) is not None:
        items, last = await _found(request, words, before, limit)
    else:
        items, last = await request.app[GENERATIONS].page(
            _account(request), before=before, limit=limit
        )
    return json_response(
        {
            "items": [
                await _live(request, shown)
                for shown in await request.app[POSITIONS].views(items)
            ],
            "next_cursor": f"g{last}" if last else None,
        }
    )


async def _found(
    request: web.Request, words: str, before: int | None, limit: int
) -> tuple[list[dict[str, str]], int | None]:
    """A page of my generations whose prompt holds the words."""
    app, account = request.app, _account(request)
    keep = generations_with(app[REDIS], account, words)
    index = f"{account_key(account)}:gens"
    gids, last = await walk(app[REDIS], index, before=before, limit=limit, keep=keep)
    found = [await app[GENERATIONS].get(account, gid) for gid in gids]
    return [fields for fields in found if fields], last


def generation_id(request: web.Request) -> str:
    """Read the {gid} of the path; one that cannot exist is a 404."""
    gid = request.match_info["gid"]
    if not (gid.isascii() and gid.isalnum() and len(gid) <= 64):
        raise ApiError(404, "NOT_FOUND")
    return gid


async def get_generation(request: web.Request) -> web.StreamResponse:
    """Show one of my generations; someone else's is as absent as a missing one."""
    fields = await request.app[GENERATIONS].get(
        _account(request), generation_id(request)
    )
    if fields is None:
        raise ApiError(404, "NOT_FOUND")
    (shown,) = await request.app[POSITIONS].views([fields])
    return json_response(await _live(request, shown))


async def _live(request: web.Request, generation: dict[str, Any]) -> dict[str, Any]:
    """Show a finished generation's works as they are now: published, favorited."""
    if generation["works"]:
        ids = [work["id"] for work in generation["works"]]
        live = await request.app[WORKS].views(_account(request), ids)
        generation["works"] = live  # a deleted work is no longer listed
    return generation


async def cancel(request: web.Request) -> web.StreamResponse:
    """Cancel a queued or running generation, refunded in the same step."""
    app = request.app
    gid = generation_id(request)
    outcome, fields = await app[GENERATIONS].settle(_account(request), gid, "cancel")
    if outcome == "NOT_FOUND":
        raise ApiError(404, "NOT_FOUND")
    if outcome == "NOT_CANCELABLE":
        raise ApiError(409, "NOT_CANCELABLE")
    app[METRICS].credits.labels("refunded").inc(int(fields["credits"]))
    await app[JOBS].cancel(gid)
    return await generation_response(request, fields)


async def upload(request: web.Request) -> web.StreamResponse:
    """Accept a reference image only once Pillow has decoded all of it."""
    app = request.app
    if request.content_type != "multipart/form-data":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE")
    body_coding(request, taken=frozenset())  # an image is compressed already
    if (request.content_length or 0) > MAX_UPLOAD_BYTES + _MULTIPART_SLACK:
        raise ApiError(413, "TOO_LARGE")
    account = _account(request)
    await enforce(
        request, f"acct:{account}", [app[SETTINGS].limits["upload"]], fail_open=False
    )
    data = await _read_file_part(request)
    loop = asyncio.get_running_loop()
    try:
        info = await loop.run_in_executor(None, inspect_image, data)
    except InvalidImage:
        raise ApiError(400, "INVALID_IMAGE") from None
    media = app[MEDIA]
    key = new_key(info.extension)
    await media.put(key, data)  # first: a provider may fetch it by its URL
    upload_id = secrets.token_hex(10)
    try:
        url = await fetchable_url(media, key, app[SETTINGS].base_url)
        await app[MODERATION].screen_image(Picture(data, url), account=account)
        await app[GENERATIONS].record_upload(
            account,
            upload_id,
            {
                "key": key,
                "content_type": info.content_type,
                "width": info.width,
                "height": info.height,
            },
        )
    except BaseException:
        await media.delete(key)  # nothing of a refused upload is kept
        raise
    return json_response(
        {
            "id": upload_id,
            "media_url": media.url(key),
            "width": info.width,
            "height": info.height,
        },
        status=201,
    )


async def _read_file_part(request: web.Request) -> bytes:
    """Read exactly one part named `file`, at most 10 MiB, in chunks, within 120 s.

    A malformed part header (no colon, a control byte, over 8,190 bytes) is
    aiohttp's HttpProcessingError, a malformed Content-Disposition its warning
    raised (`setup_log_hygiene`, as pytest does): the client's fault, a 400 that
    echoes none of it.
    """
    try:
        async with body_deadline(request, UPLOAD_READ_SECONDS):
            reader = await request.multipart()
            part = await reader.next()
            if not isinstance(part, BodyPartReader) or part.name != "file":
                raise ApiError(400, "BAD_REQUEST", field="file")
            chunks, size = [], 0
            while chunk := await part.read_chunk(65536):
                size += len(chunk)
                if size > MAX_UPLOAD_BYTES:
                    raise ApiError(413, "TOO_LARGE")
                chunks.append(chunk)
            if await reader.next() is not None:
                raise ApiError(400, "BAD_REQUEST", field="file")
    except MALFORMED_FORM:
        raise ApiError(400, "BAD_REQUEST") from None
    return b"".join(chunks)


async def events(request: web.Request) -> web.StreamResponse:
    """Stream my balance and generations as they change (Server-Sent Events)."""
    app = request.app
    session = request[SESSION]
    account = session.account_id
    hub = app[EVENTS]
    queue = await hub.open(account)
    try:
        page = await app[LEDGER].page(account, before=None, limit=1)
        active = await app[GENERATIONS].active(account)
        headers = {**app[SECURITY].common, hdrs.CACHE_CONTROL: "no-store"}
        async with sse_response(
            request, headers=headers, ping_interval=HEARTBEAT_SECONDS
        ) as stream:
            counter = 0

            async def send(event: str, data: Any) -> None:
                nonlocal counter
                counter += 1
                await stream.send(json.dumps(data), id=str(counter), event=event)

            closed = asyncio.ensure_future(stream.wait())
            getter: asyncio.Future[dict[str, Any]] | None = None
            watch = LineWatch(app[POSITIONS])
            furthest = Furthest()

            async def send_generations(shown: list[dict[str, Any]]) -> None:
                for generation in shown:
                    if not furthest.newer(generation):
                        continue  # older than the snapshot already sent
                    await send("generation", generation)
                    watch.sent(generation)

            try:
                await send("credits", {"balance": page.balance})
                ordered = sorted(active, key=lambda f: int(f.get("n", "0")))
                await send_generations(await app[POSITIONS].views(ordered))
                while True:
                    if getter is None:
                        getter = asyncio.ensure_future(queue.get())
                    look = watch.next_look()
                    wait = None if look is None else max(0.0, look - time.monotonic())
                    waiting: set[asyncio.Future[Any]] = {getter, closed}
                    done, _ = await asyncio.wait(
                        waiting,
                        timeout=wait,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    if look is not None and time.monotonic() >= look:
                        live = await app[GENERATIONS].active(account)
                        await send_generations(await watch.due(live))
                    if getter not in done:
                        if closed in done:
                            getter.cancel()
                            break
                        continue
                    event, getter = getter.result(), None
                    if event is CLOSE or event.get("event") == "_close":
                        break
                    if event.get("event") == "_logout":
                        if event.get("session") in (None, session.key):
                            break
                        continue
                    name, data = event["event"], event["data"]
                    if name == "generation":
                        await send_generations(await app[POSITIONS].views([data]))
                        continue
                    if (shown := app[EVENT_VIEWS].get(name)) is not None:
                        data = shown(data)
                    await send(name, data)
            except ConnectionResetError:  # the client left: the stream's normal end
                _LOGGER.debug("event stream closed by the client on %s", request.path)
            finally:
                for pending in (closed, getter):
                    if pending is not None and not pending.done():
                        pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await closed
    finally:
        hub.close_stream(account, queue)
    return stream


def setup_studio_routes(api: ApiBoundary) -> None:
    """Register the workbench endpoints behind the /api boundary."""
    api.add_routes(
        [
            web.get("/models", list_models, name="models"),
            web.get("/credits", credits, name="credits"),
            web.post("/generations", submit, name="generations_submit"),
            web.get("/generations", list_generations, name="generations_list"),
            web.get("/generations/{gid}", get_generation, name="generation"),
            web.post("/generations/{gid}/cancel", cancel, name="generation_cancel"),
            web.post("/uploads", upload, name="uploads"),
            web.get("/events", events, name="events"),
        ]
    )
