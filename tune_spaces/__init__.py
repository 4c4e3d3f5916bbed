"""The shipped search-space files (``*.yaml``), installed as ``raydist.tune_spaces``: ``raydist tune NAME``
finds them by name (``raydist.tune.space.find_space_file``)."""
