"""Number formatting shared by every view (Qt-free)."""

from __future__ import annotations

import math


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "…"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B" or abs(n) >= 100:
                return f"{n:.0f} {unit}"
            return f"{n:.1f} {unit}" if abs(n) >= 10 else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def fmt_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e4:
        return f"{n / 1e3:.1f} K"
    return f"{n:,d}"


def fmt_shape(shape) -> str:
    return " × ".join(str(int(s)) for s in shape) if len(shape) else "scalar"


def db_text(v: float | None) -> str:
    """An SQNR with its unit: "20.98 dB"; "exact" (no unit: an error of 0), "…", "n/a"."""
    t = fmt_db(v)
    return f"{t} dB" if v is not None and math.isfinite(v) else t


def fmt_db(v: float | None) -> str:
    if v is None:
        return "…"
    if math.isinf(v):
        return "exact" if v > 0 else "-inf"
    if math.isnan(v):
        return "n/a"
    return f"{v:.2f}"


def fmt_float(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "…"
    if math.isnan(v):
        return "n/a"
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}" if abs(v) >= 1 else f"{v:.{digits}f}"


def fmt_gbs(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def plural(n: int, word: str) -> str:
    """'1 tensor', '2 tensors'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def shorten_name(text: str, fits) -> str:
    """A dotted tensor name shortened until `fits(text)`: leading components are abbreviated
    to their first letter, left to right, keeping the last two whole
    ('attention.output.LayerNorm.bias' -> 'a.output.LayerNorm.bias' -> 'a.o.LayerNorm.bias'),
    so names that differ early stay different ('output.LayerNorm.bias' -> 'o.LayerNorm.bias');
    eliding on the left alone gave '…LayerNorm.bias' for both. Returns the last form tried
    when none fits (the delegate then elides its middle)."""
    if fits(text) or "." not in text:
        return text
    parts = text.split(".")
    # the last two components stay whole ('LayerNorm.bias'); of a two-part name the last
    # ('model.embed_tokens' -> 'm.embed_tokens')
    for i in range(max(len(parts) - 2, 1)):
        if len(parts[i]) > 1 and not parts[i].isdigit():
            parts[i] = parts[i][0]
            short = ".".join(parts)
            if fits(short):
                return short
    return ".".join(parts)


def tail_elide_delegate(parent=None):
    """An item delegate for tensor names: abbreviated from the left (`shorten_name`); when
    that is still too wide its middle is elided ('a.o.Lay…m.bias'); names never abbreviated
    elide on the left (the distinguishing tail stays). The full name is the cell's tooltip."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QStyle, QStyledItemDelegate

    class _TailElide(QStyledItemDelegate):
        _memo: dict = {}      # (text, room, font) -> (shown text, elide mode)

        def initStyleOption(self, option, index):
            super().initStyleOption(option, index)
            option.textElideMode = Qt.TextElideMode.ElideLeft
            text = option.text
            if text:
                if option.widget is not None:    # the rectangle the style draws the text in,
                    style = option.widget.style()  # less the margins it lays the text out in
                    room = style.subElementRect(
                        QStyle.SubElement.SE_ItemViewItemText, option, option.widget).width() \
                        - 2 * (style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None,
                                                 option.widget) + 1)
                else:
                    room = option.rect.width() - 8
                key = (text, room, option.font.key())
                hit = self._memo.get(key)
                if hit is None:
                    fm = option.fontMetrics
                    short = shorten_name(text, lambda t: fm.horizontalAdvance(t) <= room)
                    mode = Qt.TextElideMode.ElideLeft
                    if fm.horizontalAdvance(short) > room and short != text:
                        # still too wide: elide its middle, so the abbreviated head (which
                        # tells 'a.o.LayerNorm.bias' from 'o.LayerNorm.bias') and the tail stay
                        mode = Qt.TextElideMode.ElideMiddle
                    if len(self._memo) > 20000:
                        self._memo.clear()
                    hit = self._memo[key] = (short, mode)
                option.text, option.textElideMode = hit

    return _TailElide(parent)
