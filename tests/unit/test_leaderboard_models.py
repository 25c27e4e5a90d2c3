"""The leaderboard's model rows: a model trained per world names its folder with '{world}', each world scores its
own; such a row cannot be scored on the real pair sets."""
import pytest

from pr_rlhf.actors import leaderboard_model_reward
from pr_rlhf.configs.leaderboard import LeaderboardConfig

ROW = {"reward": {"kind": "scalar", "input_mode": "history", "top_k_profile": 3,
                  "scalar_rm": {"model": "runs/bt/w{world}/history/model"}}}


def test_a_per_world_model_row_scores_each_world_with_its_own_model():
    cfg = LeaderboardConfig(models={"bt_history": ROW})
    assert leaderboard_model_reward(cfg, "bt_history", 3).scalar_rm.model == "runs/bt/w3/history/model"
    assert leaderboard_model_reward(cfg, "bt_history", 5).scalar_rm.model == "runs/bt/w5/history/model"
    assert leaderboard_model_reward(cfg, "bt_history").scalar_rm.model == "runs/bt/w{world}/history/model"
    assert leaderboard_model_reward(cfg, "bt_history", 3).input_mode == "history"


def test_a_per_world_model_row_is_refused_on_the_real_pair_sets():
    with pytest.raises(ValueError, match="datasets"):
        LeaderboardConfig(models={"bt_history": {**ROW, "datasets": True}})
