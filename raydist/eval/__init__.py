"""raydist.eval."""
