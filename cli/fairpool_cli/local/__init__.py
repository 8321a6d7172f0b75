"""Local mode: the manifests run as processes on this machine (`fairpool up`)."""
