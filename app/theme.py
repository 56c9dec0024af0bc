"""Look and feel: bundled fonts, the style sheet, colours for tiers and error levels."""

from __future__ import annotations

import math
from pathlib import Path

from PySide6.QtGui import QColor, QFont, QFontDatabase

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
FONT_DIR = RESOURCES / "fonts"
STYLE_SHEET = RESOURCES / "style.qss"

UI_FAMILY = "DejaVu Sans"
MONO_FAMILY = "DejaVu Sans Mono"

BACKGROUND = "#1b1e24"
PANEL = "#22262e"
FOREGROUND = "#c9ced8"
MUTED = "#8a92a3"
ACCENT = "#4c9aff"

GOOD = "#3fb950"     # SQNR >= 25 dB
FAIR = "#d29922"     # 15 .. 25 dB
POOR = "#f85149"     # < 15 dB

# tier colours, by nominal bits (>=16, >=8, >=4, less)
TIER_COLOURS = ["#7aa2f7", "#2ac3de", "#9ece6a", "#ff9e64", "#bb9af7", "#f7768e"]

_fonts_loaded = False


def load_fonts() -> None:
    """Register the bundled DejaVu fonts so text renders offscreen and on bare systems."""
    global _fonts_loaded
    if _fonts_loaded:
        return
    for ttf in sorted(FONT_DIR.glob("*.ttf")):
        QFontDatabase.addApplicationFont(str(ttf))
    _fonts_loaded = True


def ui_font(size: float = 9.5) -> QFont:
    f = QFont(UI_FAMILY)
    f.setPointSizeF(size)
    return f


def mono_font(size: float = 9.0) -> QFont:
    f = QFont(MONO_FAMILY)
    f.setStyleHint(QFont.StyleHint.Monospace)
    f.setPointSizeF(size)
    return f


def style_sheet() -> str:
    try:
        text = STYLE_SHEET.read_text(encoding="utf-8")
    except OSError:
        return ""
    # url(...) in a style sheet is relative to the working folder: make it absolute
    return text.replace("@RESOURCES@", RESOURCES.as_posix())


def apply(app) -> None:
    """Fonts, style sheet and pyqtgraph colours for a QApplication."""
    load_fonts()
    app.setFont(ui_font())
    app.setStyle("Fusion")
    app.setStyleSheet(style_sheet())
    import pyqtgraph as pg
    pg.setConfigOptions(antialias=True, background=PANEL, foreground=FOREGROUND)


def sqnr_colour(db: float | None) -> QColor | None:
    """Green / amber / red by SQNR; None when unknown; green for an exact (inf) result."""
    if db is None or (isinstance(db, float) and math.isnan(db)):
        return None
    if db >= 25:
        return QColor(GOOD)
    if db >= 15:
        return QColor(FAIR)
    return QColor(POOR)


def tier_colour(index: int) -> QColor:
    return QColor(TIER_COLOURS[index % len(TIER_COLOURS)])
