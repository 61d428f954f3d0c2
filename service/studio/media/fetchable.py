"""An absolute URL a moderation provider can fetch a stored image at."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from .store import MediaStore

# Long enough for a provider's fetch (Alibaba allows itself 7 s), no longer.
PRESIGNED_FOR: Final = timedelta(minutes=10)


async def fetchable_url(store: MediaStore, key: str, base_url: str) -> str:
    """A bucket's presigned GET, or the public URL made absolute with the base URL."""
    # Asked, not imported: obstore loads only where a bucket is set (lean serve).
    presign = getattr(store, "signed_url", None)
    if presign is not None:
        return str(await presign(key, PRESIGNED_FOR))
    url = store.url(key)
    return url if "://" in url else base_url.rstrip("/") + url
