"""What serve and worker say once at start-up about the labels' settings."""

from __future__ import annotations

from ..settings import PLACEHOLDER_PRODUCER, LabelsSettings


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
