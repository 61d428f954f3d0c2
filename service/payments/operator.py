"""`studio payments show|query|refund|reconcile`: orders from a shell, money in yuan."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Final

from redis.asyncio import Redis

from ..settings import Settings
from ..studio.ledger import account_key
from .context import opened
from .orders import OrderStore, UnknownOrder, account_of, yuan_text
from .providers.base import Provider, ProviderError
from .reconciler import Reconciler, ask
from .refunds import FEE_PERCENT, FEN_PER_CREDIT, FULL_DAYS, NotRefundable, day_of
from .webhooks import WEBHOOK_PREFIX

OK: Final = 0
REFUSED: Final = 1


def _refuse(message: str) -> int:
    print(f"studio: {message}", file=sys.stderr)
    return REFUSED


async def run_payments(
    args: argparse.Namespace, settings: Settings, redis: Redis
) -> int:
    """Carry out a payments command; 0 done, 1 refused (one line on stderr)."""
    async with opened(settings, redis) as (providers, store, _):
        command = args.payments_command
        if command == "reconcile":
            outcomes = await Reconciler(
                store,
                providers,
                every=settings.payments.reconcile_seconds,
                after=settings.payments.reconcile_after,
            ).pass_once()
            summary = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
            print(f"reconciled: {summary or 'nothing open'}")
            return OK
        oid = args.order_id
        fields = await store.get(oid)
        if fields is None:
            return _refuse(f"no order {oid}")
        if command == "show":
            await _show(redis, store, fields)
            return OK
        provider = providers.get(fields["channel"])
        if provider is None:
            return _refuse(f"channel {fields['channel']} is not configured")
        if command == "query":
            return await _query(store, provider, oid)
        notify_url = f"{settings.base_url}{WEBHOOK_PREFIX}{provider.id}"
        return await _refund(store, provider, fields, notify_url)


async def _show(redis: Redis, store: OrderStore, fields: dict[str, str]) -> None:
    oid = fields["id"]
    credits, bonus = int(fields["credits"]), int(fields["bonus"])
    print(f"order     {oid} (account {account_of(oid)})")
    print(f"pack      {fields['pack']}: {credits} credits + {bonus} bonus")
    print(f"amount    {yuan_text(int(fields['fen']))} yuan")
    print(f"channel   {fields['channel']} ({fields['device']})")
    print(f"status    {fields['status']}")
    print(f"created   {fields['created_at']}, expires {fields['expires_at']}")
    if fields.get("paid_at"):
        print(f"paid      {fields['paid_at']}, trade_no {fields['trade_no']}")
    refunded = yuan_text(int(fields.get("refunded_fen") or 0))
    covered = yuan_text(int(fields.get("covered_fen") or 0))
    print(f"refunded  {refunded} yuan (credits taken back for {covered} yuan)")
    if fields.get("refund_state"):
        print(
            f"refund    {fields['refund_id']}: {fields['refund_state']},"
            f" {yuan_text(int(fields['refund_fen']))} yuan paid back"
            f" (fee {yuan_text(int(fields['refund_fee']))}),"
            f" {fields['refund_credits']} credits refundable"
        )
    if lot_id := fields.get("lot"):
        raw = await redis.hget(f"{account_key(oid[:24])}:lot", lot_id)
        if raw is not None:
            lot = json.loads(raw)
            print(
                f"lot       {lot_id}: {lot['granted']} granted,"
                f" {lot['remaining']} remaining, expires {lot['expires_at']}"
            )
    notices = [n for n in await store.notices(500) if n.get("order_id") == oid]
    print(f"notices   {len(notices)}")
    for notice in notices[:10]:
        print(
            f"  {notice['at']} {notice['provider']} {notice['event_id']}"
            f" verified={notice['verified']} {notice['outcome']}"
        )


async def _query(store: OrderStore, provider: Provider, oid: str) -> int:
    try:
        outcome = await ask(store, provider, oid)
    except ProviderError as err:
        return _refuse(f"{provider.id} unavailable: {err.code}")
    words = {
        "credited": "paid: credited now",
        "already": "paid: credited before",
        "unpaid": "not paid",
        "mismatch": "paid with another amount: not credited (see the log)",
    }
    print(f"{oid}: {words[outcome]}")
    return REFUSED if outcome == "mismatch" else OK


async def _refund(
    store: OrderStore, provider: Provider, fields: dict[str, str], notify_url: str
) -> int:
    """Quote, take the credits (once), ask the provider (same refund id), finish.

    Each step is idempotent, so a run that crashed anywhere is finished by
    running the command again: a pending refund is sent again with its id.
    """
    oid = fields["id"]
    now = time.time()
    try:
        begun_before = bool((await store.quote(oid, now)).state)
        refund = await store.begin_refund(oid, now)
    except NotRefundable as err:
        return _refuse(f"{oid} not refunded: {err.code}")
    except UnknownOrder:
        return _refuse(f"no order {oid}")
    if refund.state == "done":
        print(f"{oid}: refunded before ({yuan_text(refund.fen)} yuan)")
        return OK
    gross = refund.credits * FEN_PER_CREDIT
    print(f"order        {oid}, paid {yuan_text(int(fields['fen']))} yuan")
    print(f"refundable   {refund.credits} credits x 0.10 = {yuan_text(gross)} yuan")
    if begun_before:
        fee = f"{yuan_text(refund.fee_fen)} (as computed when the refund began)"
    elif refund.fee_fen:
        day = day_of(float(fields["paid"]), now)
        fee = f"{FEE_PERCENT} % on day {day} = {yuan_text(refund.fee_fen)}"
    else:
        day = day_of(float(fields["paid"]), now)
        fee = f"none (day {day}; days 1-{FULL_DAYS} have none)"
    print(f"fee          {fee}")
    print(f"paid back    {yuan_text(refund.fen)} yuan, refund id {refund.refund_id}")
    if begun_before:
        print("             begun earlier: sending it again with the same refund id")
    try:
        outcome = await provider.refund(
            oid, refund.refund_id, refund.fen, int(fields["fen"]), notify_url
        )
    except ProviderError as err:
        return _refuse(
            f"{provider.id} did not take the refund ({err.code}); it stays pending:"
            " run the command again"
        )
    if outcome == "processing":
        # Taken, the money not yet moved: its notice, or a rerun, finishes it.
        print(
            f"{oid}: {provider.id} is still processing the refund; its notice, or"
            " running this again, confirms it (nothing is refunded twice)"
        )
        return OK
    await store.finish_refund(oid)
    print(f"{oid}: refunded")
    return OK
