"""raydist.tune."""
