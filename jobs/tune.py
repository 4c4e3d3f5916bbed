"""`ray job submit --working-dir . -- python jobs/tune.py tune_spaces/margin.yaml ...`: same as
`raydist tune ...`. Inside a job, Ray is joined through RAY_ADDRESS; run directly, a local Ray
instance is started."""

import sys

from raydist.cli import main

sys.exit(main(["tune", *sys.argv[1:]]))
