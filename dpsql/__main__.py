"""`python -m dpsql`: the `dpsql` command (dpsql/cli/), as the console script runs it."""

import sys

from dpsql.cli import main

sys.exit(main())
