"""raydist.distributed."""
