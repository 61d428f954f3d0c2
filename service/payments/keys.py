"""Payments' keys: the orders and the channels this process takes them on."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from .orders import OrderStore
from .providers.base import Provider

ORDERS: Final = web.AppKey("orders", OrderStore)
# The payment channels this process can take orders on, by id ("alipay", ...).
PROVIDERS: Final = web.AppKey("providers", dict[str, Provider])
