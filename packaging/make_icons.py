"""Render the Verbatim app icon in every size from the one source image, packaging/icon.svg.

    python packaging/make_icons.py        (or: make icons)

Writes packaging/icons/verbatim-{16,32,64,128,256,512,1024}.png (briefcase's Linux/Windows
naming), packaging/icons/verbatim.icns (macOS: PNG entries for 16-1024 incl. @2x, the format
briefcase's macOS template copies into the .app), and resources/icons/verbatim.png (256 px,
the window icon the GUI loads). Qt renders the SVG offscreen; no display needed.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "packaging" / "icon.svg"
ICONS = ROOT / "packaging" / "icons"
WINDOW_ICON = ROOT / "resources" / "icons" / "verbatim.png"
SIZES = (16, 32, 64, 128, 256, 512, 1024)

# ICNS element types holding PNG data, by pixel size (Apple's icns format; `ic11`-`ic14` are
# the @2x variants of 16/32/128/256 and share pixel sizes with the @1x types).
ICNS_TYPES = [
    (b"icp4", 16),
    (b"ic11", 32),
    (b"icp5", 32),
    (b"ic12", 64),
    (b"icp6", 64),
    (b"ic07", 128),
    (b"ic13", 256),
    (b"ic08", 256),
    (b"ic14", 512),
    (b"ic09", 512),
    (b"ic10", 1024),
]


def render(size: int) -> bytes:
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(SOURCE))
    if not renderer.isValid():
        raise SystemExit(f"cannot parse {SOURCE}")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(data.data())


def write_icns(path: Path, pngs: dict[int, bytes]) -> None:
    chunks = b"".join(
        kind + struct.pack(">I", 8 + len(pngs[size])) + pngs[size] for kind, size in ICNS_TYPES
    )
    path.write_bytes(b"icns" + struct.pack(">I", 8 + len(chunks)) + chunks)


def main() -> int:
    if sys.platform.startswith("linux"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])  # noqa: F841 - Qt needs one
    ICONS.mkdir(parents=True, exist_ok=True)
    pngs = {size: render(size) for size in SIZES}
    for size, data in pngs.items():
        (ICONS / f"verbatim-{size}.png").write_bytes(data)
    write_icns(ICONS / "verbatim.icns", pngs)
    WINDOW_ICON.parent.mkdir(parents=True, exist_ok=True)
    WINDOW_ICON.write_bytes(pngs[256])
    print(f"wrote {len(pngs)} PNGs + verbatim.icns to {ICONS.relative_to(ROOT)}, and {WINDOW_ICON.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
