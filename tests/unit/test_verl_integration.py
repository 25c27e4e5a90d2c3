"""verl integration without GPUs: the export of shards as verl's RL parquet, the reward function's request built
from an exported row (valid for the service's schema), and every override of recipes/gpu/verl_ppo.sh composed
against verl's own Hydra config (an unknown or misspelled key fails here, not on the cluster). The reward function
against a running service, through verl's reward manager, is in tests/integration/test_reward_service.py."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.optional import need

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipes" / "gpu" / "verl_ppo.sh"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from data_pipelines.build import ensure_world_shards
    from data_pipelines.verl_export import export_verl
    from pr_rlhf.world import WorldConfig

    tmp = tmp_path_factory.mktemp("verl")
    ensure_world_shards(tmp / "shards", WorldConfig(users=6, cold_start_users=2, history_size=2))
    counts = export_verl(tmp / "shards", tmp / "out", top_k=3)
    return tmp / "out", counts


def test_export_rows_are_verl_shaped(exported):
    import pyarrow.parquet as pq

    out, counts = exported
    assert counts["train"] > 0 and counts["test"] > 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert len(rows) == counts["train"]
    row = rows[0]
    assert row["data_source"].startswith("pr_rlhf/") and row["ability"] == "personalization"
    assert [m["role"] for m in row["prompt"]][-1] == "user"
    assert row["extra_info"]["query"] in row["prompt"][-1]["content"]
    assert len(row["extra_info"]["profile"]) == 3 and row["reward_model"]["ground_truth"] == row["extra_info"]["query"]
    test_users = {r["extra_info"]["user_id"] for r in pq.read_table(out / "test.parquet").to_pylist()}
    assert not test_users & {r["extra_info"]["user_id"] for r in rows}    # held-out users never trained on


def test_reward_request_from_an_exported_row_fits_the_service_schema(exported):
    import pyarrow.parquet as pq

    from pr_rlhf.integrations.verl import _request_body
    from pr_rlhf.serve.schema import ScoreItem

    row = pq.read_table(exported[0] / "test.parquet").to_pylist()[0]
    extra = {**row["extra_info"], "profile": [{**p, "score": 1.5} for p in row["extra_info"]["profile"]]}
    item = ScoreItem.model_validate(_request_body("An answer.", row["reward_model"]["ground_truth"], extra))
    assert item.user_id == row["extra_info"]["user_id"] and len(item.profile) == 3


def test_verl_ppo_script_overrides_compose_with_verls_config():
    verl = need("verl")
    hydra = need("hydra")
    text = SCRIPT.read_text()
    start = text.index("-m verl.trainer.main_ppo") + len("-m verl.trainer.main_ppo")
    body = text[start:text.rindex('"$@"')].replace("\\\n", " ")
    for var, value in {"$data": "/data", "$policy": "/models/policy", "$root": str(ROOT), "${GPUS:-8}": "8",
                       "${NODES:-1}": "1"}.items():
        body = body.replace(var, value)
    with hydra.initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"),
                                     version_base=None):
        cfg = hydra.compose(config_name="ppo_trainer", overrides=shlex.split(body))
    assert cfg.custom_reward_function.name == "compute_score"
    assert Path(cfg.custom_reward_function.path) == ROOT / "pr_rlhf" / "integrations" / "verl.py"
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (128, 8192, 512)
    assert cfg.actor_rollout_ref.actor.optim.lr == 5e-7 and cfg.critic.optim.lr == 5e-6
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.algorithm.use_kl_in_reward is False
    assert cfg.trainer.total_epochs == 1


class ScriptedService:
    """A stand-in reward service on loopback answering each POST /score with the next scripted status (then 200)."""

    def __init__(self, statuses: list[int], retry_after: str = "0", ok_body: dict | None = None) -> None:
        import http.server
        import json
        import threading

        script, seen = list(statuses), []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("content-length", 0)))
                status = script.pop(0) if script else 200
                seen.append(status)
                body = json.dumps((ok_body or {"score": 0.75, "latency_ms": 1.0}) if status == 200 else
                                  {"detail": f"scripted {status}"}).encode()
                self.send_response(status)
                if status == 503:
                    self.send_header("Retry-After", retry_after)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.seen = seen
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


ROW = {"user_id": "u1", "query": "What should I cook?"}


def test_the_verl_adapter_waits_out_a_starting_service():
    """503 + Retry-After (the service starting or restarting) is retried, then the score arrives."""
    from pr_rlhf.integrations.verl import compute_score

    svc = ScriptedService([503, 503, 503])
    try:
        out = compute_score("pr_rlhf", "an answer", None, {**ROW, "reward_url": svc.url})
        assert out["score"] == 0.75 and out["reward_status"] == "ok" and svc.seen == [503, 503, 503, 200]
    finally:
        svc.close()


@pytest.mark.parametrize("extra_info,named", [(None, "extra_info is None"), ({"query": "q"}, "'query'"),
                                              ({"user_id": "u1"}, "'user_id'")])
def test_the_verl_adapter_refuses_a_row_it_cannot_score_naming_its_fields(extra_info, named, monkeypatch):
    """A dataset exported without user ids would otherwise train a whole run on the failure score."""
    from pr_rlhf.integrations.verl import compute_score

    monkeypatch.delenv("PR_RLHF_REWARD_ON_BAD_INPUT", raising=False)
    with pytest.raises(ValueError, match="pr_rlhf reward") as err:
        compute_score("pr_rlhf", "an answer", None, extra_info)
    assert named in str(err.value)
    monkeypatch.setenv("PR_RLHF_REWARD_ON_BAD_INPUT", "score")   # the option: keep the failure score
    kept = compute_score("pr_rlhf", "an answer", None, extra_info)
    assert kept["score"] == 0.0 and kept["reward_status"].startswith("bad_input")


def test_the_verl_adapter_fails_loudly_on_a_request_the_service_refuses(monkeypatch):
    """A 4xx other than 429 cannot be helped by retrying: raised (by default), never scored 0.0 quietly."""
    from pr_rlhf.integrations.verl import compute_score

    monkeypatch.delenv("PR_RLHF_REWARD_ON_BAD_INPUT", raising=False)
    svc = ScriptedService([422])
    try:
        with pytest.raises(ValueError, match="HTTP 422.*scripted 422"):
            compute_score("pr_rlhf", "an answer", None, {**ROW, "reward_url": svc.url})
        assert svc.seen == [422]
    finally:
        svc.close()


def test_the_trl_reward_function_reads_its_columns_and_fails_loudly():
    """PersonalizedReward: conversational prompts and completions, the user and history columns, the service route
    (with retries while it starts), and an unscored completion raising unless a failure score is given."""

    from pr_rlhf.integrations.trl import PersonalizedReward

    class Scorer:
        def __init__(self):
            self.requests = []

        def score(self, requests):
            self.requests += requests
            return [(float(len(r.response)), None) if r.response else (None, "empty") for r in requests]

    scorer = Scorer()
    reward = PersonalizedReward(scorer=scorer)
    history = [{"question": "q0", "chosen": "c", "rejected": "r"}]
    out = reward(prompts=[[{"role": "system", "content": "s"}, {"role": "user", "content": "Cook what?"}]],
                 completions=[[{"role": "assistant", "content": "Curry."}]], user_id=["u1"], history=[history])
    assert out == [6.0]
    request = scorer.requests[0]
    assert (request.user_id, request.question, request.response) == ("u1", "Cook what?", "Curry.")
    assert request.meta["history"] == history
    with pytest.raises(ValueError, match="row 0 has no user id"):
        reward(prompts=["q"], completions=["a"], user_id=[""])
    with pytest.raises(RuntimeError, match="completion 0 .* was not scored: empty.*failure_score"):
        reward(prompts=["q"], completions=[""], user_id=["u1"])
    lenient = PersonalizedReward(scorer=Scorer(), failure_score=-1.0)
    assert lenient(prompts=["q"], completions=[""], user_id=["u1"]) == [-1.0] and lenient.failures == 1

    svc = ScriptedService([503], ok_body={"results": [{"score": 0.75, "status": "ok"}]})   # starting, then up
    try:
        remote = PersonalizedReward(url=svc.url)
        remote.client.backoff.base_s = 0.01
        assert remote(prompts=["q"], completions=["a"], user_id=["u1"]) == [0.75]
        assert svc.seen == [503, 200]
    finally:
        svc.close()
