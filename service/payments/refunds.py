"""The refund policy's arithmetic (the /refund document, section 3), in one place."""

from __future__ import annotations

from typing import Final

DAY: Final = 86400
FULL_DAYS: Final = 7  # days 1-7: the whole amount
LAST_DAY: Final = 180  # days 8-180: less the fee; later: no cash refund
FEE_PERCENT: Final = 5
FEN_PER_CREDIT: Final = 10  # 0.1 yuan a credit


class NotRefundable(Exception):
    """A policy refund cannot be made; `code` says why."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code  # NOT_PAID | TOO_LATE | NOTHING_TO_REFUND | ACCOUNT_GONE


def day_of(paid: float, now: float) -> int:
    """Count the day of a request since the payment: the payment's own day is day 1."""
    return int((now - paid) // DAY) + 1


def fee(fen: int) -> int:
    """Take 5 % of an amount, rounded to the fen, half up."""
    return (fen * FEE_PERCENT + 50) // 100


def policy_refund(
    paid: float, now: float, credits: int, granted: int, remaining: int
) -> tuple[int, int, int]:
    """Return (refundable credits, money paid back in fen, fee in fen) for one order.

    `credits` are the order's purchased credits, `granted` its lot's size
    (credits and bonus), `remaining` what the lot still holds: whatever was spent
    from the lot, bonus included, is not refundable.
    """
    day = day_of(paid, now)
    if day > LAST_DAY:
        raise NotRefundable("TOO_LATE")
    refundable = max(0, credits - (granted - remaining))
    if refundable == 0:
        raise NotRefundable("NOTHING_TO_REFUND")
    amount = refundable * FEN_PER_CREDIT
    charge = 0 if day <= FULL_DAYS else fee(amount)
    return refundable, amount - charge, charge
