"""Serving a trained model: embeddings and nearest-neighbour search over HTTP with Ray Serve
(:mod:`raydist.serving.service`: requests and answers; :mod:`raydist.serving.deployment`: routes, Ray Serve)."""
