"""What serve and worker check and say once at start-up about the labels."""

from __future__ import annotations

from ..settings import PLACEHOLDER_PRODUCER, LabelsSettings, SettingsError, variable


def require_signing_key(labels: LabelsSettings) -> None:
    """Stop at start-up on a C2PA chain and key that cannot sign together."""
    if labels.c2pa_cert is None or labels.c2pa_key is None:
        return
    # Only a configured chain loads c2pa, cryptography and the label writers.
    from .credentials import signing_key
    from .implicit import LabelError

    try:
        signing_key(labels.c2pa_cert, labels.c2pa_key)
    except LabelError as err:
        raise SettingsError(f"{variable('labels.c2pa_key')}: {err}") from err


def notices(labels: LabelsSettings) -> list[str]:
    """The warnings an operator must see: a placeholder code, no key, no C2PA."""
    said = []
    if labels.producer_code == PLACEHOLDER_PRODUCER:
        said.append(
            "STUDIO_LABELS_PRODUCER_CODE is the placeholder of 0s: set the"
            " GB 45438 provider code built from your unified social credit code"
        )
    if not labels.secret_key:
        said.append(
            "STUDIO_SECRET_KEY is empty: labels' ReservedCode1 verifies nowhere else"
        )
    if labels.c2pa_cert is None:
        said.append(
            "no STUDIO_LABELS_C2PA_CERT/KEY: files are not signed with C2PA"
            " Content Credentials"
        )
    return said
