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


def test_the_fine_tuned_bt_rms_are_rows_of_their_own_read_as_train_rm_reads_them():
    from pr_rlhf.actors import leaderboard_bt_reward, leaderboard_groups

    bt = {"model": "tiny", "input_modes": ["none", "history"], "top_k_profile": 3, "max_length": 256}
    cfg = LeaderboardConfig(bt_rm=bt)
    assert cfg.bt_rows() == ["bt_none", "bt_history"]
    reward = leaderboard_bt_reward(cfg, "history", "runs/x/w2/bt_rm/history/model")
    assert (reward.kind, reward.input_mode, reward.top_k_profile) == ("scalar", "history", 3)
    assert reward.scalar_rm.model == "runs/x/w2/bt_rm/history/model" and reward.scalar_rm.max_length == 256
    phases = {g.phase for g in leaderboard_groups(cfg)}
    assert {"leaderboard bt training", "leaderboard score bt_none", "leaderboard score bt_history"} <= phases
    assert LeaderboardConfig(bt_rm=bt, baseline="bt_none").baseline == "bt_none"
    with pytest.raises(ValueError, match="history, not posts"):
        LeaderboardConfig(bt_rm={**bt, "input_modes": ["profile"]})
    with pytest.raises(ValueError, match="bt_rm already"):
        LeaderboardConfig(bt_rm=bt, models={"bt_none": ROW})
