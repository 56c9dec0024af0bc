"""Commands that open windows, registered by app/entry.py (one module per command)."""
