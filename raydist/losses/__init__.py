"""raydist.losses."""
