"""fairpool_operator: placeholder package, filled in by its own component."""
