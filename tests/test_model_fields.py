"""Each model's `fields`: listed by /api/models, the others refused before charging."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.content import CONTENT_DIR, OPTIONAL_FIELDS, load_content
from service.store.embedded import MailCatcher

from .conftest import Env, MakeClient
from .workbench import balance, ledger, sign_in, wait_for_status, worker_process

VALUES = {"negative_prompt": "blurry", "seed": 7, "reference": "abc123"}


async def test_api_models_lists_the_fields_of_every_row(studio: MakeClient) -> None:
    """`fields` in /api/models is the catalogue row's, for every model."""
    client = await studio()
    listed = (await (await client.get("/api/models")).json())["models"]
    rows = {model.id: list(model.fields) for model in load_content().models}
    assert {item["id"]: item["fields"] for item in listed} == rows
    for item in listed:
        assert set(item["fields"]) <= set(OPTIONAL_FIELDS)
        assert ("reference" in item["fields"]) == item["accepts_reference"]


async def test_a_field_the_model_does_not_take_is_refused_and_nothing_charged(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Each model × each field it lacks: 400 naming the field; the ledger unmoved.

    The demo upstream is on (STUDIO_DEMO_UPSTREAM=1): it honours a model's
    fields exactly as the model's own upstream would.
    """
    client = await studio()
    await sign_in(client, mail_server)
    before = await balance(client)
    refused = 0
    for model in load_content().models:
        for name in set(OPTIONAL_FIELDS) - set(model.fields):
            response = await client.post(
                "/api/generations",
                json={"model": model.id, "prompt": "a lamp", name: VALUES[name]},
            )
            assert response.status == 400, (model.id, name)
            assert await response.json() == {"error": "BAD_REQUEST", "field": name}
            refused += 1
    assert refused >= 6  # Kling takes no seed, Seedream no negative prompt, …
    assert await balance(client) == before
    assert [entry["kind"] for entry in await ledger(client)] == ["grant"]


async def test_fields_a_model_takes_are_accepted_and_run_on_the_demo(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A seed to Seedream 5.0, a negative prompt to Kling, a blank one to Seedream."""
    client = await studio(STUDIO_TRIAL_CREDITS="1000")
    await sign_in(client, mail_server)
    bodies = [
        {"model": "seedream-5", "prompt": "a lamp", "seed": 7},
        {"model": "seedream-5", "prompt": "a lamp", "negative_prompt": "  "},
        {"model": "kling-2-1", "prompt": "waves", "negative_prompt": "blur"},
    ]
    generations = []
    for body in bodies:
        response = await client.post("/api/generations", json=body)
        assert response.status == 202, await response.text()
        generations.append(await response.json())
    with worker_process(studio_env):
        for generation in generations:
            await wait_for_status(client, generation["id"], {"succeeded"}, 60)
    assert generations[0]["seed"] == 7


def _catalogue(tmp_path: Path, row: str) -> Path:
    directory = tmp_path / "content"
    directory.mkdir()
    shutil.copy(CONTENT_DIR / "site.toml", directory / "site.toml")
    (directory / "models.toml").write_text(
        '[[models]]\nid = "m"\nname = "M"\nvendor = "V"\nkind = "image"\n'
        'credits = 1\nmax_resolution = "1x1"\nnote_zh = "z"\nnote_en = "e"\n'
        'sizes = ["1024x1024"]\nmax_count = 1\nupstream = "fal"\n'
        'upstream_model = "x"\n' + row
    )
    return directory


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('accepts_reference = false\nfields = ["steps"]\n', "unknown fields"),
        ('accepts_reference = true\nfields = ["seed"]\n', "accepts_reference"),
        ('accepts_reference = false\nfields = ["reference"]\n', "accepts_reference"),
    ],
)
def test_a_catalogue_row_with_fields_submit_does_not_know_is_refused_at_load(
    tmp_path: Path, row: str, message: str
) -> None:
    """An unknown field, or `reference` disagreeing with accepts_reference."""
    with pytest.raises(ValueError, match=message):
        load_content(_catalogue(tmp_path, row))
