"""`studio labels check FILE`, run as an operator runs it."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, PngImagePlugin

from service.labels.implicit import make_label, xmp_packet
from service.settings import LabelsSettings
from service.studio.media.demo_art import render_image, render_video
from service.studio.media.finishing import finish

from .processes import studio_environ
from .workbench import studio_command

OLD_KEY = "old-label-key-0123456789abcdef-0123456789"
NEW_KEY = "new-label-key-0123456789abcdef-0123456789"
LABELS = LabelsSettings(secret_key=OLD_KEY)


def _environ(**variables: str) -> dict[str, str]:
    return studio_environ(STUDIO_SECRET_KEY=OLD_KEY, **variables)


async def test_a_labeled_picture_and_clip_verify(tmp_path: Path) -> None:
    """Exit 0; the record, the JSON, the verdict and the source type are printed."""
    picture = tmp_path / "work.png"
    picture.write_bytes(
        finish(LABELS, render_image("a", 1, 256, 256), "png", "w1").data
    )
    clip = tmp_path / "work.mp4"
    clip.write_bytes(
        finish(LABELS, render_video("b", 1, 160, 120, 0.5, fps=8), "mp4", "w2").data
    )
    for path, produce_id in ((picture, "w1"), (clip, "w2")):
        done = await studio_command("labels", "check", str(path), environ=_environ())
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[1].startswith('explicit label: {"text":"AI生成"')
        assert f'"ProduceID":"{produce_id}"' in lines[2]
        assert lines[3] == "ReservedCode1: verifies"
        assert lines[4] == "IPTC digital source type: trainedAlgorithmicMedia"


async def test_after_a_key_rotation_old_labels_still_verify(tmp_path: Path) -> None:
    """Under STUDIO_SECRET_KEY_PREVIOUS yes; under a stranger's key, exit 1."""
    path = tmp_path / "old.webp"
    path.write_bytes(finish(LABELS, render_image("c", 1, 64, 64), "png", "w").thumb)
    rotated = studio_environ(
        STUDIO_SECRET_KEY=NEW_KEY, STUDIO_SECRET_KEY_PREVIOUS=OLD_KEY
    )
    done = await studio_command("labels", "check", str(path), environ=rotated)
    assert (done.returncode, "ReservedCode1: verifies" in done.stdout) == (0, True)
    stranger = studio_environ(STUDIO_SECRET_KEY=NEW_KEY)
    done = await studio_command("labels", "check", str(path), environ=stranger)
    assert done.returncode == 1
    assert "ReservedCode1: fails" in done.stdout


async def test_unlabeled_doubly_labeled_and_unreadable_files_fail(
    tmp_path: Path,
) -> None:
    """No label, two labels, an edited label, not a media file, no file: exit 1
    saying which."""
    plain = tmp_path / "plain.png"
    plain.write_bytes(render_image("d", 1, 32, 32))
    info = PngImagePlugin.PngInfo()
    packet = xmp_packet(make_label(LABELS, "x"), None).decode()
    info.add_itxt("XML:com.adobe.xmp", packet)
    info.add_itxt("XML:com.adobe.xmp", packet)
    double = tmp_path / "double.png"
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG", pnginfo=info)
    double.write_bytes(buffer.getvalue())
    # Label "3" with the integrity code left intact: not ours any more.
    edited_info = PngImagePlugin.PngInfo()
    edited_label = {**make_label(LABELS, "x"), "Label": "3"}
    edited_info.add_itxt("XML:com.adobe.xmp", xmp_packet(edited_label, None).decode())
    edited = tmp_path / "edited.png"
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG", pnginfo=edited_info)
    edited.write_bytes(buffer.getvalue())
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    expected = {
        plain: "ReservedCode1: no label",
        double: "ReservedCode1: 2 labels, not one",
        edited: "ReservedCode1: fails (not the standard's seven keys,"
        " printable values, Label 1)",
    }
    for path, line in expected.items():
        done = await studio_command("labels", "check", str(path), environ=_environ())
        assert done.returncode == 1
        assert line in done.stdout.splitlines()
    done = await studio_command("labels", "check", str(text), environ=_environ())
    assert done.returncode == 1
    assert "not a PNG, JPEG, WebP or MP4" in done.stderr
    missing = str(tmp_path / "missing.png")
    done = await studio_command("labels", "check", missing, environ=_environ())
    assert done.returncode == 1
    assert "cannot read" in done.stderr


async def test_bad_label_settings_stop_with_one_line(tmp_path: Path) -> None:
    """A code with a space, or a certificate without its key: exit 2, named."""
    cert = tmp_path / "cert.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    cases = {
        "STUDIO_LABELS_PRODUCER_CODE": ("0011 9", "STUDIO_LABELS_PRODUCER_CODE"),
        "STUDIO_LABELS_C2PA_CERT": (str(cert), "set both or neither"),
    }
    for name, (value, said) in cases.items():
        environ = _environ(**{name: value})
        done = await studio_command("labels", "check", str(cert), environ=environ)
        assert done.returncode == 2
        assert said in done.stderr
