"""fairpool_engine: placeholder package, filled in by its own component."""
