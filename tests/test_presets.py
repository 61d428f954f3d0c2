"""Style presets: listed anonymously, applied at submit, kept with the generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.content import ContentError, load_content
from service.settings import ROOT
from service.store.embedded import MailCatcher

from .conftest import MakeClient
from .workbench import sign_in


async def test_presets_are_listed_anonymously_in_either_language(
    studio: MakeClient,
) -> None:
    """zh by default, en when asked; anything else names the field."""
    client = await studio()
    zh = await (await client.get("/api/presets")).json()
    en = await (await client.get("/api/presets?lang=en")).json()
    presets = load_content().presets
    assert [p["id"] for p in zh["presets"]] == [p.id for p in presets]
    assert zh["presets"][0] == {
        "id": presets[0].id,
        "name": presets[0].name_zh,
        "prompt_suffix": presets[0].prompt_suffix,
        "negative_prompt": presets[0].negative_prompt,
    }
    assert en["presets"][1]["name"] == presets[1].name_en
    response = await client.get("/api/presets?lang=fr")
    assert response.status == 400
    assert (await response.json())["field"] == "lang"


async def test_a_preset_extends_the_prompt_and_the_negative_prompt(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """The suffix after ", ", the negative prompt added to mine; shown as sent."""
    client = await studio()
    await sign_in(client, mail_server)
    preset = load_content().presets[0]
    response = await client.post(
        "/api/generations",
        json={
            "model": "qwen-image-2-pro",
            "prompt": " a cat ",
            "negative_prompt": "dogs",
            "preset": preset.id,
        },
    )
    assert response.status == 202, await response.text()
    body = await response.json()
    assert body["preset"] == preset.id
    assert body["prompt"] == f"a cat, {preset.prompt_suffix}"
    assert body["negative_prompt"] == f"dogs, {preset.negative_prompt}"
    shown = await (await client.get(f"/api/generations/{body['id']}")).json()
    assert (shown["prompt"], shown["preset"]) == (body["prompt"], preset.id)
    plain = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a cat"}
    )
    assert (await plain.json())["preset"] is None
    # A model without a negative prompt gets the suffix alone.
    bare = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a cat", "preset": preset.id},
    )
    assert (await bare.json())["negative_prompt"] == ""


async def test_an_unknown_preset_is_a_400_and_charges_nothing(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Not a preset id: 400 naming `preset`; the balance stays whole."""
    client = await studio()
    await sign_in(client, mail_server)
    for preset in ("nope", 3, None, {"id": "photo"}, ["photo"]):
        response = await client.post(
            "/api/generations",
            json={"model": "seedream-4", "prompt": "a cat", "preset": preset},
        )
        assert response.status == 400
        assert await response.json() == {"error": "BAD_REQUEST", "field": "preset"}
    assert (await (await client.get("/api/me")).json())["credits"] == 100


def test_a_presets_file_with_a_fault_stops_the_start_naming_it(tmp_path: Path) -> None:
    """A repeated id or an unknown key is a content error with the file and entry."""
    for name in ("site.toml", "models.toml"):
        (tmp_path / name).write_bytes((ROOT / "content" / name).read_bytes())
    (tmp_path / "workflows").symlink_to(ROOT / "content" / "workflows")
    entry = 'id = "a"\nname_zh = "甲"\nname_en = "A"\nprompt_suffix = "x"\n'
    (tmp_path / "presets.toml").write_text(f"[[presets]]\n{entry}[[presets]]\n{entry}")
    with pytest.raises(ContentError, match=r"presets\.toml: presets\[1\]: id"):
        load_content(tmp_path)
    (tmp_path / "presets.toml").write_text(f"[[presets]]\n{entry}colour = 1\n")
    with pytest.raises(ContentError, match="colour: unknown key"):
        load_content(tmp_path)
    (tmp_path / "presets.toml").unlink()
    assert load_content(tmp_path).presets == ()
