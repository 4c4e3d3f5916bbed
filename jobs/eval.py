"""`ray job submit --working-dir . -- python jobs/eval.py ...`: same as `raydist eval ...`.

Inside a job, Ray is joined through RAY_ADDRESS; run directly, a local Ray instance is started.
"""

import sys

from raydist.cli import main

sys.exit(main(["eval", *sys.argv[1:]]))
