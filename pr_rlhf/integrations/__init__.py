"""Adapters for other RLHF frameworks (verl); each imports only the standard library at module level."""
