"""pr_rlhf.tracking: secret filtering, key sanitizing, and a real mlflow sqlite backend in tmp_path."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pr_rlhf.tracking import (
    NullTracker,
    Tracker,
    flatten_params,
    is_secret_key,
    looks_secret_value,
    make_tracker,
    prepare_metrics,
    prepare_params,
    resolve_uri,
    sanitize_key,
)

SECRET = "sk-THISisAfakeSECRETvalue1234567890"


@pytest.mark.parametrize("key", ["api_key", "openai.api_key", "OPENAI_API_KEY", "apiKey", "hf_token",
                                 "access_token", "auth.token", "db.password", "client_secret", "secrets.x",
                                 "aws_access_key_id", "private_key", "eval.judge.api_key_env", "Authorization"])
def test_secret_keys_detected(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["max_tokens", "generation.max_tokens", "tokenizer", "eval.judge.model",
                                 "num_tokens_per_s", "keyword", "monkey", "top_k", "data.retrieval.top_k"])
def test_ordinary_keys_kept(key):
    assert not is_secret_key(key)


def test_secret_values_detected():
    assert looks_secret_value(SECRET)
    assert looks_secret_value("hf_" + "a1B2" * 8)
    assert looks_secret_value("Bearer abcdefghijklmnop")
    assert looks_secret_value("https://user:hunter2@example.com/x")
    assert not looks_secret_value("http://127.0.0.1:8000/v1")
    assert not looks_secret_value("runs/quickstart/data")
    assert not looks_secret_value(0.5)


def test_flatten_and_prepare_params():
    params = {"name": "r", "eval": {"judge": {"model": "tiny", "api_key": SECRET, "api_key_env": "OPENAI_API_KEY",
                                              "base_url": "http://127.0.0.1:8000/v1"},
                                    "modes": ["pointwise", "pairwise"], "max_pairs": None},
              "generation": {"max_tokens": 256}, "data": {"options": {}}, "hf_token": "x",
              "notes": SECRET}
    flat = flatten_params(params)
    assert flat["eval.judge.model"] == "tiny" and flat["data.options"] == "{}"
    kept, dropped = prepare_params(params)
    assert kept["eval.judge.model"] == "tiny"
    assert kept["eval.modes"] == "[pointwise, pairwise]"
    assert kept["eval.max_pairs"] == "None"
    assert kept["generation.max_tokens"] == "256"
    assert kept["eval.judge.base_url"] == "http://127.0.0.1:8000/v1"
    assert set(dropped) == {"eval.judge.api_key", "eval.judge.api_key_env", "hf_token", "notes"}
    assert SECRET not in repr(kept) and SECRET not in repr(dropped)


@pytest.mark.parametrize("raw,clean", [
    ("eval/accuracy", "eval/accuracy"),
    ("bon/best@128", "bon/best_128"),
    ("bon/best_of_128", "bon/best_of_128"),
    ("acc (A)", "acc__A_"),
    ("a//b/", "a/b"),
    ("/lead", "lead"),
    ("x/./y", "x/y"),
    ("x/../y", "x/__/y"),
    ("subset:Art", "subset_Art"),
    ("é", "_"),
])
def test_sanitize_key(raw, clean):
    assert sanitize_key(raw) == clean


def test_prepare_metrics():
    assert prepare_metrics({"a@1": 1, "b": True, "c": None, "d": 0.5}) == {"a_1": 1.0, "b": 1.0, "d": 0.5}
    with pytest.raises(ValueError, match="collide"):
        prepare_metrics({"a@1": 1, "a_1": 2})
    with pytest.raises(TypeError):
        prepare_metrics({"a": "high"})


def test_resolve_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_uri(None, tmp_path) == f"sqlite:///{(tmp_path.resolve() / 'mlflow.db').as_posix()}"
    assert resolve_uri(None, tmp_path).startswith("sqlite:////")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/m.db")
    assert resolve_uri(None, tmp_path) == "sqlite:////elsewhere/m.db"
    assert resolve_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"


def test_null_tracker_same_api():
    t = make_tracker(None, "unused", "r")
    assert isinstance(t, NullTracker) and not isinstance(t, Tracker)
    with t as tt:
        assert tt.log_params({"a": {"b": 1}, "token": "x"}) == {"a.b": "1"}
        assert tt.log_metrics({"x@1": 2}, step=3) == {"x_1": 2.0}
        tt.log_artifact("does-not-matter")
        tt.log_figure(None, "f.png")
        tt.set_tags({"k": "v"})
    assert tt.dropped_params == ["token"]
    cfg = SimpleNamespace(mlflow_uri=None, experiment="e", enabled=False)
    assert isinstance(make_tracker(cfg, "d", "r"), NullTracker)
    assert type(make_tracker(SimpleNamespace(mlflow_uri=None, experiment="e"), "d", "r")) is Tracker


def test_import_is_lazy():
    code = ("import sys, pr_rlhf.tracking as t; n = t.NullTracker(); n.log_params({'a': 1}); "
            "assert 'mlflow' not in sys.modules, 'mlflow imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_tracker_sqlite_roundtrip(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    run_dir = tmp_path / "run"
    report = tmp_path / "report.md"
    report.write_text("| a | b |\n")

    with Tracker(None, "pr_rlhf_test", run_dir, "eval-1", tags={"recipe": "quickstart"}) as t:
        assert t.tracking_uri.startswith("sqlite:") and (run_dir / "mlflow.db").exists()
        logged = t.log_params({"eval": {"judge": {"model": "tiny", "api_key": SECRET}, "n_bootstrap": 1000},
                               "generation": {"max_tokens": 256}, "token": SECRET})
        assert "eval.judge.api_key" not in logged
        t.log_metrics({"eval/accuracy": 0.73, "bon/best@128": 0.61, "skip": None})
        t.log_metrics({"train/loss": 1.0}, step=0)
        t.log_metrics({"train/loss": 0.5}, step=1)
        t.log_artifact(report)
        fig = Figure()
        fig.add_subplot(1, 1, 1).plot([0, 1], [0, 1])
        t.log_figure(fig, "plots/line.png")
        run_id = t.run_id

    client = MlflowClient(tracking_uri=t.tracking_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "eval-1"
    assert run.data.tags["recipe"] == "quickstart"
    params = run.data.params
    assert params["eval.judge.model"] == "tiny"
    assert params["eval.n_bootstrap"] == "1000"
    assert params["generation.max_tokens"] == "256"
    assert "eval.judge.api_key" not in params and "token" not in params
    assert all(SECRET not in v for v in params.values())
    metrics = run.data.metrics
    assert metrics["eval/accuracy"] == pytest.approx(0.73)
    assert metrics["bon/best_128"] == pytest.approx(0.61)
    assert "skip" not in metrics
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.5)]
    # artifacts live inside the run dir; nothing lands in the cwd
    arts = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "plots")}
    assert {"report.md", "plots/line.png"} <= arts
    assert (run_dir / "mlartifacts").is_dir()
    assert list(cwd.iterdir()) == []
    # the secret is nowhere in the database
    assert SECRET.encode() not in (run_dir / "mlflow.db").read_bytes()


def test_tracker_failed_run_and_env_uri(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    shared = tmp_path / "shared.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{shared.as_posix()}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), Tracker(None, "exp", tmp_path / "run", "failing") as t:
        t.log_metrics({"x": 1})
        raise RuntimeError("boom")
    assert shared.exists() and not (tmp_path / "run" / "mlflow.db").exists()
    assert MlflowClient(tracking_uri=t.tracking_uri).get_run(t.run_id).info.status == "FAILED"
    assert not (tmp_path / "mlruns").exists()
    with pytest.raises(RuntimeError, match="not open"):
        Tracker(None, "exp", tmp_path / "run", "closed").log_metrics({"x": 1})
