"""A removed work's files move to keys nobody was given: its public URLs stop answering.

Media keys are unguessable and their URLs public (`/media/{key}`, or a CDN's),
cached for a year: anyone who saw a work on the square holds its URL. When an
operator removes a work (an upheld report: content that must stop spreading,
CONTRACT §11), its files are copied under new keys, the work is pointed at them
(its author still sees it, marked removed), and the old keys are deleted, so
the URLs the square gave out answer 404 from then on. A CDN in front keeps its
copies until they are purged there.

Every key involved is noted first (`PendingMedia`): if the command dies
midway, a worker's janitor deletes whichever files the work does not hold, so
neither an orphan copy nor a still-public original is left behind.
"""

from __future__ import annotations

from .media.pending import Note, PendingMedia
from .media.store import MediaStore, new_key
from .works import Moved, WorkNotFound, WorkStore


async def withdraw_files(
    works: WorkStore, media: MediaStore, pending: PendingMedia, owner: str, wid: str
) -> bool:
    """Move a work's files to new keys and delete the old ones; False if the
    work is gone or changed its files meanwhile (nothing is left behind)."""
    owned = await works.owned(owner, wid)
    if owned is None:
        return False
    record = owned.record
    gid = str(record.get("generation_id") or "")
    moves: list[Moved] = []
    for name in ("media_key", "thumb_key"):
        old = str(record.get(name) or "")
        new = new_key(old.rpartition(".")[2]) if old else ""
        moves.append((old, new, media.url(new) if new else ""))
    notes = [
        Note(owner, gid, wid, key) for old, new, _ in moves for key in (old, new) if key
    ]
    await pending.note(notes)  # before any copy exists
    for old, new, _ in moves:
        if old:
            await media.copy(old, new)
    try:
        done = await works.rekey(owner, wid, moves[0], moves[1])
    except WorkNotFound:  # deleted by its author meanwhile: the copies go
        done = False
    for old, new, _ in moves:
        if old:
            await media.delete(old if done else new)
    await pending.settled(notes)
    return done
