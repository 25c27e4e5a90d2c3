"""The RL step's group bookkeeping: groups spanning several prompts (a pair in both response orders), the share of
groups without reward variance, and dynamic sampling's refill of such groups."""
from types import SimpleNamespace

import numpy as np
import pytest

from pr_rlhf.configs.rl import RLConfig
from workers import rl_loop
from workers.rl_loop import ScoredRollouts, samples_per_prompt


def scored(groups, rewards):
    n = len(groups)
    return ScoredRollouts([[1]] * n, [[i + 2] for i in range(n)], list(groups), np.array(rewards, float), {"m": 1.0})


def test_zero_std_groups_and_selection():
    s = scored([0, 0, 1, 1, 2, 2], [1, 1, 0, 1, 0.5, 0.5])
    assert s.zero_std_groups() == {0, 2}
    kept = s.only({1})
    assert kept.group == [1, 1] and kept.rewards.tolist() == [0.0, 1.0] and kept.response_ids == [[4], [5]]
    both = ScoredRollouts.concat([kept, s.only({2})])
    assert both.group == [1, 1, 2, 2] and both.metrics == {"m": 1.0}


def test_samples_per_prompt_splits_each_group_evenly():
    cfg = RLConfig(algorithm="grpo", group_size=8)
    assert samples_per_prompt(cfg, [0, 1, 2]) == 8
    assert samples_per_prompt(cfg, [0, 0, 1, 1]) == 4
    with pytest.raises(ValueError, match="same number of prompts"):
        samples_per_prompt(cfg, [0, 0, 1])
    with pytest.raises(ValueError, match="dividing"):
        samples_per_prompt(cfg, [0, 0, 0, 1, 1, 1])


def test_rl_step_refills_zero_variance_groups_and_reports_their_share(monkeypatch):
    """A fake rollout / learner: group ids and sample counts reach the update; zero-variance groups are replaced
    by refilled ones; the reported reward metrics are those of the scheduled prompts."""
    updates = []

    def fake_generate(rollouts, messages, params):
        return [SimpleNamespace(error=None, prompt_token_ids=[7], samples=[SimpleNamespace(token_ids=[m, j])
                                                                           for j in range(params.n)])
                for m in messages]

    def fake_update(learner, cfg, prompt_ids, response_ids, rewards, group, timer, behaviour_logprobs=None):
        updates.append((list(group), np.asarray(rewards).tolist()))
        import torch
        return {}, torch.tensor([len(r) for r in response_ids])

    monkeypatch.setattr(rl_loop, "generate_sharded", fake_generate)
    monkeypatch.setattr(rl_loop, "policy_update", fake_update)
    monkeypatch.setattr(rl_loop, "sync_weights", lambda *a: None)

    def reward_fn(prompts, gens):   # prompt "a*" all right, "b*" all wrong, "m*" mixed
        out = []
        for p, g in zip(prompts, gens):
            out += [1.0 if p.messages[0] == "a" else 0.0 if p.messages[0] == "b" else float(j % 2)
                    for j in range(len(g.samples))]
        return np.array(out), {"reward/outcome": float(np.mean(out))}

    cfg = RLConfig(algorithm="grpo", group_size=4)
    prompts = [SimpleNamespace(messages=m) for m in ("a1", "a1", "m1", "m1", "b1", "b1")]
    metrics = rl_loop.rl_step(None, [], cfg, prompts, reward_fn, 0, 0, group_of=[0, 0, 1, 1, 2, 2])
    assert updates[-1][0] == [0] * 4 + [1] * 4 + [2] * 4            # 2 prompts x 2 samples per group
    assert metrics["reward/frac_zero_std"] == pytest.approx(2 / 3)
    assert "rollout/refill_groups" not in metrics

    def refill(rnd, count):
        assert count == 2
        return [SimpleNamespace(messages=m) for m in ("m2", "m2", "m3", "m3")], [10, 10, 11, 11]
    metrics = rl_loop.rl_step(None, [], cfg, prompts, reward_fn, 1, 0, group_of=[0, 0, 1, 1, 2, 2],
                              refill=refill, refill_rounds=2)
    groups, rewards = updates[-1]
    assert groups == [1] * 4 + [10] * 4 + [11] * 4                 # zero-variance groups 0 and 2 replaced
    assert metrics["rollout/refill_groups"] == 2 and metrics["rollout/update_groups"] == 3
    assert metrics["reward/frac_zero_std"] == pytest.approx(2 / 3)  # of the scheduled prompts
    assert metrics["reward/mean"] == pytest.approx(np.mean([1] * 4 + [0, 1, 0, 1] + [0] * 4))


def test_one_step_off_needs_the_raw_distribution_and_no_refill():
    """The engines' log-probs are the model's raw distribution: a run sampling at another temperature or top-p
    cannot be corrected with them; dynamic sampling draws within a step, which one step off cannot."""
    assert RLConfig(rollout_mode="one_step_off").rollout_mode == "one_step_off"
    for bad in ({"temperature": 0.7}, {"top_p": 0.9}):
        with pytest.raises(ValueError, match="temperature=1"):
            RLConfig(rollout_mode="one_step_off", **bad)
    with pytest.raises(ValueError, match="refill"):
        rl_loop.rl_step(None, [], RLConfig(rollout_mode="one_step_off"), [SimpleNamespace(messages=["a"])],
                        lambda p, g: (np.zeros(0), {}), 0, 0, refill=lambda r, c: ([], []), refill_rounds=1,
                        pipeline=rl_loop.OneStepOff([], 0))


def test_colocated_step_runs_rollout_sleep_update_wake_transfer_wake(monkeypatch):
    """The hybrid engine's order within a step: the samples are drawn and scored, the engines sleep, the learner
    updates, the engines wake their weights, take the new ones, then wake their KV cache for the next rollout."""
    events = []

    def fake_generate(rollouts, messages, params):
        events.append("rollout")
        return [SimpleNamespace(error=None, prompt_token_ids=[7], samples=[SimpleNamespace(token_ids=[1, j])
                                                                           for j in range(params.n)])
                for _ in messages]

    def fake_update(learner, cfg, prompt_ids, response_ids, rewards, group, timer, behaviour_logprobs=None):
        events.append("update")
        import torch
        return {}, torch.tensor([len(r) for r in response_ids])

    class Engines(rl_loop.Colocated):
        def _all(self, method, *args):
            events.append(f"{method}{args}")

    monkeypatch.setattr(rl_loop, "generate_sharded", fake_generate)
    monkeypatch.setattr(rl_loop, "policy_update", fake_update)
    monkeypatch.setattr(rl_loop, "sync_weights", lambda *a: events.append("transfer"))

    def reward_fn(prompts, gens):
        events.append("reward")
        return np.arange(sum(len(g.samples) for g in gens), dtype=float), {}

    colocated = Engines([], level=2)
    metrics = rl_loop.rl_step(None, [], RLConfig(group_size=2, layout="colocated"),
                              [SimpleNamespace(messages=["a"])], reward_fn, 0, 0, colocated=colocated)
    assert events == ["rollout", "reward", "sleep(2,)", "update", "wake_up(['weights'],)", "transfer",
                      "wake_up(['kv_cache'],)"]
    assert colocated.log == ["sleep", "wake weights", "wake kv_cache"]
    assert {"time/sleep_s", "time/wake_s", "time/weight_sync_s"} <= set(metrics)
    with pytest.raises(ValueError, match="one step off"):
        rl_loop.rl_step(None, [], RLConfig(group_size=2), [SimpleNamespace(messages=["a"])], reward_fn, 0, 0,
                        colocated=colocated, pipeline=rl_loop.OneStepOff([], 0))


def test_colocated_layout_refusals():
    """One engine per learner rank, tensor parallel 1, the sequential step, and a GPU share the rank can spare."""
    assert RLConfig(layout="colocated").layout == "colocated"
    for bad, match in (({"rollout_mode": "one_step_off"}, "split layout"),
                       ({"rollout_workers": 2}, "must equal learner.world_size"),
                       ({"rollout": {"backend": "vllm", "model": "tiny", "tensor_parallel_size": 2}},
                        "tensor_parallel_size 1"),
                       ({"rollout_num_gpus": 1.0}, "below learner.num_gpus_per_worker")):
        with pytest.raises(ValueError, match=match):
            RLConfig(layout="colocated", **bad)
