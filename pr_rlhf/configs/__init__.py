"""Every typed setting of a recipe, one module per section (pydantic and yaml only: never torch or Ray).

``base`` holds the strict model and the pieces several sections share (engines, sampling, the scalar RM);
``recipe`` assembles the root recipe, loads YAML and applies dotted overrides; ``inherit`` fills the fields a
section leaves unset from the nearest enclosing section that declares them (the root's ``seed`` and ``world``).
Engines and reward scorers are discriminated unions (one member per ``backend`` / ``kind``): fields are typed
``EngineConfig`` / ``RewardConfig``, code builds them with ``engine_config(...)`` / ``reward_config(...)``.
This package is the bottom layer: it imports nothing else from ``pr_rlhf``.
"""
