"""The RL side of the library that needs no Ray: prompt loading for rollouts, sequence packing, and the learner's
batch layout, models, forward passes, losses and update metrics. The loop that drives the Ray workers is
``workers/rl_loop.py``; the actors are in ``workers/`` (the learner ranks: ``workers/learner/``)."""
