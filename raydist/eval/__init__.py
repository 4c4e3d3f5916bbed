"""Retrieval evaluation: metrics and checkpoint evaluation."""

from raydist.eval.metrics import METRIC_KEYS, format_metrics, retrieval_metrics, retrieval_ranks

__all__ = ["METRIC_KEYS", "format_metrics", "retrieval_metrics", "retrieval_ranks"]
