"""Content Credentials: every finished file signed last, validated by c2pa.Reader."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import c2pa
import pytest
from PIL import Image

from service.labels.credentials import read_credentials, sign
from service.labels.local_ca import local_signing_files, make_chain
from service.settings import LabelsSettings
from service.studio.media.demo_art import render_image, render_video
from service.studio.media.finishing import finish

from .labels_support import TRAINED, assert_one_label
from .processes import studio_environ
from .workbench import studio_command

SECRET = "c2pa-test-secret-0123456789abcdef-01234"
MIME = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "mp4": "video/mp4",
}


@dataclasses.dataclass(frozen=True)
class Chain:
    """A CA and a signer made for the test, as PEM files."""

    chain: Path
    key: Path
    ca: str

    def settings(self) -> LabelsSettings:
        return LabelsSettings(
            secret_key=SECRET, c2pa_cert=self.chain, c2pa_key=self.key
        )


def _chain(folder: Path) -> Chain:
    folder.mkdir(parents=True, exist_ok=True)
    chain_pem, key_pem, ca_pem = make_chain(days=30)
    (folder / "chain.pem").write_bytes(chain_pem)
    (folder / "key.pem").write_bytes(key_pem)
    return Chain(folder / "chain.pem", folder / "key.pem", ca_pem.decode())


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    return _chain(tmp_path / "ours")


def _store(data: bytes, extension: str, anchors: str) -> tuple[str, dict[str, Any]]:
    """Read with c2pa.Reader itself, trusting only the test's CA."""
    context = c2pa.Context.from_dict(
        {
            "trust": {"user_anchors": anchors},
            "verify": {"remote_manifest_fetch": False, "ocsp_fetch": False},
        }
    )
    with c2pa.Reader(MIME[extension], io.BytesIO(data), context=context) as reader:
        return str(reader.get_validation_state()), json.loads(reader.json())


def _assert_ours(data: bytes, extension: str, chain: Chain) -> None:
    state, store = _store(data, extension, chain.ca)
    assert state == "Trusted"
    assert len(store["manifests"]) == 1
    active = store["manifests"][store["active_manifest"]]
    assert active["claim_generator_info"][0]["name"].startswith("Liuguang Studio")
    assert not active.get("ingredients")
    (actions,) = [
        a for a in active["assertions"] if a["label"].startswith("c2pa.actions")
    ]
    (created,) = actions["data"]["actions"]
    assert created["action"] == "c2pa.created"
    assert created["digitalSourceType"] == TRAINED


@pytest.mark.parametrize("extension", ["png", "jpg", "webp"])
def test_pictures_and_thumbnails_are_signed_after_their_labels(
    chain: Chain, extension: str
) -> None:
    """Trusted under the test's CA, the manifest of CONTRACT §10, and the TC260
    label still exactly one and verifying (signing kept the XMP)."""
    image = Image.open(io.BytesIO(render_image("a lamp", 1, 320, 240)))
    buffer = io.BytesIO()
    image.save(buffer, format={"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[extension])
    finished = finish(chain.settings(), buffer.getvalue(), extension, "signed-1")
    for data, kind in ((finished.data, extension), (finished.thumb, "webp")):
        _assert_ours(data, kind, chain)
        assert_one_label(data, kind, SECRET, "signed-1")


def test_a_clip_and_its_poster_are_signed(chain: Chain) -> None:
    """MP4 too: the AIGC key and the signature side by side."""
    clip = render_video("waves", 1, 320, 240, 1.0, fps=8)
    finished = finish(chain.settings(), clip, "mp4", "signed-2")
    _assert_ours(finished.data, "mp4", chain)
    assert_one_label(finished.data, "mp4", SECRET, "signed-2")
    _assert_ours(finished.thumb, "webp", chain)


def test_an_upstreams_manifest_is_replaced_by_ours(
    chain: Chain, tmp_path: Path
) -> None:
    """A file the vendor signed leaves with one manifest, ours, and no ingredient."""
    vendor = _chain(tmp_path / "vendor")
    signed = sign(vendor.settings(), render_image("x", 2, 200, 200), "png", "v.png")
    state, store = _store(signed, "png", vendor.ca)
    assert (state, len(store["manifests"])) == ("Trusted", 1)
    finished = finish(chain.settings(), signed, "png", "ours")
    _assert_ours(finished.data, "png", chain)
    assert_one_label(finished.data, "png", SECRET, "ours")


def test_without_a_certificate_nothing_is_signed() -> None:
    """No labels.c2pa_cert: files carry their labels and no manifest."""
    finished = finish(
        LabelsSettings(secret_key=SECRET), render_image("y", 1, 64, 64), "png", "w"
    )
    assert read_credentials(finished.data, "png") is None
    assert read_credentials(finished.thumb, "webp") is None


async def test_labels_check_prints_the_manifests_state(
    chain: Chain, tmp_path: Path
) -> None:
    """Trusted with the configured chain; `C2PA: none` for an unsigned file."""
    signed = tmp_path / "signed.png"
    signed.write_bytes(
        finish(chain.settings(), render_image("z", 1, 64, 64), "png", "w").data
    )
    plain = tmp_path / "plain.png"
    plain.write_bytes(
        finish(
            LabelsSettings(secret_key=SECRET), render_image("z", 1, 64, 64), "png", "w"
        ).data
    )
    environ = studio_environ(
        STUDIO_SECRET_KEY=SECRET,
        STUDIO_LABELS_C2PA_CERT=str(chain.chain),
        STUDIO_LABELS_C2PA_KEY=str(chain.key),
    )
    done = await studio_command("labels", "check", str(signed), environ=environ)
    assert done.returncode == 0, done.stderr
    assert (
        "C2PA: Trusted; 1 manifest(s); by Liuguang Studio 流光工坊;"
        " c2pa.created (trainedAlgorithmicMedia)"
    ) in done.stdout.splitlines()
    done = await studio_command("labels", "check", str(plain), environ=environ)
    assert done.returncode == 0
    assert "C2PA: none" in done.stdout.splitlines()


async def test_a_key_that_does_not_match_its_certificate_stops_the_worker(
    chain: Chain, tmp_path: Path
) -> None:
    """`studio worker` exits 2 naming the setting, before it takes any job."""
    other = _chain(tmp_path / "other")
    environ = studio_environ(
        STUDIO_REDIS_URL="redis://127.0.0.1:1",
        STUDIO_SECRET_KEY=SECRET,
        STUDIO_LABELS_C2PA_CERT=str(chain.chain),
        STUDIO_LABELS_C2PA_KEY=str(other.key),
    )
    done = await studio_command("worker", environ=environ)
    assert done.returncode == 2
    assert "STUDIO_LABELS_C2PA_KEY" in done.stderr
    assert "does not belong" in done.stderr


def test_make_run_makes_its_local_ca_once(tmp_path: Path) -> None:
    """.data/c2pa/ gets a CA, a chain and a private key (0600) the first time only;
    files signed with them are trusted under that CA."""
    cert, key = local_signing_files(tmp_path)
    first = (cert.read_bytes(), key.read_bytes())
    assert key.stat().st_mode & 0o777 == 0o600
    assert local_signing_files(tmp_path) == (cert, key)
    assert (cert.read_bytes(), key.read_bytes()) == first
    local = Chain(cert, key, (tmp_path / "c2pa" / "ca.pem").read_text())
    finished = finish(local.settings(), render_image("q", 1, 64, 64), "png", "dev")
    _assert_ours(finished.data, "png", local)
