"""Packages: ``raydist*``, plus the top-level ``tune_spaces/`` and ``jobs/`` folders installed as
``raydist.tune_spaces`` and ``raydist.jobs``, so an installed raydist has its sweep spaces and job entry
points. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

SHIPPED_FOLDERS = {"raydist.tune_spaces": "tune_spaces", "raydist.jobs": "jobs"}

setup(packages=[*find_packages(include=["raydist*"]), *SHIPPED_FOLDERS], package_dir=SHIPPED_FOLDERS)
