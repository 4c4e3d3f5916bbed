"""`ray job submit` entry points, installed as ``raydist.jobs``: ``python jobs/train.py ...`` in a checkout
(with ``--working-dir .``), ``python -m raydist.jobs.train ...`` wherever raydist is installed."""
