"""Sessions: the state of one trajectory (pure; no I/O, no web framework)."""
