"""`python -m dpsql.cli`: the `dpsql` command, as the console script runs it."""

import sys

from dpsql.cli import main

sys.exit(main())
