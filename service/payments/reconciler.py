"""Follow orders whose notice never came: ask their provider, credit, expire."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Final

import aiohttp

from ..store.connect import STORE_ERRORS
from ..studio.ledger import UnknownAccount
from .orders import AmountMismatch, OrderStore, UnknownOrder
from .providers.base import Provider, ProviderError

_LOGGER: Final = logging.getLogger(__name__)
# An order is asked about until this long after its expiry, then left alone.
GRACE_SECONDS: Final = 3600
# Orders looked at in one pass, oldest first.
BATCH: Final = 500


async def ask(store: OrderStore, provider: Provider, order_id: str) -> str:
    """Ask the provider about one order and credit it if it was paid.

    Returns "credited" (now), "already" (paid before), "unpaid", or "mismatch"
    (paid, but not the order's amount: logged, nothing credited). A provider
    that cannot answer raises ProviderError.
    """
    try:
        payment = await provider.query(order_id)
    except (aiohttp.ClientError, TimeoutError) as err:
        raise ProviderError("UNREACHABLE", type(err).__name__) from err
    if payment is None or not payment.paid:
        return "unpaid"
    try:
        credited = await store.pay(order_id, payment.trade_no, payment.total_fen)
    except UnknownAccount:
        _LOGGER.warning("order %s paid after its account was purged", order_id)
        return "account_gone"
    except AmountMismatch:
        _LOGGER.error(
            "%s reports order %s paid with %d fen: not its amount, not credited",
            provider.id,
            order_id,
            payment.total_fen,
        )
        return "mismatch"
    if credited:
        _LOGGER.info("order %s credited on %s's answer", order_id, provider.id)
    return "credited" if credited else "already"


class Reconciler:
    """Ask about `created` orders older than `after` s, every `every` s.

    Every worker process runs one. Several at once are harmless: crediting is
    one idempotent script, and `mark_asked` keeps two of them from asking the
    provider about the same order in the same stretch of time.
    """

    def __init__(
        self,
        store: OrderStore,
        providers: Mapping[str, Provider],
        *,
        every: float,
        after: float,
    ) -> None:
        self.store = store
        self.providers = providers
        self.every = every
        self.after = after

    async def run(self, stop: asyncio.Event) -> None:
        """Pass over the open orders until `stop` is set."""
        while not stop.is_set():
            try:
                await self.pass_once()
            except STORE_ERRORS as err:
                _LOGGER.warning("reconciler: store unavailable: %s", type(err).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)

    async def pass_once(self, now: float | None = None) -> Counter[str]:
        """Look at every open order once; count what happened to them."""
        now = time.time() if now is None else now
        outcomes: Counter[str] = Counter()
        down: set[str] = set()  # providers that failed this pass: not asked again
        for oid in await self.store.open_orders(
            older_than=now - self.after, limit=BATCH
        ):
            try:
                outcome = await self._follow(oid, now, down)
            except UnknownOrder:
                await self.store.forget_open(oid)
                outcome = "gone"
            outcomes[outcome] += 1
        if outcomes:
            _LOGGER.info(
                "reconciler: %s",
                ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items())),
            )
        return outcomes

    async def _follow(self, oid: str, now: float, down: set[str]) -> str:
        fields = await self.store.get(oid)
        if fields is None or fields["status"] not in ("created", "expired"):
            await self.store.forget_open(oid)
            return "settled"
        outcome = "unasked"
        provider = self.providers.get(fields["channel"])
        # An order another worker (or its buyer's page) asked about moments
        # ago is left alone.
        if (
            provider is not None
            and provider.id not in down
            and await self.store.mark_asked(oid, now, every=self.every * 0.9)
        ):
            try:
                outcome = await ask(self.store, provider, oid)
            except ProviderError as err:
                down.add(provider.id)
                _LOGGER.warning(
                    "reconciler: %s unavailable (%s); next pass in %g s",
                    provider.id,
                    err.code,
                    self.every,
                )
                outcome = "unreachable"
        if outcome in ("credited", "already"):
            return outcome
        expires = float(fields["expires"])
        if now >= expires and await self.store.expire(oid, now):
            outcome = "expired"
        if now >= expires + GRACE_SECONDS:
            await self.store.forget_open(oid)
            outcome = "forgotten"
        return outcome
