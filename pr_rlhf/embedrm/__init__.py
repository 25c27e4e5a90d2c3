"""Reward models on frozen text embeddings: the global Bradley-Terry floor and the field's personalized methods
(PAL, LoRe, VPL, GPO), their training, and what a user's state is made of (:mod:`pr_rlhf.embedrm.methods`)."""
