"""raydist: Ray-native distributed training of retrieval embeddings."""

__version__ = "0.1.0"
