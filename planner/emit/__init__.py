"""Launch commands, one module per engine: layout + specs -> argv lists (never shell strings)."""
