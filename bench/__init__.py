"""Benchmarks: each script measures ours against a baseline in one run and ends with a ``BENCH`` line
(``bench/common.py``); ``bench/suite.py`` runs them all and writes docs/results/bench.{json,md}."""
