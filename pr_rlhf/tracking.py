"""A small mlflow wrapper: one run per context, offline by default, no secrets, no ./mlruns.

    with Tracker(None, "pr_rlhf", run_dir, "eval-quickstart") as t:
        t.log_params(recipe.model_dump())          # nested -> dotted keys; secret-looking keys dropped
        t.log_metrics({"eval/accuracy": 0.73})     # keys sanitized (no '@')
        t.log_artifact(run_dir / "report.md")

URI resolution: explicit ``uri`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<run_dir>/mlflow.db``. For a local
backend (sqlite or file) a *new* experiment gets its artifact location inside ``run_dir`` (``<run_dir>/mlartifacts``),
so nothing lands in ``./mlruns``; an existing experiment keeps the artifact location it was created with, and a
remote server (http, databricks, ...) chooses its own.

The wrapper uses :class:`mlflow.tracking.MlflowClient` with an explicit run id (no fluent global state, so it is
safe in Ray workers and tests) and imports mlflow lazily: ``import pr_rlhf.tracking`` is instant, and
:class:`NullTracker` (tracking disabled) never imports mlflow at all.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

ENV_URI = "MLFLOW_TRACKING_URI"
DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"

MAX_KEY_LENGTH = 250          # mlflow's limit on param / metric keys
MAX_PARAM_VALUE_LENGTH = 6000  # mlflow 3's limit on param values
_BATCH = 100                  # mlflow allows 100 params/tags and 1000 metrics per batch

# ---------------------------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------------------------

_SECRET_WORDS = {"token", "secret", "secrets", "password", "passwd", "passphrase", "pwd", "apikey",
                 "credential", "credentials", "authorization", "cookie"}
_SECRET_PHRASES = (("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "key"))
_SECRET_VALUE = re.compile(
    r"(^|\s)(sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.)"
    r"|bearer\s+\S{8,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|[a-z][a-z0-9+.\-]*://[^/\s:@]+:[^/\s@]+@",    # a URL with user:password
    re.IGNORECASE)


def _words(key: str) -> list[str]:
    """'maxTokens' -> ['max', 'tokens']; 'api_key_env' -> ['api', 'key', 'env']."""
    key = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", key.lower()) if w]


def is_secret_key(key: str) -> bool:
    """True when any part of a (dotted) key names a secret: a word token/secret/password/... or the phrase
    api_key / access_key / private_key. Whole words only, so ``max_tokens`` and ``tokenizer`` are kept, while
    ``hf_token``, ``OPENAI_API_KEY``, ``apiKey`` and ``db.password`` are dropped."""
    words = _words(key)
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(words[i:i + 2] == list(p) for p in _SECRET_PHRASES for i in range(len(words) - 1))


def looks_secret_value(value: Any) -> bool:
    """True for values shaped like credentials: provider key prefixes (sk-, hf_, ghp_, AKIA...), JWTs, bearer
    headers, PEM private keys, URLs with user:password."""
    return isinstance(value, str) and bool(_SECRET_VALUE.search(value))


# ---------------------------------------------------------------------------------------------------------------
# Keys and values
# ---------------------------------------------------------------------------------------------------------------

def sanitize_key(key: str) -> str:
    """A key mlflow accepts on every platform: characters outside ``[A-Za-z0-9_./-]`` (``@``, spaces, colons,
    non-ASCII, ...) become ``_``; repeated or edge slashes and ``.``/``..`` path segments, which mlflow refuses
    as "not unique", are cleaned; at most 250 characters. ``bon/best@128`` -> ``bon/best_128``."""
    key = re.sub(r"[^A-Za-z0-9_./\-]", "_", str(key))
    parts = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        parts.append("_" * len(part) if part == ".." else part)
    key = "/".join(parts) or "_"
    return key[:MAX_KEY_LENGTH]


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys: ``{"eval": {"judge": {"model": "x"}}}`` -> ``{"eval.judge.model": "x"}``.
    An empty mapping becomes ``"{}"`` under its own key; other values are kept as they are."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            if v:
                out.update(flatten_params(v, key))
            else:
                out[key] = "{}"
        else:
            out[key] = v
    return out


def prepare_params(params: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Flatten, drop secrets, stringify. Returns (params to log, dropped keys); values of dropped keys are never
    returned. A value is dropped when its key looks secret or the value itself looks like a credential."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for key, value in flatten_params(params).items():
        text = _param_text(value)
        if is_secret_key(key) or looks_secret_value(text):
            dropped.append(key)
            continue
        safe = sanitize_key(key)
        if safe in kept:
            raise ValueError(f"param keys collide after sanitizing: {key!r} -> {safe!r}")
        kept[safe] = text[:MAX_PARAM_VALUE_LENGTH]
    return kept, dropped


def _param_text(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_param_text(v) for v in value) + "]"
    return str(value)


def prepare_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Sanitized keys and float values; None values are skipped; NaN/inf kept (mlflow stores them). Raises on
    two keys that sanitize to the same name and on non-numeric values."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if value is None:
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {key!r}: value {value!r} is not a number") from None
        safe = sanitize_key(key)
        if safe in out:
            raise ValueError(f"metric keys collide after sanitizing: {key!r} -> {safe!r}")
        out[safe] = v
    return out


def resolve_uri(uri: str | None, run_dir: str | Path) -> str:
    """Explicit ``uri`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<run_dir>/mlflow.db`` (absolute path)."""
    if uri:
        return uri
    env = os.environ.get(ENV_URI, "").strip()
    if env:
        return env
    return f"sqlite:///{(Path(run_dir).resolve() / DB_FILE).as_posix()}"     # POSIX: sqlite:////abs/path


def _is_local(uri: str) -> bool:
    scheme = uri.split(":", 1)[0].lower() if "://" in uri else "file"
    return scheme in ("sqlite", "file")


# ---------------------------------------------------------------------------------------------------------------
# Trackers
# ---------------------------------------------------------------------------------------------------------------

class NullTracker:
    """Tracking disabled: the same API as :class:`Tracker`, records nothing, never imports mlflow. Its
    ``log_params`` / ``log_metrics`` still validate and return what would have been logged."""

    run_id: str | None = None
    tracking_uri: str | None = None
    artifact_uri: str | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        self.dropped_params: list[str] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def log_params(self, params: Mapping[str, Any]) -> dict[str, str]:
        kept, dropped = prepare_params(params)
        self.dropped_params += dropped
        return kept

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, float]:
        return prepare_metrics(metrics)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        return None

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        return None

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        return None


class Tracker(NullTracker):
    """One mlflow run, opened on ``__enter__`` and closed on ``__exit__`` (FINISHED, or FAILED on an exception,
    KILLED on KeyboardInterrupt)."""

    def __init__(self, uri: str | None, experiment: str, run_dir: str | Path, run_name: str,
                 tags: Mapping[str, Any] | None = None):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.tracking_uri = resolve_uri(uri, run_dir)
        self.run_id = None
        self.experiment_id: str | None = None
        self._client = None

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        from mlflow.tracking import MlflowClient  # lazy: importing mlflow takes ~2 s

        self.run_dir.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=self.tracking_uri)
        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            location = (self.run_dir.resolve() / ARTIFACT_DIR).as_uri() if _is_local(self.tracking_uri) else None
            self.experiment_id = client.create_experiment(self.experiment, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id
        tags = {k: _param_text(v) for k, v in self.tags.items() if not is_secret_key(k)}
        run = client.create_run(self.experiment_id, run_name=self.run_name, tags=tags or None)
        self._client = client
        self.run_id = run.info.run_id
        self.artifact_uri = run.info.artifact_uri
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._client is None or self.run_id is None:
            return
        status = "FINISHED" if exc_type is None else ("KILLED" if exc_type is KeyboardInterrupt else "FAILED")
        self._client.set_terminated(self.run_id, status=status)
        self._client = None
        return

    def _require(self):
        if self._client is None:
            raise RuntimeError("Tracker is not open: use it as a context manager (`with Tracker(...) as t:`)")
        return self._client

    # -- logging -----------------------------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Flatten nested dicts to dotted keys, drop secret-looking entries, log the rest; returns what was
        logged. Param values are immutable in mlflow: logging a key again with another value raises."""
        from mlflow.entities import Param

        client = self._require()
        kept = super().log_params(params)
        items = [Param(k, v) for k, v in kept.items()]
        for i in range(0, len(items), _BATCH):
            client.log_batch(self.run_id, params=items[i:i + _BATCH])
        return kept

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, float]:
        """Log numeric metrics (keys sanitized, None skipped) at ``step`` (0 when None); returns what was
        logged."""
        from mlflow.entities import Metric

        client = self._require()
        clean = prepare_metrics(metrics)
        ts = int(time.time() * 1000)
        items = [Metric(k, v, ts, int(step or 0)) for k, v in clean.items()]
        for i in range(0, len(items), 10 * _BATCH):
            client.log_batch(self.run_id, metrics=items[i:i + 10 * _BATCH])
        return clean

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        client = self._require()
        items = [RunTag(sanitize_key(k), _param_text(v)[:MAX_PARAM_VALUE_LENGTH]) for k, v in tags.items()
                 if not is_secret_key(k) and not looks_secret_value(_param_text(v))]
        for i in range(0, len(items), _BATCH):
            client.log_batch(self.run_id, tags=items[i:i + _BATCH])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a file or a directory into the run's artifacts (under ``artifact_path`` when given)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"artifact {path} does not exist")
        client = self._require()
        if path.is_dir():
            client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            client.log_artifact(self.run_id, str(path), artifact_path)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib figure as an artifact, e.g. ``log_figure(fig, "plots/accuracy.png")``."""
        self._require().log_figure(self.run_id, figure, artifact_file)


def make_tracker(tracking: Any, run_dir: str | Path, run_name: str, enabled: bool = True,
                 tags: Mapping[str, Any] | None = None) -> Tracker | NullTracker:
    """A :class:`Tracker` from a ``TrackingConfig`` (fields ``mlflow_uri``, ``experiment``, optionally
    ``enabled``), or a :class:`NullTracker` when tracking is off (``enabled=False``, ``tracking`` None, or
    ``tracking.enabled`` False)."""
    if tracking is None or not enabled or not getattr(tracking, "enabled", True):
        return NullTracker()
    return Tracker(tracking.mlflow_uri, tracking.experiment, run_dir, run_name, tags=tags)
