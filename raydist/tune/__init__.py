"""raydist.tune: search spaces from tune_spaces/*.yaml (``space``) and Tune sweeps of full training
runs with results tables and best-config presets (``sweep``, imported lazily: it needs Ray)."""

from raydist.tune.space import Param, Scheduler, SweepSpace, load_space, parse_space, resolve_base_config

__all__ = ["Param", "Scheduler", "SweepSpace", "load_space", "parse_space", "resolve_base_config"]
