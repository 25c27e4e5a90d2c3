"""Every typed setting of a recipe, one module per section (pydantic and yaml only: never torch or Ray).

``base`` holds the strict model and the pieces several sections share (engines, sampling, the scalar RM);
``recipe`` assembles the root recipe, loads YAML and applies dotted overrides. This package is the bottom layer:
it imports nothing else from ``pr_rlhf``.
"""
