"""The personalized reward as a service: typed config and request/response schema (no Ray, no torch here; the
Ray Serve deployment lives in ``workers/reward_service.py``)."""
