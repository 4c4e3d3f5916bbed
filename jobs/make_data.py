"""`ray job submit --working-dir . -- python jobs/make_data.py ...`: same as `raydist make-data ...`.

Inside a job, Ray is joined through RAY_ADDRESS; run directly, a local Ray instance is started.
"""

import sys

from raydist.cli import main

sys.exit(main(["make-data", *sys.argv[1:]]))
