"""When the ``raydist`` command started: set when the CLI package is first imported, before anything it imports
(for "first optimizer step after …")."""

import time

STARTED = time.time()
