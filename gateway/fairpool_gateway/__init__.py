"""fairpool_gateway: placeholder package, filled in by its own component."""
