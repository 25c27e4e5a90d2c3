"""`pr-rlhf leaderboard`: every personalized reward model on the same pairs (:mod:`pr_rlhf.leaderboard.data`) and
one table of them (:mod:`pr_rlhf.leaderboard.board`); the driver is ``workers/leaderboard.py``."""
