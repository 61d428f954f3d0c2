"""`studio account export|delete|restore EMAIL`: one person's data, from a shell."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from redis.asyncio import Redis

from ..settings import Settings, SettingsError
from ..studio.ledger import UnknownAccount, iso
from ..studio.media.chosen import opened_media_store
from ..studio.media.store import MediaStore
from .archive import write_archive
from .deletion import DeletionStore, Restore

OK: Final = 0
REFUSED: Final = 1


def _refuse(message: str) -> int:
    print(f"studio: {message}", file=sys.stderr)
    return REFUSED


async def run_account(
    args: argparse.Namespace, settings: Settings, redis: Redis
) -> int:
    """Carry out an `account` command; print one line, or one line of refusal."""
    if not settings.secret_key:
        raise SettingsError("STUDIO_SECRET_KEY: required")
    media = await opened_media_store(settings.workbench)
    store = DeletionStore.build(redis, settings, media)
    email = args.email.strip().lower()
    account_id = await store.accounts.find(email)
    if account_id is None:
        return _refuse(f"no account for {email}")
    if args.account_command == "export":
        return await _export(redis, media, settings, account_id, args.out)
    if args.account_command == "delete":
        return await _delete(store, account_id, now=args.now)
    outcome = await store.restore(account_id)
    if outcome is Restore.LIVE:
        return _refuse(f"{email} is not being deleted")
    if outcome is Restore.EXPIRED:
        return _refuse(f"{email}: the purge has begun; nothing to restore")
    print(f"{account_id} restored")
    return OK


async def _export(
    redis: Redis, media: MediaStore, settings: Settings, account_id: str, out: Path
) -> int:
    """Write the ZIP next to its destination, then move it into place whole."""
    fd, temporary = _beside(out)
    try:
        with os.fdopen(fd, "w+b") as file:
            await write_archive(
                redis,
                media,
                account_id,
                file,
                privacy_url=f"{settings.base_url}/privacy",
            )
        os.replace(temporary, out)
    except BaseException:
        os.unlink(temporary)
        raise
    print(f"{out} ({_size(out)} bytes)")
    return OK


def _beside(out: Path) -> tuple[int, str]:
    """Open a temporary file in the destination's directory (one rename away)."""
    return tempfile.mkstemp(dir=out.absolute().parent, prefix=".export-")


def _size(path: Path) -> int:
    return path.stat().st_size


async def _delete(store: DeletionStore, account_id: str, *, now: bool) -> int:
    """Delete (and with --now purge) an account; print when it is purged."""
    try:
        deleted = await store.delete(account_id)
    except UnknownAccount:
        return _refuse(f"no account {account_id}")
    if not now:
        when = iso(dt.datetime.fromtimestamp(deleted.purge_at, dt.UTC))
        print(f"{account_id} deleting, purged at {when}")
        return OK
    # A deletion asked for earlier keeps its purge_at: --now purges regardless.
    await store.purge(account_id, now=max(time.time(), deleted.purge_at))
    print(f"{account_id} purged")
    return OK
