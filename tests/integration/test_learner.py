"""The learner (workers/learner/) on Ray; its config and batch layout are tested in tests/unit.

Ray tests run the tiny Qwen2 model on CPU: a plain 1-rank learner next to a 2-rank FSDP2 one (gloo), and two
more 2-rank learners for determinism and checkpoint resume.
"""

import json

import pytest
import torch

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.rl.batches import collate
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.learner import LearnerGroup

CPUS = 0.25  # per rank: every group of this module fits the session cluster at once

# dual-clip, KL in the loss, critic on, small micro-batches (so ranks run unequal numbers: dummy micro-batches)
BASE = {"model": "tiny", "lr": 1e-3, "grad_clip": 1.0, "micro_batch_size": 1, "mini_batch_size": 4,
        "policy_loss": "dual_clip", "kl": {"coef": 0.05, "kind": "k3", "where": "loss"},
        "critic": {"enabled": True, "lr": 2e-4}, "num_cpus_per_worker": CPUS, "seed": 3}


def make_batch(seed: int, n: int = 7, empty_last: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(2, 9, (n,), generator=g).tolist()
    r_len = torch.randint(1, 7, (n,), generator=g).tolist()
    if empty_last:
        r_len[-1] = 0
    return {"prompt_ids": [torch.randint(5, 3000, (k,), generator=g).tolist() for k in p_len],
            "response_ids": [torch.randint(5, 3000, (k,), generator=g).tolist() for k in r_len]}


def hf_logprobs(model, batch: dict) -> list[torch.Tensor]:
    out = []
    for p, r in zip(batch["prompt_ids"], batch["response_ids"]):
        with torch.no_grad():
            logits = model(torch.tensor([p + r])).logits[0].float()
        lp = torch.log_softmax(logits[len(p) - 1:len(p) + len(r) - 1], -1)
        out.append(lp.gather(-1, torch.tensor(r, dtype=torch.long)[:, None]).squeeze(-1))
    return out


# ---------------------------------------------------------------------------------------------------------------
# a plain 1-rank learner and a 2-rank FSDP2 learner, same config
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(ray_cluster):  # noqa: F811
    one = LearnerGroup(LearnerConfig(**BASE, strategy="none", world_size=1))
    two = None
    try:
        two = LearnerGroup(LearnerConfig(**BASE, strategy="fsdp2", world_size=2))
        yield one, two
    finally:
        one.shutdown()
        if two is not None:
            two.shutdown()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    from pr_rlhf.models.sources import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32).eval()


def test_logprobs_match_a_plain_hf_forward(pair, hf_model):
    one, two = pair
    assert [i["backend"] for i in two.info] == ["gloo", "gloo"] and two.info[0]["strategy"] == "fsdp2"
    batch = make_batch(0, empty_last=True)
    expected = hf_logprobs(hf_model, batch)
    for group in (one, two):
        lp = group.compute_logprobs(batch)
        assert lp.shape == (7, max(len(r) for r in batch["response_ids"]))
        for i, exp in enumerate(expected):
            torch.testing.assert_close(lp[i, :len(exp)], exp, atol=2e-5, rtol=1e-5)
            assert (lp[i, len(exp):] == 0).all()
        # the frozen reference is the initial policy
        torch.testing.assert_close(group.compute_ref_logprobs(batch), lp, atol=1e-6, rtol=0)
    # tensor input (right-padded prompts with a mask): same numbers, the response width is kept
    c = collate(batch)
    right = {"prompt_ids": torch.zeros_like(c["prompt_ids"]), "prompt_mask": torch.zeros_like(c["prompt_mask"]),
             "response_ids": torch.nn.functional.pad(c["response_ids"], (0, 2)),
             "response_mask": torch.nn.functional.pad(c["response_mask"], (0, 2))}
    for i, p in enumerate(batch["prompt_ids"]):
        right["prompt_ids"][i, :len(p)] = torch.tensor(p)
        right["prompt_mask"][i, :len(p)] = 1
    lp_t = two.compute_logprobs(right)
    assert lp_t.shape == (7, c["response_ids"].shape[1] + 2)
    torch.testing.assert_close(lp_t[:, :-2], two.compute_logprobs(batch), atol=2e-5, rtol=0)


def test_two_rank_fsdp2_update_matches_one_rank(pair):
    """Same global batch (7 samples, mini-batches of 4 -> 2 optimizer steps, micro-batches of 1 -> rank 1 runs a
    dummy micro-batch) through a plain module and 2 FSDP2 ranks: same weights, same metrics."""
    one, two = pair
    batch = make_batch(1, empty_last=True)
    results = []
    for group in (one, two):
        before = group.compute_logprobs(batch)
        adv = torch.linspace(-1.0, 1.0, 7)
        metrics = group.update_policy(dict(batch, old_logprobs=before, advantages=adv))
        values = group.compute_values(batch)
        returns = [[0.3 * (i + 1)] * len(r) for i, r in enumerate(batch["response_ids"])]
        critic_metrics = group.update_critic(dict(batch, values=values, returns=returns))
        results.append((group.state_dict_for_rollout(), metrics, critic_metrics, group.compute_values(batch)))
    (sd1, m1, c1, v1), (sd2, m2, c2, v2) = results
    assert m1["actor/optimizer_steps"] == m2["actor/optimizer_steps"] == 2
    assert set(sd1) == set(sd2) and "lm_head.weight" in sd1
    moved = max(float((sd1[k] - sd2[k]).abs().max()) for k in sd1)
    assert moved < 2e-5, f"1-rank vs 2-rank weights differ by {moved}"
    for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/num_tokens"):
        assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-6), k
    for k in ("critic/vf_loss", "critic/grad_norm"):
        assert c1[k] == pytest.approx(c2[k], rel=1e-4, abs=1e-6), k
    torch.testing.assert_close(v1, v2, atol=5e-5, rtol=1e-4)
    # clipping bound: the norm before clipping exceeded grad_clip, the gradients stepped with did not
    for m in (m1, m2, c1, c2):
        prefix = next(iter(m)).split("/")[0]
        assert m[f"{prefix}/grad_norm_max"] > 1.0
        assert m[f"{prefix}/grad_norm_post_clip"] <= 1.0 + 1e-5


def test_positive_advantage_raises_the_sequence_logprob(pair):
    """GRPO-style: 4 responses to one prompt, the first rewarded (advantage +1.5), the others not (-0.5)."""
    _, two = pair
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(5, 3000, (6,), generator=g).tolist()
    batch = {"prompt_ids": [prompt] * 4,
             "response_ids": [torch.randint(5, 3000, (5,), generator=g).tolist() for _ in range(4)]}
    before = two.compute_logprobs(batch)
    metrics = two.update_policy(dict(batch, old_logprobs=before, advantages=[1.5, -0.5, -0.5, -0.5]))
    after = two.compute_logprobs(batch)
    gain = (after - before).sum(-1)
    assert gain[0] > 0, gain
    assert (gain[1:] < gain[0]).all()
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0) and metrics["actor/entropy"] > 0
    # one sample on two ranks: rank 1 gets an empty share and still joins every collective
    single = {k: v[:1] for k, v in batch.items()}
    lp1 = two.compute_logprobs(single)
    assert lp1.shape == (1, 5)
    assert two.update_policy(dict(single, old_logprobs=lp1, advantages=[1.0]))["actor/optimizer_steps"] == 1
    with pytest.raises(Exception, match="old_logprobs"):   # 9 samples in mini-batches of 4: off-policy after the first
        two.update_policy(dict(make_batch(3, n=9), advantages=[1.0] * 9))


def test_on_policy_update_without_old_logprobs_is_the_same_update(ray_cluster):  # noqa: F811
    """One epoch over one mini-batch: the learner takes the old log-probs from its own update forward (no
    separate pass) and lands on the same weights as with a separate old-log-prob pass."""
    cfg = {**BASE, "mini_batch_size": None, "critic": {"enabled": False}}
    batch = make_batch(8)
    adv = torch.linspace(-1.0, 1.0, 7)
    states = []
    for with_old in (True, False):
        with LearnerGroup(LearnerConfig(**cfg, strategy="fsdp2", world_size=2)) as group:
            b = dict(batch, advantages=adv)
            if with_old:
                b["old_logprobs"] = group.compute_logprobs(batch)
            metrics = group.update_policy(b)
            assert metrics["actor/optimizer_steps"] == 1 and metrics["actor/ratio_mean"] == pytest.approx(1.0)
            states.append(group.state_dict_for_rollout())
    assert max(float((states[0][k] - states[1][k]).abs().max()) for k in states[0]) < 1e-6


def test_critic_update_reduces_value_loss(pair):
    _, two = pair
    batch = make_batch(2)
    returns = [[1.0] * len(r) for r in batch["response_ids"]]
    mask = collate(batch)["response_mask"]
    losses, reported = [], []
    for _ in range(5):
        values = two.compute_values(batch)
        losses.append(float((((values - 1.0) ** 2) * mask).sum() / mask.sum()))
        reported.append(two.update_critic(dict(batch, values=values, returns=returns))["critic/vf_loss"])
    losses.append(float((((two.compute_values(batch) - 1.0) ** 2) * mask).sum() / mask.sum()))
    assert losses[-1] < 0.25 * losses[0], losses
    assert reported[-1] < reported[0], reported


def test_sft_steps_lower_the_nll_the_same_on_one_and_two_ranks(ray_cluster, tmp_path):  # noqa: F811
    """update_sft: response-token NLL, one optimizer step per call at its own lr (the RL lr is restored after);
    a plain module and 2 FSDP2 ranks agree. rebase_reference then makes the reference the warm-started policy,
    with a fresh optimizer, and a checkpoint carries that reference into a new learner."""
    cfg = {**BASE, "kl": {"coef": 0.0}, "critic": {"enabled": False}, "micro_batch_size": 2}
    batch = make_batch(5)
    runs = []
    for strategy, size in (("none", 1), ("fsdp2", 2)):
        with LearnerGroup(LearnerConfig(**cfg, strategy=strategy, world_size=size)) as group:
            metrics = [group.update_sft(batch, lr=3e-3) for _ in range(4)]
            runs.append((group.state_dict_for_rollout(), metrics))
            if size == 2:
                group.rebase_reference()
                torch.testing.assert_close(group.compute_ref_logprobs(batch), group.compute_logprobs(batch))
                rl = group.update_policy(dict(batch, old_logprobs=group.compute_logprobs(batch),
                                              advantages=torch.linspace(-1, 1, 7)))
                assert rl["actor/lr"] == BASE["lr"] and rl["actor/optimizer_steps"] == 2  # mini-batches of 4
                group.save_checkpoint(tmp_path / "ck", step=1)
                ref_lp = group.compute_ref_logprobs(batch)
                assert not torch.equal(ref_lp, group.compute_logprobs(batch))  # RL moved the policy, not the ref
    (sd1, m1), (sd2, m2) = runs
    nll = [m["sft/nll"] for m in m1]
    assert nll[-1] < 0.8 * nll[0], nll
    assert m1[0]["sft/lr"] == 3e-3 and m1[-1]["sft/optimizer_steps"] == 1
    assert [m["sft/nll"] for m in m2] == pytest.approx(nll, rel=1e-4)
    assert max(float((sd1[k] - sd2[k]).abs().max()) for k in sd1) < 2e-5
    assert json.loads((tmp_path / "ck" / "meta.json").read_text())["models"]["reference"]["optimizer"] is False
    with LearnerGroup(LearnerConfig(**cfg, strategy="fsdp2", world_size=2)) as fresh:
        fresh.load_checkpoint(tmp_path / "ck")
        assert torch.equal(fresh.compute_ref_logprobs(batch), ref_lp)


# ---------------------------------------------------------------------------------------------------------------
# determinism and checkpoint resume (2 ranks, gloo)
# ---------------------------------------------------------------------------------------------------------------

def train_step(group: LearnerGroup, step: int) -> None:
    batch = make_batch(100 + step)
    old = group.compute_logprobs(batch)
    values = group.compute_values(batch)
    adv = torch.randn(7, generator=torch.Generator().manual_seed(step))
    returns = [[float(a)] * len(r) for a, r in zip(adv, batch["response_ids"])]
    group.update_policy(dict(batch, old_logprobs=old, advantages=adv))
    group.update_critic(dict(batch, values=values, returns=returns))


def snapshot(group: LearnerGroup) -> tuple[dict, torch.Tensor]:
    return group.state_dict_for_rollout(), group.compute_values(make_batch(999))


def assert_identical(a: tuple[dict, torch.Tensor], b: tuple[dict, torch.Tensor]) -> None:
    assert set(a[0]) == set(b[0])
    differ = [k for k in a[0] if not torch.equal(a[0][k], b[0][k])]
    assert not differ, f"weights differ: {differ[:5]}"
    assert torch.equal(a[1], b[1]), "critic values differ"


def test_determinism_and_checkpoint_resume(ray_cluster, tmp_path):  # noqa: F811
    cfg = LearnerConfig(**{**BASE, "micro_batch_size": 2}, strategy="fsdp2", world_size=2)
    ckpt = tmp_path / "step2"
    with LearnerGroup(cfg) as a:
        train_step(a, 1)
        train_step(a, 2)
        assert a.save_checkpoint(ckpt, step=2, data_position={"epoch": 0, "index": 14}) == str(ckpt)
        at_save = a.state_dict_for_rollout()
        rng_a = a.rng_sample()
        train_step(a, 3)
        train_step(a, 4)
        final_a = snapshot(a)
    assert (ckpt / "meta.json").is_file() and (ckpt / "policy" / "model.safetensors").is_file()
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank_0.pt", "rank_1.pt"]
    # every rank wrote its shard of the weights and the AdamW state
    from torch.distributed.checkpoint import FileSystemReader

    storage = FileSystemReader(str(ckpt / "shards")).read_metadata().storage_data
    assert {i.relative_path for i in storage.values()} == {"__0_0.distcp", "__1_0.distcp"}
    assert any(i.fqn.startswith("policy.optimizer.state.") and i.fqn.endswith(".exp_avg") for i in storage)
    # the policy folder is an HF model directory holding the step-2 weights
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype=torch.float32).state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in at_save.items())

    with LearnerGroup(cfg) as b:
        for step in (1, 2, 3, 4):  # same seed, same data, fresh processes: bitwise the same
            train_step(b, step)
        assert_identical(snapshot(b), final_a)
        meta = b.load_checkpoint(ckpt)  # into a worker that has trained past it: everything is overwritten
        assert meta["step"] == 2 and meta["data_position"] == {"epoch": 0, "index": 14}
        assert b.rng_sample() == rng_a
        train_step(b, 3)
        train_step(b, 4)
        assert_identical(snapshot(b), final_a)
