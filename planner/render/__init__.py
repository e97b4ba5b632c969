"""Terminal and JSON output. The only package that imports rich."""
