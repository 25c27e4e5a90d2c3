"""Reward models under test and their parsers: inputs (what an RM sees), parsing (typed results), judge (pairwise),
sec (P-GenRM evaluation chain), planner (w/ plan), pointwise (generative 1-10), scalar (sequence classification).

Import the submodules directly; this package imports nothing heavy.
"""
