"""Bradley-Terry scalar reward models: their training pairs (:mod:`pr_rlhf.rm.data`) and the per-mode report
(:mod:`pr_rlhf.rm.report`). The training loop runs on the learner ranks (``workers/rm_training.py``)."""
