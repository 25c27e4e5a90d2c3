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
    assert LeaderboardConfig(bt_rm={**bt, "input_modes": ["profile"]}).bt_rows() == ["bt_profile"]
    with pytest.raises(ValueError, match="not plans"):
        LeaderboardConfig(bt_rm={**bt, "input_modes": ["plan"], "planner": {"model": "tiny"}})
    with pytest.raises(ValueError, match="bt_rm already"):
        LeaderboardConfig(bt_rm=bt, models={"bt_none": ROW})


def test_a_row_reading_posts_gets_each_pairs_retrieved_posts_from_its_shards(tmp_path):
    """``bt_profile`` reads what `pr-rlhf data build` retrieved for the pair (what its RM was trained on): the
    evaluation items of a world get their pair rows' posts; a pair the shards lack is an error naming them."""
    from dataclasses import replace

    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.leaderboard.data import evaluation_items, with_profiles
    from pr_rlhf.shards import ShardReader
    from pr_rlhf.world import build_world

    world = WorldConfig(rendering="compact", users=6, cold_start_users=3, history_size=3, reference_samples=100)
    ensure_world_shards(str(tmp_path / "s"), world, log=lambda *_: None)
    items = evaluation_items(build_world(world))
    shown = with_profiles(items, str(tmp_path / "s"))
    rows = {r["pair_id"]: r["retrieved"] for r in ShardReader(str(tmp_path / "s")).iter_rows("pairs")}
    assert [it.profile for it in shown] == [list(rows[it.pair_id]) for it in items]
    assert all(it.profile and it.profile[0]["text"] for it in shown)       # every user has posts, cold ones too
    assert {it.group for it in shown} == {"seen", "cold"} and not any(it.profile for it in items)
    with pytest.raises(ValueError, match=r"no pair rows for evaluation pairs \['stray'\]"):
        with_profiles([replace(items[0], pair_id="stray")], str(tmp_path / "s"))
