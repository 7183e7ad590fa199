"""`python -m dsv4`: the command line (dsv4.cli)."""

import sys

from .cli import main

sys.exit(main())
