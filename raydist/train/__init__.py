"""raydist.train."""
