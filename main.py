"""Thin entry point: `python main.py ...` is the same as the `quant-workbench` command."""

import sys

from app.entry import main

if __name__ == "__main__":
    sys.exit(main())
