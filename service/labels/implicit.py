"""The implicit label: the TC260 JSON, its integrity code, and its XMP packet."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from xml.etree import ElementTree
from xml.sax.saxutils import escape, quoteattr

from ..settings import LabelsSettings

TC260_NS: Final = "http://www.tc260.org.cn/ns/AIGC/1.0/"
IPTC_NS: Final = "http://iptc.org/std/Iptc4xmpExt/2008-02-29/"
# Our own record of the visible label, beside (never inside) the TC260 JSON.
STUDIO_NS: Final = "urn:liuguang-studio:labels:1"
RDF_NS: Final = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
TRAINED: Final = (
    "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
)
KEYS: Final = (
    "Label",
    "ContentProducer",
    "ProduceID",
    "ReservedCode1",
    "ContentPropagator",
    "PropagateID",
    "ReservedCode2",
)
_PURPOSE: Final = b"studio/aigc-label/v1"


class LabelError(Exception):
    """A file could not be labeled, or its label did not read back as written."""


def _label_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), _PURPOSE, hashlib.sha256).digest()


def reserved_code(secret: str, producer: str, produce_id: str) -> str:
    """HMAC-SHA256 under the label key over `producer/produce_id`, lower-case hex."""
    message = f"{producer}/{produce_id}".encode()
    return hmac.new(_label_key(secret), message, hashlib.sha256).hexdigest()


def make_label(settings: LabelsSettings, work_id: str) -> dict[str, str]:
    """The seven keys for a work: produced and propagated by this service."""
    producer = settings.producer_code
    return {
        "Label": "1",
        "ContentProducer": producer,
        "ProduceID": work_id,
        "ReservedCode1": reserved_code(settings.secret_key, producer, work_id),
        "ContentPropagator": settings.propagator_code,
        "PropagateID": work_id,
        "ReservedCode2": "",
    }


def label_json(label: Mapping[str, str]) -> str:
    """Write the label as compact JSON, keys in the standard's order."""
    return json.dumps({key: label[key] for key in KEYS}, separators=(",", ":"))


def well_formed(label: Mapping[str, Any]) -> bool:
    """Tell whether a label has the standard's form: exactly the seven keys, every
    value printable ASCII without spaces, and Label "1" (AI-generated)."""
    return (
        set(label) == set(KEYS)
        and all(
            isinstance(value, str) and all("!" <= char <= "~" for char in value)
            for value in label.values()
        )
        and label["Label"] == "1"
    )


def verifies(label: Mapping[str, Any], settings: LabelsSettings) -> bool:
    """Tell whether a label is well formed and its ReservedCode1 ours, under the
    current or previous key: an edited label is not ours even if its code is."""
    if not well_formed(label):
        return False
    producer, produce_id = label["ContentProducer"], label["ProduceID"]
    code = label["ReservedCode1"]
    # The current key even when empty (a worker started without one labels
    # under it, verifiably to itself only); the previous one when set.
    secrets = dict.fromkeys(
        [settings.secret_key]
        + ([settings.secret_key_previous] if settings.secret_key_previous else [])
    )
    return any(
        hmac.compare_digest(
            reserved_code(secret, str(producer), str(produce_id)), str(code)
        )
        for secret in secrets
    )


def xmp_packet(
    label: Mapping[str, str] | None, explicit: Mapping[str, Any] | None
) -> bytes:
    """One XMP packet: the TC260 label (if any), IPTC's source type, our record."""
    properties = []
    if label is not None:
        properties.append(f"<TC260:AIGC>{escape(label_json(label))}</TC260:AIGC>")
    properties.append(
        f"<Iptc4xmpExt:DigitalSourceType>{TRAINED}</Iptc4xmpExt:DigitalSourceType>"
    )
    if explicit is not None:
        record = json.dumps(explicit, ensure_ascii=False, separators=(",", ":"))
        properties.append(
            f"<studio:ExplicitLabel>{escape(record)}</studio:ExplicitLabel>"
        )
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
        '<x:xmpmeta xmlns:x="adobe:ns:meta/">'
        f"<rdf:RDF xmlns:rdf={quoteattr(RDF_NS)}>"
        '<rdf:Description rdf:about=""'
        f" xmlns:TC260={quoteattr(TC260_NS)}"
        f" xmlns:Iptc4xmpExt={quoteattr(IPTC_NS)}"
        f" xmlns:studio={quoteattr(STUDIO_NS)}>"
        + "".join(properties)
        + "</rdf:Description></rdf:RDF></x:xmpmeta>"
        '<?xpacket end="w"?>'
    ).encode()


@dataclass(slots=True)
class XmpFacts:
    """What XMP packets say: every TC260 value, source type and label record."""

    aigc: list[str] = field(default_factory=list)
    source_types: list[str] = field(default_factory=list)
    explicit: list[str] = field(default_factory=list)

    def add(self, packet: bytes) -> None:
        """Read one packet; element and attribute forms both count."""
        try:
            root = ElementTree.fromstring(packet.strip(b"\x00 \t\r\n"))
        except ElementTree.ParseError:
            return
        wanted = {
            f"{{{TC260_NS}}}AIGC": self.aigc,
            f"{{{IPTC_NS}}}DigitalSourceType": self.source_types,
            f"{{{STUDIO_NS}}}ExplicitLabel": self.explicit,
        }
        for element in root.iter():
            if element.tag in wanted and element.text:
                wanted[element.tag].append(element.text.strip())
            for name, value in element.attrib.items():
                if name in wanted:
                    wanted[name].append(value.strip())
