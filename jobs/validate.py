"""`ray job submit --working-dir . -- python jobs/validate.py ...`: same as `raydist validate ...`.

Inside a job, Ray is joined through RAY_ADDRESS; run directly, a local Ray instance is started.
"""

import sys

from raydist.cli import main

sys.exit(main(["validate", *sys.argv[1:]]))
