"""`ray job submit --working-dir . -- python jobs/train.py ...`: same as `raydist train ...`.

Inside a job, Ray is joined through RAY_ADDRESS; run directly, a local Ray instance is started.
"""

import sys

from raydist.cli import main

sys.exit(main(["train", *sys.argv[1:]]))
