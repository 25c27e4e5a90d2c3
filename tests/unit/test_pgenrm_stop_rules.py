"""A GRPO stage's stop rules (KL and parse-rate limits held for ``stop_patience`` steps) and what a stopped stage
exports with ``on_stop: rollback``: the newest kept checkpoint whose weights passed the limits when measured."""
import pytest

from pr_rlhf.configs.pgenrm import GRPOStageConfig
from workers.pgenrm import PGenRMPipeline
from workers.rl_loop import checkpoint_step, complete_checkpoints

stop_reason, rollback_step = PGenRMPipeline.stop_reason, PGenRMPipeline.rollback_step


def steps(kls, rates=None):
    return [{"actor/kl_loss": kl, "reward/parse_rate": 1.0 if rates is None else rates[i]} for i, kl in enumerate(kls)]


def test_a_limit_stops_the_stage_only_when_held_for_the_patience():
    cfg = GRPOStageConfig(stop_kl=0.05, stop_parse_rate=0.9, stop_patience=2)
    assert stop_reason(steps([0.01, 0.06]), cfg) is None                 # one step over: go on
    assert stop_reason(steps([0.06, 0.01, 0.06]), cfg) is None
    assert "KL per token 0.0700 > 0.05 for 2 steps" in stop_reason(steps([0.01, 0.06, 0.07]), cfg)
    assert "parse rate 0.500 < 0.9" in stop_reason(steps([0.0] * 3, [1.0, 0.8, 0.5]), cfg)
    assert stop_reason([{"train/kl": 0.1}] * 2, cfg) is not None          # KL in the reward counts too
    assert stop_reason(steps([1.0] * 5), GRPOStageConfig()) is None      # no limits set


def test_rollback_picks_the_newest_checkpoint_whose_next_step_passed():
    cfg = GRPOStageConfig(stop_kl=0.05, stop_patience=2, checkpoint_every=2, on_stop="rollback")
    # history[n] is the step that starts from checkpoint n's weights: checkpoint 4 measured 0.06 (over), 2 passed
    history = steps([0.0, 0.01, 0.02, 0.03, 0.06, 0.07, 0.08])
    assert rollback_step(history, [2, 4, 6], cfg) == 2
    assert rollback_step(history, [4, 6], cfg) == 0                        # none passed: the starting model
    assert rollback_step(history, [], cfg) == 0
    # a checkpoint written at the stop step has no measurement yet
    assert rollback_step(steps([0.0, 0.01]), [2], cfg) == 0
    rates = GRPOStageConfig(stop_parse_rate=0.9, stop_patience=1, on_stop="rollback")
    assert rollback_step(steps([0.0] * 4, [1.0, 0.95, 0.5, 0.4]), [1, 2, 3], rates) == 1


@pytest.mark.parametrize("patience, every, kept", [(2, 10, 2), (2, 1, 4), (3, 2, 3), (1, 1, 3)])
def test_rollback_keeps_the_checkpoints_that_reach_past_the_stop_window(patience, every, kept):
    cfg = GRPOStageConfig(stop_kl=0.05, stop_patience=patience, checkpoint_every=every, on_stop="rollback")
    assert cfg.checkpoints_kept == kept
    assert GRPOStageConfig(stop_patience=patience, checkpoint_every=every).checkpoints_kept == 1
    with pytest.raises(ValueError, match="nothing would stop the stage"):
        GRPOStageConfig(on_stop="rollback")
    # wherever the KL rises for good (history[first_over] the first step over the limit, the stop `patience`
    # steps later), the checkpoints kept at the stop still include the newest one measured under it
    for first_over in range(every + 1, every * 6):
        stop = first_over + patience   # 1-based: len(history)
        written = [n for n in range(every, stop + 1, every)][-kept:]
        history = steps([0.0] * first_over + [1.0] * patience)
        assert rollback_step(history, written, cfg) == max(n for n in range(0, stop + 1, every) if n < first_over)


def test_checkpoint_folders_by_step(tmp_path):
    for step in (10, 2, 30):
        (tmp_path / f"step_{step:06d}").mkdir()
        (tmp_path / f"step_{step:06d}" / "COMPLETE").write_text("")
    (tmp_path / "step_000040").mkdir()   # incomplete: not a checkpoint
    assert [checkpoint_step(p) for p in complete_checkpoints(tmp_path)] == [2, 10, 30]


class FakeLearner:
    """Records the checkpoint it was rolled back to; exports a file naming it."""
    loaded = None

    def load_checkpoint(self, path):
        self.loaded = path

    def export_model(self, out):
        (out / "weights.txt").write_text(str(self.loaded))


def test_a_stopped_stage_exports_the_picked_checkpoint_or_a_copy_of_its_start(tmp_path):
    cfg = GRPOStageConfig(stop_kl=0.05, stop_patience=1, checkpoint_every=2, on_stop="rollback")
    pipeline = PGenRMPipeline.__new__(PGenRMPipeline)   # only the stage's folder logic, no recipe
    events = []
    pipeline.on_event = events.append
    start = tmp_path / "start"
    start.mkdir()
    (start / "config.json").write_text("{}")
    for case, history in (("back", steps([0.0, 0.01, 0.02, 0.03, 0.06])), ("start", steps([0.06, 0.07, 0.08]))):
        sdir = tmp_path / case
        for n in (2, 4):
            (sdir / "checkpoints" / f"step_{n:06d}").mkdir(parents=True)
            (sdir / "checkpoints" / f"step_{n:06d}" / "COMPLETE").write_text("")
        learner = FakeLearner()
        model = pipeline._roll_back(learner, str(start), sdir, history, cfg)
        assert model == str(sdir / "model")
        if case == "back":   # checkpoint 4 measured 0.06 on the step after it: back to 2
            assert history[-1]["rolled_back_to"] == 2
            assert learner.loaded == sdir / "checkpoints" / "step_000002" / "learner"
            assert (sdir / "model" / "weights.txt").read_text() == str(learner.loaded)
        else:                # checkpoint 2 measured 0.08: the starting model
            assert history[-1]["rolled_back_to"] == 0 and learner.loaded is None
            assert (sdir / "model" / "config.json").read_text() == "{}"
    assert events[-1] == f"rolled back to {start}"
