"""Training-side configuration (pydantic only; importable without torch or Ray). The Ray workers that use it live
in the top-level ``workers`` package (``workers.learner``)."""
