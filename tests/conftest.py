"""Test-session setup: stay offline and on loopback, and keep every temp file private to the run."""
import os

# Nothing may reach a hub; Ray listeners stay on 127.0.0.1.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
