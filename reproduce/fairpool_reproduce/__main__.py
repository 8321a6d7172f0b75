"""`python -m fairpool_reproduce`: regenerate docs/results.md (see `fairpool_reproduce.results`)."""

from fairpool_reproduce.results import main

raise SystemExit(main())
