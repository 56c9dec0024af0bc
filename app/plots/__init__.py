"""pyqtgraph plots of one tensor: histogram with the quantization grid, channel ranges, channel error
(the fast drawing paths are described in app.perf)."""


def fix_axes(item, left_text: str = "-0.0005") -> None:
    """Fast path (app.perf): a fixed left-axis width (tick labels like `left_text` plus the
    rotated axis label) and bottom-axis height. pyqtgraph otherwise resizes an axis to each
    tensor's widest tick label or SI-prefixed label, which re-lays out the plot and paints
    it again."""
    from .. import perf
    if not perf.FAST:
        return
    axis = item.getAxis("left")
    fm = axis.fontMetrics() if hasattr(axis, "fontMetrics") else None
    if fm is None:
        from PySide6.QtGui import QFontMetrics
        from PySide6.QtWidgets import QApplication
        fm = QFontMetrics(QApplication.font())
    axis.setWidth(fm.horizontalAdvance(left_text) + fm.height() + 16)
    bottom = item.getAxis("bottom")
    bottom.setHeight(2 * fm.lineSpacing() + 6)
