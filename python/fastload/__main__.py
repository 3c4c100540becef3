"""`python -m fastload` runs the command-line interface."""

import sys

from fastload.cli import main

sys.exit(main())
