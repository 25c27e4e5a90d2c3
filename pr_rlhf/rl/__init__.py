"""The RL side of the library that needs no Ray: prompt loading for rollouts and sequence packing. The loop that
drives the Ray workers is ``workers/rl_loop.py``; the actors are in ``workers/``."""
