"""raydist.models."""
