"""My account's keys: the export and the deletion stores."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from .deletion import DeletionStore
from .exports import ExportStore

# "Delete my account": now, restored on sign-in, purged by a worker (CONTRACT §9).
DELETIONS: Final = web.AppKey("deletions", DeletionStore)
# "Export my data": one ZIP a day per account, built by a worker (CONTRACT §9).
EXPORTS: Final = web.AppKey("exports", ExportStore)
