"""Model backends: embedders now (see :mod:`pr_rlhf.models.embedders`); generation engines are added here later.

Kept import-light on purpose: torch and sentence-transformers load only when a backend is used.
"""
