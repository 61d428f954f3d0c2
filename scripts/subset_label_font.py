"""Cut the bundled label font down to the glyphs the explicit label draws.

Run once when the label text changes, with Debian's fonts-noto-cjk unpacked
(fonttools is a dev dependency):
    python scripts/subset_label_font.py \
        /usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc
The subset (a Modified Version under the SIL OFL 1.1) is renamed, as the licence
asks of modified fonts, and written beside its licence in service/labels/fonts/.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from fontTools.subset import Options, Subsetter
from fontTools.ttLib import TTCollection

TEXT: Final = "AI生成"
FAMILY: Final = "Liuguang Label Sans"
OUT: Final = (
    Path(__file__).resolve().parent.parent / "service/labels/fonts/label-sans-bold.otf"
)


def main(collection: str) -> None:
    """Take the Simplified Chinese face of the collection, keep TEXT's glyphs."""
    faces = TTCollection(collection).fonts
    font = next(f for f in faces if f["name"].getDebugName(4).endswith("CJK SC Bold"))
    options = Options()
    options.layout_features = ["kern", "palt"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    subsetter = Subsetter(options)
    subsetter.populate(text=TEXT)
    subsetter.subset(font)
    names = font["name"]
    for record in list(names.names):
        if record.nameID in (1, 4, 16):
            names.setName(
                FAMILY + (" Bold" if record.nameID == 4 else ""),
                record.nameID,
                record.platformID,
                record.platEncID,
                record.langID,
            )
        elif record.nameID == 6:
            names.setName(
                "LiuguangLabelSans-Bold",
                6,
                record.platformID,
                record.platEncID,
                record.langID,
            )
    if "CFF " in font:  # the outline table keeps its own PostScript name
        font["CFF "].cff.fontNames = ["LiuguangLabelSans-Bold"]
    font.save(OUT)
    print(f"{OUT}: {OUT.stat().st_size} bytes, {len(font.getGlyphOrder())} glyphs")


if __name__ == "__main__":
    main(sys.argv[1])
