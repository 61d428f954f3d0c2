"""What serve and `make run` say and do about labels at start-up."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from service.store.embedded import RedisServer

from .conftest import TEST_SECRET
from .ports import free_port
from .processes import output_of, running

UNSIGNED = "files are not signed with C2PA Content Credentials"
PLACEHOLDER = "STUDIO_LABELS_PRODUCER_CODE is the placeholder of 0s"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_says_once_that_nothing_is_signed(
    redis_server: RedisServer, workers: str
) -> None:
    """Without a certificate, and with the placeholder code: one warning each,
    also from `serve --workers 2` (its supervisor says it, not each worker)."""
    variables = {"STUDIO_REDIS_URL": redis_server.url, "STUDIO_SECRET_KEY": TEST_SECRET}
    with running("serve", variables, arguments=("--workers", workers)) as (_, process):
        output = output_of(process)
        deadline = time.monotonic() + 20
        while output.text().count("Running on") < int(workers):  # every worker up
            assert time.monotonic() < deadline, output.text()
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        said = output.text()
    assert said.count(UNSIGNED) == 1, said
    assert said.count(PLACEHOLDER) == 1, said


def test_a_set_producer_code_and_certificate_silence_the_warnings(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """With the operator's code and PEM files, serve warns about neither."""
    from service.labels.local_ca import local_signing_files

    cert, key = local_signing_files(tmp_path)
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_LABELS_PRODUCER_CODE": "001191110102MACQD9K64010000",
        "STUDIO_LABELS_C2PA_CERT": str(cert),
        "STUDIO_LABELS_C2PA_KEY": str(key),
    }
    with running("serve", variables) as (_, process):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        said = output_of(process).text()
    assert UNSIGNED not in said
    assert PLACEHOLDER not in said


def test_make_run_signs_with_a_local_ca_made_under_its_data_dir(tmp_path: Path) -> None:
    """`dev` makes .data/c2pa/ the first time and says it signs with it."""
    variables = {"STUDIO_DATA_DIR": str(tmp_path), "STUDIO_SMTP_PORT": str(free_port())}
    with running("dev", variables, timeout=30) as (_, process):
        output_of(process).wait_for("C2PA: signing with the local CA's certificate")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        said = output_of(process).text()
    assert UNSIGNED not in said
    assert {p.name for p in (tmp_path / "c2pa").iterdir()} == {
        "ca.pem",
        "chain.pem",
        "signer-key.pem",
    }
