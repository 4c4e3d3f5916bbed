"""Retrieval evaluation: metrics on arrays (retrieval and label metrics, the per-dim / adaptive / funnel report)."""

from raydist.eval.metrics import METRIC_KEYS, format_metrics, retrieval_metrics, retrieval_ranks

__all__ = ["METRIC_KEYS", "format_metrics", "retrieval_metrics", "retrieval_ranks"]
