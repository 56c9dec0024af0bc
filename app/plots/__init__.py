"""pyqtgraph plots of one tensor: histogram with the quantization grid, channel ranges, channel error."""
