"""The prompts file: one line parsed and checked (``lines``), the whole file scanned and sharded (``scan``)."""
