"""``python -m raydist.cli``: the ``raydist`` command."""

import sys

from raydist.cli import main

sys.exit(main())
