"""The Bradley-Terry RM's training data and config: seen users' train pairs only, the scalar RM's own encoding,
a resumable step order, the rm: section's validation, and the pair batch that keeps a pair's two sides together."""
import numpy as np
import pytest
import torch

from pr_rlhf.algos import GlobalBatchInfo
from pr_rlhf.configs.recipe import RecipeError, load_recipe
from pr_rlhf.configs.rm import RMTrainConfig
from pr_rlhf.rl.batches import REJECTED, join_pair_sides, reward_model_batch, scored_rows
from pr_rlhf.rl.objectives import reward_model_objective
from pr_rlhf.rm.data import step_pairs, training_pairs


def test_step_pairs_visit_every_pair_once_per_epoch_and_depend_on_the_step_only():
    n, bs = 10, 4
    order = np.concatenate([step_pairs(n, bs, s, seed=3) for s in range(5)])   # 20 positions = 2 epochs
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:20]) == list(range(10))
    assert not np.array_equal(order[:10], order[10:20])                          # reshuffled per epoch
    assert np.array_equal(step_pairs(n, bs, 3, seed=3), order[12:16])             # a resumed run: same pairs
    assert not np.array_equal(step_pairs(n, bs, 0, seed=4), order[:4])


def test_training_pairs_never_include_cold_start_users(tmp_path):
    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.shards import ShardReader

    world = WorldConfig(rendering="compact", users=6, cold_start_users=3, history_size=3, reference_samples=100)
    ensure_world_shards(str(tmp_path / "s"), world, log=lambda *_: None)
    data = training_pairs(str(tmp_path / "s"), "train")
    cold = {r["user_id"] for r in ShardReader(str(tmp_path / "s")).iter_rows("profiles") if r["cold_start"]}
    assert len(cold) == 3 and data.cold_start_users_excluded == 3 and data.users == 6
    assert len(data.inputs) == 6 * 3 and not {inp.user_id for inp in data.inputs} & cold
    with pytest.raises(ValueError, match="no pairs in split 'nope'"):
        training_pairs(str(tmp_path / "s"), "nope")
    # input mode 'history': each pair with the user's first k train pairs other than itself, in their order
    reader = ShardReader(str(tmp_path / "s"))
    order = {r["user_id"]: r["pair_ids"] for r in reader.iter_rows("histories")}
    text = {r["pair_id"]: r["question"] for r in reader.iter_rows("pairs", "train")}
    for inp in training_pairs(str(tmp_path / "s"), "train", history_pairs=2).inputs:
        others = [p for p in order[inp.user_id] if p != inp.pair_id][:2]
        assert [h["question"] for h in inp.history] == [text[p] for p in others]
    assert all(not inp.history for inp in data.inputs)


def test_rm_section_validation_and_defaults():
    cfg = RMTrainConfig(learner={"micro_batch_size": 2})
    assert cfg.learner.trains == "reward_model" and cfg.learner.micro_batch_size == 2
    with pytest.raises(ValueError, match="planner"):
        RMTrainConfig(input_modes=["none", "plan"])
    with pytest.raises(ValueError, match="twice"):
        RMTrainConfig(input_modes=["none", "none"])
    assert RMTrainConfig(input_modes=["none", "history"]).input_modes == ["none", "history"]
    with pytest.raises(ValueError, match="trains"):
        RMTrainConfig(learner={"trains": "policy"})
    with pytest.raises(RecipeError, match="rm.steps"):
        load_recipe(None, ["rm.steps=0"])


def test_pair_batch_keeps_both_sides_aligned_and_the_bt_loss():
    batch = reward_model_batch({"chosen_ids": [[5, 6, 7], [8, 9]], "rejected_ids": [[5, 6], [8, 9, 10, 11]],
                                "margin": [0.0, 1.0]})
    assert batch["response_ids"].tolist() == [[7], [9]] and batch[REJECTED + "response_ids"].tolist() == [[6], [11]]
    joined = join_pair_sides(batch)
    assert joined["prompt_ids"].shape == (4, 3) and joined["prompt_mask"].sum(-1).tolist() == [2, 1, 1, 3]
    with pytest.raises(ValueError, match="at least 2"):
        scored_rows([[1]])
    gb = GlobalBatchInfo(dp_size=1, num_tokens=2.0, num_seqs=2.0)
    out = reward_model_objective(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]), batch["margin"], gb)
    logsig = torch.nn.functional.logsigmoid
    expected = -(logsig(torch.tensor(2.0)) + logsig(torch.tensor(-1.0))) / 2   # the second pair's margin is 1
    assert out.loss.item() == pytest.approx(expected.item()) and out.token_sums["accuracy"] == 1.0
