"""pr_rlhf: Ray-distributed RLHF for personalized reward models."""
__version__ = "0.1.0"
