"""The ZIP of "export my data": every record of one account, and its media, streamed.

Records are read straight from Redis a page at a time and written as they
come; media are copied from the store a chunk at a time. Neither a large
library nor a long ledger is ever held whole in memory, and every blocking
step of `zipfile` runs in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
import zipfile
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from typing import Any, BinaryIO, Final

from redis.asyncio import Redis

from ..auth.sessions import sessions_index_key
from ..payments.orders import order_key, view as order_view, yuan_text
from ..studio.generations import generation_key, view as generation_view
from ..studio.ledger import UnknownAccount, account_key, iso, text
from ..studio.media.store import MediaStore, MissingMedia
from ..studio.works import mine_view

_LOGGER: Final = logging.getLogger(__name__)
# Records read from Redis in one round trip.
PAGE: Final = 200
# Fields of a ledger lot as /api/credits shows them.
_LOT_FIELDS: Final = ("kind", "granted", "remaining", "expires_at", "order_id")
# The documented order of an entry's and a work's fields (scripts store them
# in any order); a field not listed follows in its own order.
_ENTRY_ORDER: Final = (
    "id", "kind", "amount", "balance_after", "generation_id", "order_id", "note",
    "created_at",
)  # fmt: skip
_WORK_ORDER: Final = (
    "id", "generation_id", "kind", "model", "prompt", "media_url", "thumb_url",
    "width", "height", "duration", "content_type", "created_at", "published_at",
    "favorites", "favorite", "media_file", "thumb_file",
)  # fmt: skip

Write = Callable[[bytes], Awaitable[None]]

README: Final = """\
导出我的数据 / Export of my data
================================

中文
----
这是您在本服务的账户数据副本，于 {exported_at}（UTC）生成。
所有时间均为 RFC 3339 UTC 格式（如 2025-01-31T08:00:00Z）；
列表均按时间从新到旧排列。字段名称固定不变：今后的导出只会
增加字段，不会改变已有字段的含义。

account.json      账户：id（账户编号）、email（邮箱地址）、
                  created_at（开户时间）、balance（积分余额）、
                  credits_owed（因在支付平台退款而欠下的积分）、
                  exported_at（本导出的生成时间）、uploads（您上传的
                  参考图：id、file（在本压缩包中的路径）、
                  content_type、width、height）、daily_claimed_on
                  （最近一次领取每日积分的日期，北京时间）。
credits.json      积分：balance、credits_owed、lots（每一批积分：
                  id、kind（trial 试用 / bonus 赠送 / purchase 购买）、
                  granted 发放数、remaining 剩余数、expires_at 到期
                  时间、order_id 对应订单）和 entries（积分流水，每一
                  笔：id、kind（grant 发放 / purchase 购买 / debit
                  扣除 / refund 退回 / adjust 调整 / expire 过期 /
                  purchase_refund 购买退款）、amount 变动数（带符号）、
                  balance_after 变动后余额、generation_id、order_id、
                  note 备注、created_at）。
orders.json       订单：id（即支付平台的商户订单号）、pack 套餐、
                  yuan 金额（元）、credits、bonus、channel 支付渠道
                  （alipay 支付宝 / wechatpay 微信支付）、status
                  （created / paid / expired / refunded）、
                  refunded_yuan 已退款总额（含在支付平台直接办理的
                  退款）、created_at、paid_at、expires_at、trade_no
                  （支付平台的交易号）、refunds（经本服务办理的退款：
                  id、yuan 退款金额、fee_yuan 手续费、credits 对应
                  积分、state（pending 处理中 / done 已完成））。
generations.json  生成记录：id、model 模型、kind（image / video）、
                  prompt 提示词、negative_prompt、size、count、seed、
                  reference（参考图的上传 id）、status（queued /
                  running / succeeded / failed / canceled）、progress、
                  credits 扣除的积分、refunded 是否已退回、created_at、
                  started_at、finished_at、error、works（本次生成的
                  作品，格式同 works.json）。
works.json        作品：id、generation_id、kind、model、prompt、
                  media_url、thumb_url、width、height、duration（视频
                  秒数）、content_type、created_at、published_at
                  （发布到广场的时间，未发布为 null）、favorites 被收藏
                  次数、favorite 您是否收藏、media_file 与 thumb_file
                  （文件在本压缩包中的路径）。
favorites.json    您收藏的作品：id（作品编号）、favorited_at（收藏
                  时间；早期的收藏没有记录时间，为 null）。
collections.json  作品集：id、name 名称、count 作品数、created_at、
                  works（集中作品的 id，最近加入的在前）。
sessions.json     登录会话：created_at（登录时间）、last_seen_at
                  （最近使用时间，精确到约一小时）。会话令牌从不导出。
media/            您的作品原文件、缩略图和上传的参考图，文件名即其
                  存储键。

隐私政策说明了我们保存哪些数据、保存多久以及您的权利：
{privacy_url}

English
-------
This is a copy of your account's data at this service, made at {exported_at}
(UTC). Every time is RFC 3339 UTC (e.g. 2025-01-31T08:00:00Z); every list is
newest first. Field names are stable: later exports only add fields, never
change the meaning of one.

account.json      The account: id, email, created_at, balance (credits),
                  credits_owed (credits a refund made at a payment provider took
                  beyond the balance), exported_at, uploads (the reference images
                  you uploaded: id, file (its path in this ZIP), content_type,
                  width, height), daily_claimed_on (the last day, Beijing time,
                  the daily credits were claimed).
credits.json      Credits: balance, credits_owed, lots (each grant of credits:
                  id, kind trial / bonus / purchase, granted, remaining,
                  expires_at, order_id) and entries (the ledger, every change:
                  id, kind grant / purchase / debit / refund / adjust / expire /
                  purchase_refund, amount (signed), balance_after, generation_id,
                  order_id, note, created_at).
orders.json       Orders: id (the provider's out_trade_no), pack, yuan, credits,
                  bonus, channel (alipay / wechatpay), status (created / paid /
                  expired / refunded), refunded_yuan (all money returned,
                  refunds made at the provider included), created_at, paid_at,
                  expires_at, trade_no (the provider's transaction number),
                  refunds (refunds made through this service: id, yuan, fee_yuan,
                  credits, state pending / done).
generations.json  Generations: id, model, kind (image / video), prompt,
                  negative_prompt, size, count, seed, reference (the upload id),
                  status (queued / running / succeeded / failed / canceled),
                  progress, credits (charged), refunded, created_at, started_at,
                  finished_at, error, works (its works, shaped as in works.json).
works.json        Works: id, generation_id, kind, model, prompt, media_url,
                  thumb_url, width, height, duration (videos, seconds),
                  content_type, created_at, published_at (null when not in the
                  square), favorites (how many people favorited it), favorite
                  (whether you did), media_file and thumb_file (the files' paths
                  in this ZIP).
favorites.json    Works you favorited: id (the work's id), favorited_at (null for
                  favorites older than the record of their time).
collections.json  Collections: id, name, count, created_at, works (the ids of
                  its works, the most recently added first).
sessions.json     Sign-in sessions: created_at, last_seen_at (to about an hour).
                  Session tokens are never exported.
media/            Your works' files, their thumbnails and your uploads, each
                  named by its storage key.

The privacy policy says what we keep, for how long, and your rights: {privacy_url}
"""


def _ordered(item: Mapping[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """Put an object's fields in their documented order."""
    known = {name: item[name] for name in order if name in item}
    return known | {name: value for name, value in item.items() if name not in known}


def _indented(value: Any, depth: int) -> str:
    """Write a JSON value pretty-printed, indented to sit `depth` levels deep."""
    return json.dumps(value, ensure_ascii=False, indent=2).replace(
        "\n", "\n" + "  " * depth
    )


class _Zip:
    """A ZIP being written: each blocking step runs in a worker thread, in turn."""

    def __init__(self, out: BinaryIO) -> None:
        self._zip = zipfile.ZipFile(out, "w", allowZip64=True)
        stamp = dt.datetime.now(dt.UTC)
        self._stamp = (stamp.year, stamp.month, stamp.day, stamp.hour, stamp.minute, 0)
        self.names: set[str] = set()

    @contextlib.asynccontextmanager
    async def entry(self, name: str, *, compress: bool) -> AsyncIterator[Write]:
        """Open one member for writing; what the caller writes is streamed in."""
        info = zipfile.ZipInfo(name, date_time=self._stamp)
        info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        info.external_attr = 0o644 << 16
        writer = await asyncio.to_thread(self._zip.open, info, "w")
        self.names.add(name)

        async def write(data: bytes) -> None:
            await asyncio.to_thread(writer.write, data)

        try:
            yield write
        finally:
            await asyncio.to_thread(writer.close)

    async def json_file(
        self,
        name: str,
        head: Mapping[str, Any],
        key: str | None = None,
        pages: AsyncIterator[Sequence[Any]] | None = None,
    ) -> None:
        """Write `head` as an object, with `key` a list filled page by page."""
        async with self.entry(name, compress=True) as write:
            lines = [f"  {json.dumps(k)}: {_indented(v, 1)}" for k, v in head.items()]
            if key is None or pages is None:
                await write(("{\n" + ",\n".join(lines) + "\n}\n").encode())
                return
            lines.append(f"  {json.dumps(key)}: [")
            await write(("{\n" + ",\n".join(lines)).encode())
            first = True
            async for page in pages:
                if page:
                    items = ",".join(f"\n    {_indented(item, 2)}" for item in page)
                    await write((items if first else "," + items).encode())
                    first = False
            await write(b"\n  ]\n}\n" if not first else b"]\n}\n")

    async def close(self) -> None:
        """Write the central directory."""
        await asyncio.to_thread(self._zip.close)


class _Reader:
    """One account's records, read from Redis in pages, rendered as the API does."""

    def __init__(self, redis: Redis, account_id: str) -> None:
        self.redis = redis
        self.id = account_id
        self.key = account_key(account_id)
        self.media: list[str] = []  # the works' and uploads' keys, in order

    async def _ranked(self, index: str) -> AsyncIterator[list[tuple[str, float]]]:
        """Walk a sorted set from its highest score down, a page at a time.

        A page starts at the last score seen, past the members of that score
        already given (sessions made in the same second share one), so members
        added meanwhile neither repeat nor push others out of the walk.
        """
        top: float | None = None
        skip = 0
        while True:
            found: list[tuple[bytes, float]] = await self.redis.zrevrangebyscore(  # type: ignore[assignment]
                index,
                "+inf" if top is None else repr(top),
                "-inf",
                start=skip,
                num=PAGE,
                withscores=True,
            )
            if not found:
                return
            yield [(text(member), score) for member, score in found]
            if len(found) < PAGE:
                return
            last = found[-1][1]
            same = sum(1 for _, score in found if score == last)
            skip = skip + same if last == top else same
            top = last

    async def account(self) -> dict[str, str]:
        """Read the account's own hash, or UnknownAccount."""
        found = await self.redis.hgetall(self.key)
        if not found:
            raise UnknownAccount(self.id)
        return {text(k): text(v) for k, v in found.items()}

    async def lots(self) -> list[dict[str, Any]]:
        """Read every lot, spent ones too, in the order they were granted."""
        lots: dict[str, dict[str, Any]] = {}
        async for lot_id, raw in self.redis.hscan_iter(f"{self.key}:lot", count=PAGE):
            lot = json.loads(raw)
            lots[text(lot_id)] = {"id": text(lot_id)} | {
                name: lot.get(name) for name in _LOT_FIELDS
            }
        return sorted(lots.values(), key=lambda lot: int(lot["id"][1:]))

    async def entries(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk the ledger newest first; it only grows, so indexes never move."""
        end = await self.redis.llen(f"{self.key}:ledger")
        while end > 0:
            start = max(0, end - PAGE)
            raw = await self.redis.lrange(f"{self.key}:ledger", start, end - 1)
            yield [_ordered(json.loads(item), _ENTRY_ORDER) for item in reversed(raw)]
            end = start

    async def orders(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk my orders newest first, each with its trade number and refunds."""
        now = time.time()
        async for page in self._ranked(f"{self.key}:orders"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for order_id, _ in page:
                    pipe.hgetall(order_key(order_id))
                records = await pipe.execute()
            out = []
            for record in records:
                if not record:
                    continue
                fields = {text(k): text(v) for k, v in record.items()}
                refunds = []
                if fields.get("refund_id"):
                    refunds.append(
                        {
                            "id": fields["refund_id"],
                            "yuan": yuan_text(int(fields.get("refund_fen") or 0)),
                            "fee_yuan": yuan_text(int(fields.get("refund_fee") or 0)),
                            "credits": int(fields.get("refund_credits") or 0),
                            "state": fields.get("refund_state") or "pending",
                        }
                    )
                out.append(
                    order_view(fields, now)
                    | {"trade_no": fields.get("trade_no") or None, "refunds": refunds}
                )
            yield out

    async def works_of(self, wids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Render works of mine by id, as /api/works does, with their files."""
        if not wids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for wid in wids:
                pipe.get(f"{self.key}:work:{wid}")
                pipe.scard(f"{self.key}:work:{wid}:fans")
            pipe.zmscore(f"{self.key}:favs", list(wids))
            *replies, scores = await pipe.execute()
        out = {}
        for index, wid in enumerate(wids):
            raw, count = replies[2 * index], replies[2 * index + 1]
            if raw:
                record = json.loads(raw)
                work = mine_view(record, int(count), scores[index] is not None)
                work["media_file"] = f"media/{record['media_key']}"
                work["thumb_file"] = f"media/{record['thumb_key']}"
                out[wid] = _ordered(work, _WORK_ORDER)
        return out

    async def generations(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk my generations newest first, their works as they are now."""
        async for page in self._ranked(f"{self.key}:gens"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for gid, _ in page:
                    pipe.hgetall(generation_key(self.id, gid))
                records = await pipe.execute()
            views = [
                generation_view({text(k): text(v) for k, v in record.items()})
                for record in records
                if record
            ]
            wids = [work["id"] for item in views for work in item["works"]]
            live = await self.works_of(wids)
            for item in views:
                item["works"] = [
                    live[work["id"]] for work in item["works"] if work["id"] in live
                ]
            yield views

    async def works(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk my works newest first; remember their files for media/."""
        async for page in self._ranked(f"{self.key}:works"):
            wids = [wid for wid, _ in page]
            live = await self.works_of(wids)
            items = [live[wid] for wid in wids if wid in live]
            for work in items:
                self.media += [work["media_file"][6:], work["thumb_file"][6:]]
            yield items

    async def favorites(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk the works I favorited, most recent favorite first, with when."""
        async for page in self._ranked(f"{self.key}:favs"):
            wids = [wid for wid, _ in page]
            when = await self.redis.hmget(f"{self.key}:favat", wids)
            yield [
                {"id": wid, "favorited_at": text(at) if at else None}
                for wid, at in zip(wids, when, strict=True)
            ]

    async def collections(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk my collections newest first, each with its works' ids."""
        async for page in self._ranked(f"{self.key}:cols"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for cid, _ in page:
                    pipe.hgetall(f"{self.key}:col:{cid}")
                    pipe.zrevrange(f"{self.key}:col:{cid}:works", 0, -1)
                replies = await pipe.execute()
            items = []
            for index, (cid, _) in enumerate(page):
                record, wids = replies[2 * index], replies[2 * index + 1]
                fields = {text(k): text(v) for k, v in record.items()}
                if fields:
                    items.append(
                        {
                            "id": cid,
                            "name": fields["name"],
                            "count": len(wids),
                            "created_at": fields["created_at"],
                            "works": [text(wid) for wid in wids],
                        }
                    )
            yield items

    async def sessions(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Walk my live sessions, newest first: when made and last seen, no more."""
        async for page in self._ranked(sessions_index_key(self.id)):
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, _ in page:
                    pipe.hmget(key, ["account", "created", "seen"])
                records = await pipe.execute()
            yield [
                {
                    "created_at": iso(dt.datetime.fromtimestamp(int(made), dt.UTC)),
                    "last_seen_at": iso(dt.datetime.fromtimestamp(int(seen), dt.UTC)),
                }
                for owner, made, seen in records
                if owner and text(owner) == self.id and made and seen
            ]

    async def uploads(self) -> list[dict[str, Any]]:
        """Find my uploads (they have no index: a scan matching my hash tag)."""
        prefix = f"{self.key}:upload:"
        found = [
            text(name)
            async for name in self.redis.scan_iter(match=prefix + "*", count=1000)
        ]
        out = []
        for start in range(0, len(found), PAGE):
            names = sorted(found)[start : start + PAGE]
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hgetall(name)
                records = await pipe.execute()
            for name, record in zip(names, records, strict=True):
                fields = {text(k): text(v) for k, v in record.items()}
                if "key" not in fields:
                    continue
                self.media.append(fields["key"])
                out.append(
                    {
                        "id": name.removeprefix(prefix),
                        "file": f"media/{fields['key']}",
                        "content_type": fields.get("content_type"),
                        "width": int(fields.get("width") or 0),
                        "height": int(fields.get("height") or 0),
                    }
                )
        return out


async def _copy_media(archive: _Zip, media: MediaStore, key: str) -> None:
    """Copy one stored file into media/, a chunk at a time; a missing one is skipped."""
    name = f"media/{key}"
    if name in archive.names:
        return
    chunks = media.chunks(key)
    try:
        try:
            first = await anext(chunks)
        except MissingMedia:
            _LOGGER.warning("export: media %s is gone; left out", key)
            return
        except StopAsyncIteration:
            first = b""
        async with archive.entry(name, compress=False) as write:
            await write(first)
            async for chunk in chunks:
                await write(chunk)
    finally:
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()  # the store's file closes now, not at collection


async def write_archive(
    redis: Redis,
    media: MediaStore,
    account_id: str,
    out: BinaryIO,
    *,
    privacy_url: str = "/privacy",
) -> None:
    """Write the whole ZIP of one account's data to a seekable binary file.

    Raises UnknownAccount for an id without an account (nothing useful written).
    """
    reader = _Reader(redis, account_id)
    fields = await reader.account()
    uploads = await reader.uploads()
    exported_at = iso(dt.datetime.now(dt.UTC))
    archive = _Zip(out)
    try:
        account = {
            "id": account_id,
            "email": fields.get("email") or None,
            "created_at": fields.get("created_at"),
            "balance": int(fields.get("balance") or 0),
            "credits_owed": int(fields.get("owed") or 0),
            "exported_at": exported_at,
            "uploads": uploads,
            # the last day (Beijing time) the daily credits were claimed
            "daily_claimed_on": fields.get("daily"),
        }
        await archive.json_file("account.json", account)
        await archive.json_file(
            "credits.json",
            {
                "balance": account["balance"],
                "credits_owed": account["credits_owed"],
                "lots": await reader.lots(),
            },
            "entries",
            reader.entries(),
        )
        await archive.json_file("orders.json", {}, "orders", reader.orders())
        await archive.json_file(
            "generations.json", {}, "generations", reader.generations()
        )
        await archive.json_file("works.json", {}, "works", reader.works())
        await archive.json_file("favorites.json", {}, "favorites", reader.favorites())
        await archive.json_file("sessions.json", {}, "sessions", reader.sessions())
        await archive.json_file(
            "collections.json", {}, "collections", reader.collections()
        )
        for key in reader.media:
            await _copy_media(archive, media, key)
        readme = README.format(exported_at=exported_at, privacy_url=privacy_url)
        async with archive.entry("README.txt", compress=True) as write:
            await write(readme.encode())
    finally:
        await archive.close()
