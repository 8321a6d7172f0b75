"""`python -m fairpool_cli`: the `fairpool` command."""

import sys

from fairpool_cli.main import main

sys.exit(main())
