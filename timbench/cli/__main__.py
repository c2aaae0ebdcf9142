"""`python -m timbench.cli ...`: the `timbench` command."""

import sys

from . import main

sys.exit(main())
