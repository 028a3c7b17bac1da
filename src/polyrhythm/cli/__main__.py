"""`python -m polyrhythm.cli` is the `polyrhythm` command."""

import sys

from polyrhythm.cli import main

sys.exit(main())
