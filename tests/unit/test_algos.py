"""pr_rlhf.algos: hand-computed cases (run without verl) and golden comparisons with verl's core_algos (CI installs
verl --no-deps; the golden tests skip where it is absent)."""
import math

import numpy as np
import pytest
import torch

from pr_rlhf import algos
from pr_rlhf.algos import (
    ADVANTAGE_ESTIMATORS,
    AGG_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    GlobalBatchInfo,
    Registry,
    UnknownNameError,
)
from tests.optional import need

ATOL = 1e-5


def close(a, b, atol=ATOL):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=atol, rtol=1e-5)


def outcome_rewards(scores, lengths, T):
    """[B, T] token rewards with each score on the last valid token, and the left-aligned response mask."""
    B = len(scores)
    mask = torch.zeros(B, T)
    rewards = torch.zeros(B, T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


# ---------------------------------------------------------------- hand-computed cases

GROUP_INDEX = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
GROUP_SCORES = [1.0, 2.0, 3.0, 0.0, 4.0, 5.0]
GROUP_LENGTHS = [3, 1, 4, 2, 4, 3]


def test_grpo_hand():
    r, m = outcome_rewards(GROUP_SCORES, GROUP_LENGTHS, 4)
    adv, ret = algos.grpo(r, m, GROUP_INDEX, epsilon=0.0)
    s8 = math.sqrt(8.0)  # unbiased std of [0, 4]
    expected = torch.tensor([-1.0, 0.0, 1.0, -2 / s8, 2 / s8, 5.0])  # group "c" has one member: mean 0, std 1
    close(adv, expected[:, None] * m)
    assert torch.equal(adv, ret)
    assert torch.all(adv[m == 0] == 0)

    adv_ns, _ = algos.grpo(r, m, GROUP_INDEX, norm_adv_by_std=False)
    close(adv_ns, torch.tensor([-1.0, 0.0, 1.0, -2.0, 2.0, 5.0])[:, None] * m)
    close(ADVANTAGE_ESTIMATORS.get("grpo_no_std")(r, m, GROUP_INDEX)[0], adv_ns)


def test_grpo_epsilon_and_identical_scores():
    r, m = outcome_rewards([2.0, 2.0], [1, 1], 1)
    adv, _ = algos.grpo(r, m, [7, 7])
    assert torch.all(adv == 0)  # std 0 -> 0 / eps, not NaN
    r, m = outcome_rewards([1.0, 3.0], [1, 1], 1)
    adv, _ = algos.grpo(r, m, torch.tensor([0, 0]), epsilon=1.0)
    close(adv[:, 0], torch.tensor([-1.0, 1.0]) / (math.sqrt(2.0) + 1.0))


def test_grpo_index_must_match_batch():
    r, m = outcome_rewards([1.0, 2.0], [1, 1], 1)
    with pytest.raises(ValueError, match="one group label per sample"):
        algos.grpo(r, m, [0])


def test_rloo_hand():
    r, m = outcome_rewards(GROUP_SCORES, GROUP_LENGTHS, 4)
    adv, ret = algos.rloo(r, m, GROUP_INDEX)
    # score minus the mean of the others; a lone sample keeps its score
    expected = torch.tensor([1 - 2.5, 2 - 2.0, 3 - 1.5, 0 - 4.0, 4 - 0.0, 5.0])
    close(adv, expected[:, None] * m)
    assert torch.equal(adv, ret)


def test_gae_hand():
    # gamma 0.9, lam 0.8; seq 0 has 2 valid tokens, seq 1 has a skipped (observation) token in the middle
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 7.0, 2.0]])
    values = torch.tensor([[0.5, 0.2, 9.0], [1.0, 5.0, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    adv, ret = algos.gae(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    # seq 0: t=1: delta = 1 - 0.2 = 0.8; t=0: delta = 0.9*0.2 - 0.5 = -0.32, A = -0.32 + 0.72*0.8 = 0.256
    # seq 1: t=2: delta = 2 - 0.5 = 1.5; t=1 skipped; t=0: delta = 0.9*0.5 - 1 = -0.55, A = -0.55 + 0.72*1.5 = 0.53
    close(adv, torch.tensor([[0.256, 0.8, 0.0], [0.53, 0.0, 1.5]]))
    close(ret, torch.tensor([[0.756, 1.0, 0.0], [1.53, 0.0, 2.0]]))

    adv_w, ret_w = algos.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    vals = torch.tensor([0.256, 0.8, 0.53, 1.5])
    expected = (vals - vals.mean()) / vals.std()  # unbiased std
    close(adv_w[mask.bool()], expected, atol=1e-4)
    assert torch.all(adv_w[mask == 0] == 0)
    close(ret_w, ret)


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    values = torch.tensor([[0.5, -1.0, 2.0, 0.0]])
    mask = torch.ones(1, 4)
    adv, ret = algos.gae(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    close(ret, torch.tensor([[10.0, 9.0, 7.0, 4.0]]))
    close(adv, ret - values)


# PPO: old logp 0, ratios r, advantages A (see test comments for each token)
RATIOS = torch.tensor([[1.5, 0.5, 1.1, 0.5, 5.0]])
ADVS = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])


def ppo_inputs():
    return torch.zeros_like(RATIOS), torch.log(RATIOS), ADVS.clone(), torch.ones_like(RATIOS)


def test_clipped_and_dual_clip_hand():
    old, new, adv, m = ppo_inputs()
    # per token: max(-A r, -A clip(r, 0.8, 1.2)) = [-1.2 (clip), -0.5, 1.1, 0.8 (clip), 5.0]
    loss, stats = algos.clipped(old, new, adv, m, clip_ratio_low=0.2, clip_ratio_high=0.2)
    close(loss, (-1.2 - 0.5 + 1.1 + 0.8 + 5.0) / 5)
    close(stats["clipfrac"], 2 / 5)
    close(stats["approx_kl"], -torch.log(RATIOS).mean())
    close(stats["ratio_mean"], 8.6 / 5)
    assert "clipfrac_lower" not in stats
    # dual clip caps the A<0 token with r = 5 at c * |A| = 3
    loss, stats = algos.dual_clip(old, new, adv, m, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    close(loss, (-1.2 - 0.5 + 1.1 + 0.8 + 3.0) / 5)
    close(stats["clipfrac_lower"], 1 / 5)
    close(stats["clipfrac"], 2 / 5)
    # clip-higher: the positive-advantage token is clipped at 1.28
    loss, _ = algos.clipped(old, new, adv, m, clip_ratio_low=0.2, clip_ratio_high=0.28)
    close(loss, (-1.28 - 0.5 + 1.1 + 0.8 + 5.0) / 5)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        algos.dual_clip(old, new, adv, m, clip_ratio_c=1.0)


def test_behaviour_weights_truncate_and_weight_the_clipped_loss():
    """One-step-off correction: w = min(pi_prox / pi_behaviour, cap) per token, 0 off the mask, detached; the
    clipped surrogate's per-token terms are multiplied by it (and its gradient scaled the same way)."""
    old, new, adv, m = ppo_inputs()
    behaviour = old + torch.log(torch.tensor([[1.0, 2.0, 0.5, 0.1, 1.0]]))   # pi_prox / pi_b = 1, .5, 2, 10, 1
    m[0, 4] = 0
    w, stats = algos.behaviour_weights(old, behaviour, m, cap=2.0)
    close(w, torch.tensor([[1.0, 0.5, 2.0, 2.0, 0.0]]))
    close(stats["is_weight_mean"], (1.0 + 0.5 + 2.0 + 2.0) / 4)
    close(stats["is_truncated_frac"], 1 / 4)
    close(stats["behaviour_kl"], torch.log(torch.tensor([1.0, 2.0, 0.5, 0.1])).mean())
    loss, _ = algos.clipped(old, new, adv, m, is_weights=w)
    close(loss, (-1.2 * 1.0 - 0.5 * 0.5 + 1.1 * 2.0 + 0.8 * 2.0) / 4)
    new.requires_grad_(True)
    algos.clipped(old, new, adv, m, is_weights=w)[0].backward()
    close(new.grad, torch.tensor([[0.0, -0.5 * 0.5 / 4, 1.1 * 2.0 / 4, 0.0, 0.0]]))
    unknown = behaviour.clone()
    unknown[0, 1] = float("nan")                                # no engine log-prob recorded: weight 1
    close(algos.behaviour_weights(old, unknown, m, cap=2.0)[0], torch.tensor([[1.0, 1.0, 2.0, 2.0, 0.0]]))
    same, _ = algos.behaviour_weights(old, old, m, cap=2.0)    # on-policy: every weight 1, the loss unchanged
    close(algos.dual_clip(old, new, adv, m, is_weights=same)[0], algos.dual_clip(old, new, adv, m)[0])
    with pytest.raises(ValueError, match="cap"):
        algos.behaviour_weights(old, behaviour, m, cap=0.0)


def test_policy_loss_gradient_is_zero_where_clipped():
    old, new, adv, m = ppo_inputs()
    new.requires_grad_(True)
    loss, _ = algos.dual_clip(old, new, adv, m)
    loss.backward()
    # d/dlogp of -A r / 5 = -A r / 5 on unclipped tokens; 0 on clipped/capped ones
    close(new.grad, torch.tensor([[0.0, -0.5 / 5, 1.1 / 5, 0.0, 0.0]]))


def test_policy_loss_ignores_masked_tokens():
    old, new, adv, m = ppo_inputs()
    m[0, 4] = 0
    new[0, 4] = float("nan")
    loss, stats = algos.clipped(old, new, adv, m)
    close(loss, (-1.2 - 0.5 + 1.1 + 0.8) / 4)
    assert math.isfinite(stats["ratio_mean"])


def test_agg_loss_hand():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last sequence is fully masked and never counts
    close(algos.agg_loss(loss_mat, mask, "token-mean"), 10 / 4)
    close(algos.agg_loss(loss_mat, mask, "token-sum"), 10)
    close(algos.agg_loss(loss_mat, mask, "seq-mean-token-sum"), (6 + 4) / 2)
    close(algos.agg_loss(loss_mat, mask, "seq-mean-token-sum-norm"), (6 + 4) / 2 / 3)
    close(algos.agg_loss(loss_mat, mask, "seq-mean-token-mean"), (2 + 4) / 2)
    gb = GlobalBatchInfo(dp_size=2, num_tokens=8, num_seqs=5)
    close(algos.agg_loss(loss_mat, mask, "token-mean", global_batch=gb), 10 / 8 * 2)
    close(algos.agg_loss(loss_mat, mask, "seq-mean-token-mean", global_batch=gb), 6 / 5 * 2)
    with pytest.raises(ValueError, match="num_tokens"):
        algos.agg_loss(loss_mat, mask, "token-mean", global_batch=GlobalBatchInfo(dp_size=2))
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        algos.agg_loss(loss_mat, mask, "mean")
    assert set(AGG_MODES) >= {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"}


def test_value_loss_hand():
    vpreds = torch.tensor([[2.0, 0.0]])
    values_old = torch.tensor([[1.0, 0.0]])
    returns = torch.tensor([[3.0, 1.0]])
    # token 0: clip(2, 0.5, 1.5) = 1.5 -> max(1, 2.25) = 2.25 (clipped); token 1: max(1, 1) = 1
    loss, stats = algos.value_loss(vpreds, values_old, returns, torch.ones(1, 2), cliprange_value=0.5)
    close(loss, 0.5 * (2.25 + 1.0) / 2)
    close(stats["clipfrac"], 0.5)


def test_kl_estimators_hand():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    d = math.log(2.0)
    close(algos.kl_penalty(logp, ref, "k1"), [d])
    close(algos.kl_penalty(logp, ref, "kl"), [d])
    close(algos.kl_penalty(ref, logp, "abs"), [d])
    close(algos.kl_penalty(logp, ref, "k2"), [0.5 * d * d])
    close(algos.kl_penalty(logp, ref, "mse"), [0.5 * d * d])
    close(algos.kl_penalty(logp, ref, "k3"), [0.5 + d - 1])  # ref/pi - log(ref/pi) - 1
    close(algos.kl_penalty(logp, ref, "low_var_kl"), [0.5 + d - 1])
    # log(ref/pi) is clamped to [-20, 20] and the estimate to [-10, 10]
    close(algos.kl_penalty(torch.tensor([0.0]), torch.tensor([-50.0]), "k3"), [10.0])
    # k3 is never negative
    x = torch.randn(100, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.all(algos.kl_penalty(x, torch.zeros(100), "k3") >= 0)


def test_kl_straight_through_uses_k2_gradient():
    logp = torch.tensor([-0.3, -2.0], requires_grad=True)
    ref = torch.tensor([-1.0, -0.5])
    value = algos.kl_penalty(logp, ref, "k3+")
    close(value.detach(), algos.kl_penalty(logp.detach(), ref, "k3"))
    value.sum().backward()
    close(logp.grad, (logp - ref).detach())  # d/dlogp 0.5 (logp - ref)^2


def test_apply_kl_to_rewards_and_kl_loss():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.6, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, stats = algos.apply_kl_to_rewards(scores, kl, 0.5, mask)
    close(rewards, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.7, 0.0]]))
    close(stats["kl"], (0.2 + 0.5) / 2)
    assert stats["kl_coef"] == 0.5

    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    close(algos.kl_loss(logp, ref, torch.ones(1, 2), "k1"), math.log(2.0) / 2)
    close(algos.kl_loss(logp, ref, torch.tensor([[1, 0]]), "k3", "seq-mean-token-sum"), 0.5 + math.log(2.0) - 1)


def test_entropy_and_masked_helpers():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    close(algos.entropy_from_logits(logits), [[math.log(4.0), 0.0]])
    close(algos.entropy_loss(logits, torch.tensor([[1, 0]])), math.log(4.0))

    values = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 4.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    close(algos.masked_sum(values, mask), 10.0)
    close(algos.masked_mean(values, mask), 2.5)
    close(algos.masked_mean(values, mask, dim=-1), [1.5, 3.5])
    close(algos.masked_mean(values, torch.zeros_like(mask)), 0.0)
    close(algos.masked_var(values, mask), torch.tensor([1.0, 2.0, 3.0, 4.0]).var())
    close(algos.masked_var(values, mask, unbiased=False), 1.25)
    w = algos.masked_whiten(values, mask)
    close(w[mask.bool()], (torch.tensor([1.0, 2.0, 3.0, 4.0]) - 2.5) / torch.tensor([1.0, 2.0, 3.0, 4.0]).std(),
          atol=1e-4)
    close(algos.masked_whiten(values, mask, shift_mean=False)[mask.bool()].mean(), 2.5)
    with pytest.raises(ValueError, match="at least 2"):
        algos.masked_var(values, torch.tensor([[1, 0, 0], [0, 0, 0]]))


# ---------------------------------------------------------------- registries


def test_registries_by_name():
    assert {"grpo", "grpo_no_std", "rloo", "gae"} <= set(ADVANTAGE_ESTIMATORS)
    assert {"clipped", "dual_clip"} <= set(POLICY_LOSSES)
    assert {"k1", "k2", "k3", "kl", "mse", "low_var_kl", "abs"} <= set(KL_ESTIMATORS)
    assert ADVANTAGE_ESTIMATORS.get("grpo") is algos.grpo
    assert POLICY_LOSSES.get("dual_clip") is algos.dual_clip
    assert KL_ESTIMATORS.get("kl") is KL_ESTIMATORS.get("k1")
    with pytest.raises(UnknownNameError) as err:
        ADVANTAGE_ESTIMATORS.get("ppo_magic")
    assert "ppo_magic" in str(err.value) and "grpo" in str(err.value) and "rloo" in str(err.value)
    with pytest.raises(KeyError):
        POLICY_LOSSES.get("nope")
    with pytest.raises(ValueError, match="k3"):
        algos.kl_penalty(torch.zeros(1), torch.zeros(1), "k9")


def test_registry_call_passes_only_supported_settings():
    r, m = outcome_rewards(GROUP_SCORES, GROUP_LENGTHS, 4)
    values = torch.zeros_like(r)
    settings = {"token_level_rewards": r, "response_mask": m, "index": GROUP_INDEX, "values": values, "gamma": 1.0,
                "lam": 1.0, "norm_adv_by_std": True}
    for name in ("grpo", "grpo_no_std", "rloo", "gae"):
        adv, _ = ADVANTAGE_ESTIMATORS.call(name, **settings)
        assert adv.shape == r.shape
    close(ADVANTAGE_ESTIMATORS.call("grpo_no_std", **settings)[0],
          algos.grpo(r, m, GROUP_INDEX, norm_adv_by_std=False)[0])
    old, new, adv, mask = ppo_inputs()
    loss_c, _ = POLICY_LOSSES.call("clipped", old, new, adv, mask, clip_ratio_c=3.0, agg_mode="token-mean")
    loss_d, _ = POLICY_LOSSES.call("dual_clip", old, new, adv, mask, clip_ratio_c=3.0, agg_mode="token-mean")
    assert loss_c > loss_d
    with pytest.raises(TypeError):
        ADVANTAGE_ESTIMATORS.call("gae", token_level_rewards=r, response_mask=m)  # values/gamma/lam missing


def test_registry_register_and_conflicts():
    reg = Registry("thing")

    @reg.register("a", "alias")
    def f():
        return 1

    assert reg.get("alias") is f and reg.names() == ["a", "alias"] and "a" in reg and len(reg) == 2
    reg.register("a")(f)  # same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(UnknownNameError, match="known: a, alias"):
        reg.get("b")


# ---------------------------------------------------------------- golden tests against verl

@pytest.fixture(scope="module")
def verl_algos():
    return need("verl.trainer.ppo.core_algos")


@pytest.fixture(scope="module")
def batch():
    """Seeded random batch: 3 prompts x 4 rollouts + 1 lone sample, ragged left-aligned masks, a masked hole."""
    g = torch.Generator().manual_seed(1234)
    B, T = 13, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    mask[1, 2] = 0.0  # a skipped (observation) token inside a response
    scores = torch.randn(B, generator=g)
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = scores
    dense = torch.randn(B, T, generator=g) * 0.1 * mask + rewards
    index = np.array([f"p{i // 4}" for i in range(B)], dtype=object)  # p0..p2 x4, p3 alone
    old_lp = -torch.rand(B, T, generator=g) * 3
    new_lp = old_lp + torch.randn(B, T, generator=g) * 0.4
    adv = torch.randn(B, T, generator=g) * 1.5
    adv[2, 0], new_lp[2, 0] = -1.0, old_lp[2, 0] + 1.5  # ratio e^1.5 ~ 4.5 on a bad token: dual clip (c < 4.5) acts
    values = torch.randn(B, T, generator=g)
    vpreds = values + torch.randn(B, T, generator=g) * 0.5
    returns = values + torch.randn(B, T, generator=g)
    ref_lp = old_lp + torch.randn(B, T, generator=g) * 0.7
    logits = torch.randn(B, T, 11, generator=g) * 2
    return {"mask": mask, "rewards": rewards, "dense": dense, "index": index, "old_lp": old_lp, "new_lp": new_lp,
            "adv": adv, "values": values, "vpreds": vpreds, "returns": returns, "ref_lp": ref_lp, "logits": logits}


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("reward_key", ["rewards", "dense"])
def test_golden_grpo(verl_algos, batch, norm, reward_key):
    r, m, idx = batch[reward_key], batch["mask"], batch["index"]
    ours = algos.grpo(r.clone(), m, idx, norm_adv_by_std=norm)
    ref = verl_algos.compute_grpo_outcome_advantage(r.clone(), m, idx, norm_adv_by_std_in_grpo=norm)
    close(ours[0], ref[0])
    close(ours[1], ref[1])
    if not norm:
        close(ADVANTAGE_ESTIMATORS.call("grpo_no_std", token_level_rewards=r, response_mask=m, index=idx)[0], ref[0])


def test_golden_rloo(verl_algos, batch):
    r, m, idx = batch["dense"], batch["mask"], batch["index"]
    ours = algos.rloo(r.clone(), m, idx)
    ref = verl_algos.compute_rloo_outcome_advantage(r.clone(), m, idx)
    close(ours[0], ref[0])
    close(ours[1], ref[1])


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_golden_gae(verl_algos, batch, gamma, lam):
    r, v, m = batch["dense"], batch["values"], batch["mask"]
    adv, ret = algos.gae(r, v, m, gamma=gamma, lam=lam)
    ref_adv, ref_ret = verl_algos.compute_gae_advantage_return(r, v, m, gamma=gamma, lam=lam)
    # verl leaves arbitrary values outside the mask; ours are 0 there
    close(adv, ref_adv * m)
    close(ret, ref_ret * m)


def _actor_config(low, high, c, mode="token-mean"):
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, clip_ratio=low,
                       clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c, loss_agg_mode=mode)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("low,high,c", [(0.2, 0.2, 3.0), (0.2, 0.28, 1.5), (0.1, 0.3, 10.0)])
def test_golden_policy_loss(verl_algos, batch, mode, low, high, c):
    old, new, adv, m = batch["old_lp"], batch["new_lp"], batch["adv"], batch["mask"]
    ref_loss, ref_stats = verl_algos.compute_policy_loss_vanilla(old, new, adv, m, loss_agg_mode=mode,
                                                                 config=_actor_config(low, high, c, mode))
    loss, stats = algos.dual_clip(old, new, adv, m, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c,
                                  agg_mode=mode)
    close(loss, ref_loss)
    close(stats["clipfrac"], ref_stats["actor/pg_clipfrac"])
    close(stats["clipfrac_lower"], ref_stats["actor/pg_clipfrac_lower"])
    close(stats["approx_kl"], ref_stats["actor/ppo_kl"])
    assert stats["clipfrac_lower"] > 0 or c >= 10  # the cap is exercised for small c

    # plain clipping == verl's vanilla with an unreachable dual-clip bound
    ref_loss_nc, ref_stats_nc = verl_algos.compute_policy_loss_vanilla(old, new, adv, m, loss_agg_mode=mode,
                                                                       config=_actor_config(low, high, 1e9, mode))
    loss_nc, stats_nc = algos.clipped(old, new, adv, m, clip_ratio_low=low, clip_ratio_high=high, agg_mode=mode)
    close(loss_nc, ref_loss_nc)
    close(stats_nc["clipfrac"], ref_stats_nc["actor/pg_clipfrac"])


def test_golden_policy_loss_gradients(verl_algos, batch):
    old, adv, m = batch["old_lp"], batch["adv"], batch["mask"]
    new_ours = batch["new_lp"].clone().requires_grad_(True)
    new_ref = batch["new_lp"].clone().requires_grad_(True)
    algos.dual_clip(old, new_ours, adv, m, clip_ratio_high=0.28, clip_ratio_c=2.0)[0].backward()
    verl_algos.compute_policy_loss_vanilla(old, new_ref, adv, m, config=_actor_config(0.2, 0.28, 2.0))[0].backward()
    close(new_ours.grad, new_ref.grad)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                  "seq-mean-token-mean"])
def test_golden_agg_loss(verl_algos, batch, mode):
    loss_mat, m = batch["adv"], batch["mask"].clone()
    m[5] = 0  # a fully masked sequence
    close(algos.agg_loss(loss_mat, m, mode), verl_algos.agg_loss(loss_mat, m, mode))
    close(algos.agg_loss(loss_mat, m, mode, loss_scale_factor=4.0),
          verl_algos.agg_loss(loss_mat, m, mode, loss_scale_factor=4))
    gb = GlobalBatchInfo(dp_size=4, num_tokens=333, num_seqs=50)
    close(algos.agg_loss(loss_mat, m, mode, global_batch=gb),
          verl_algos.agg_loss(loss_mat, m, mode, dp_size=4, batch_num_tokens=333, global_batch_size=50))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("clip", [0.2, 0.5])
def test_golden_value_loss(verl_algos, batch, mode, clip):
    vp, v, ret, m = batch["vpreds"], batch["values"], batch["returns"], batch["mask"]
    loss, stats = algos.value_loss(vp, v, ret, m, cliprange_value=clip, agg_mode=mode)
    ref_loss, ref_clipfrac = verl_algos.compute_value_loss(vpreds=vp, returns=ret, values=v, response_mask=m,
                                                           cliprange_value=clip, loss_agg_mode=mode)
    close(loss, ref_loss)
    close(stats["clipfrac"], ref_clipfrac)


@pytest.mark.parametrize("kind", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "k3+", "abs+", "k2+"])
def test_golden_kl_penalty(verl_algos, batch, kind):
    ref_lp = batch["ref_lp"].clone()
    ref_lp[0, 0] = batch["old_lp"][0, 0] + 30.0  # exercise the k3 clamps
    ours_lp = batch["old_lp"].clone().requires_grad_(True)
    verl_lp = batch["old_lp"].clone().requires_grad_(True)
    ours = algos.kl_penalty(ours_lp, ref_lp, kind)
    ref = verl_algos.kl_penalty(verl_lp, ref_lp, kind)
    close(ours.detach(), ref.detach())
    (ours * batch["mask"]).sum().backward()
    (ref * batch["mask"]).sum().backward()
    close(ours_lp.grad, verl_lp.grad)


def test_golden_kl_in_reward_and_loss(verl_algos, batch):
    kl = algos.kl_penalty(batch["old_lp"], batch["ref_lp"], "k1")
    rewards, stats = algos.apply_kl_to_rewards(batch["rewards"], kl, 0.05, batch["mask"])
    ref_kl = verl_algos.kl_penalty(batch["old_lp"], batch["ref_lp"], "kl") * batch["mask"]
    close(rewards, batch["rewards"] - 0.05 * ref_kl)
    close(stats["kl"], (ref_kl.sum(-1) / batch["mask"].sum(-1)).mean())
    loss = algos.kl_loss(batch["new_lp"], batch["ref_lp"], batch["mask"], "low_var_kl", "seq-mean-token-mean")
    ref = verl_algos.agg_loss(verl_algos.kl_penalty(batch["new_lp"], batch["ref_lp"], "low_var_kl"), batch["mask"],
                              "seq-mean-token-mean")
    close(loss, ref)


def test_golden_entropy(verl_algos, batch):
    import verl.utils.torch_functional as verl_F

    close(algos.entropy_from_logits(batch["logits"]), verl_F.entropy_from_logits(batch["logits"]))
    close(algos.entropy_loss(batch["logits"], batch["mask"]),
          verl_algos.compute_entropy_loss(batch["logits"], batch["mask"]))
    close(algos.masked_whiten(batch["adv"], batch["mask"]), verl_F.masked_whiten(batch["adv"], batch["mask"]))
