"""`studio labels check FILE`: what labels a file carries, and whether ours verify."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from ..settings import Settings
from .carriers import sniff
from .credentials import read_credentials, trust_anchors
from .finish import read_labels
from .implicit import TRAINED, LabelError, verifies, well_formed

OK: Final = 0
REFUSED: Final = 1


def run_labels(args: argparse.Namespace, settings: Settings) -> int:
    """Print the explicit label's record, the TC260 JSON, its check, C2PA."""
    path: Path = args.file
    try:
        data = path.read_bytes()
    except OSError as err:
        print(f"studio: cannot read {path}: {err.strerror}", file=sys.stderr)
        return REFUSED
    extension = sniff(data)
    if extension is None:
        print(f"studio: {path} is not a PNG, JPEG, WebP or MP4 file", file=sys.stderr)
        return REFUSED
    findings = read_labels(data, extension)
    print(f"file: {path} ({extension})")
    for record in findings.explicit or ["none recorded"]:
        print(f"explicit label: {record}")
    for text in findings.labels or ["none"]:
        print(f"TC260: {text}")
    label = findings.parsed()
    if label is None:
        count = len(findings.labels)
        verdict = "no label" if count == 0 else f"{count} labels, not one"
        if count == 1:
            verdict = "not a JSON object"
    elif not well_formed(label):
        verdict = "fails (not the standard's seven keys, printable values, Label 1)"
    else:
        verdict = "verifies" if verifies(label, settings.workbench.labels) else "fails"
    print(f"ReservedCode1: {verdict}")
    source = "trainedAlgorithmicMedia" if TRAINED in findings.source_types else "none"
    print(f"IPTC digital source type: {source}")
    labels = settings.workbench.labels
    try:
        anchors = trust_anchors(labels)
    except LabelError:
        anchors = None
    found = read_credentials(data, extension, anchors)
    if found is None:
        print("C2PA: none")
    else:
        made = ", ".join(
            f"{action.get('action')} ({_last(action.get('digitalSourceType'))})"
            for action in found.actions
        )
        print(
            f"C2PA: {found.state}; {found.manifests} manifest(s);"
            f" by {found.generator}; {made or 'no actions'}"
        )
    return OK if verdict == "verifies" else REFUSED


def _last(uri: object) -> str:
    """The last segment of a code's URI: trainedAlgorithmicMedia."""
    return str(uri or "").rsplit("/", 1)[-1]
