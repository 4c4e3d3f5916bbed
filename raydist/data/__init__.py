"""raydist.data."""
