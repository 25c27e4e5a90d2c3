"""What each reward config builds (pr_rlhf.configs.reward: ``engines()``), read alike by the scorers, the pre-flight
check and `pr-rlhf plan`: a judge, a planner (shared with an equal judge), a scalar RM, or none."""
from __future__ import annotations

import pytest

import pr_rlhf.models
from pr_rlhf.configs.base import ScalarRMConfig, engine_config
from pr_rlhf.configs.reward import EngineRef, reward_config
from pr_rlhf.scorers import GenRMScorer

JUDGE = {"model": "tiny", "device": "cpu"}
OTHER = {"model": "tiny-genrm", "device": "cpu"}


def shape(cfg) -> list[tuple[str, tuple[str, ...]]]:
    return [(ref.field, ref.roles) for ref in cfg.engines()]


def test_each_kind_lists_the_engines_a_worker_builds():
    assert shape(reward_config(kind="gold")) == []
    assert shape(reward_config(kind="world_estimate")) == []
    assert shape(reward_config(kind="pal", model="m")) == []          # an embedding model: no engine
    assert shape(reward_config(kind="genrm", judge=JUDGE)) == [("judge", ("judge",))]
    assert shape(reward_config(kind="rubric", judge=JUDGE)) == [("judge", ("judge",))]
    assert shape(reward_config(kind="http", judge={"backend": "openai", "model": "m"})) == [("judge", ("judge",))]
    # a planner equal to the judge is the judge's engine; another is its own
    assert shape(reward_config(kind="genrm", judge=JUDGE, planner=JUDGE, input_mode="plan")) == [
        ("judge", ("judge", "planner"))]
    assert shape(reward_config(kind="genrm", judge=JUDGE, planner=OTHER, input_mode="plan")) == [
        ("judge", ("judge",)), ("planner", ("planner",))]
    assert shape(reward_config(kind="scalar", planner=JUDGE, input_mode="plan")) == [
        ("scalar_rm", ("scalar_rm",)), ("planner", ("planner",))]
    # the persona's judge writes the persona even when a scalar RM reads it
    assert shape(reward_config(kind="persona", judge=JUDGE)) == [("judge", ("judge",))]
    assert shape(reward_config(kind="persona", judge=JUDGE, scalar_rm={"device": "cuda"})) == [
        ("judge", ("judge",)), ("scalar_rm", ("scalar_rm",))]
    planned = reward_config(kind="genrm", judge=JUDGE, planner=OTHER, input_mode="plan")
    assert planned.engine_for("planner").field == "planner" and planned.engine_for("scalar_rm") is None
    assert planned.engines()[1].at("bon.reward_models.x").field == "bon.reward_models.x.planner"


def test_an_engines_gpus():
    assert EngineRef("e", engine_config(backend="vllm", device="cuda", tensor_parallel_size=4)).gpus == 4
    assert EngineRef("e", engine_config(backend="hf", device="cuda:1")).gpus == 1
    assert EngineRef("e", engine_config(backend="vllm", device="cpu", tensor_parallel_size=4)).gpus == 0
    assert EngineRef("e", engine_config(backend="openai", model="m")).gpus == 0
    assert EngineRef("e", ScalarRMConfig(device="cuda")).gpus == 1 and EngineRef("e", ScalarRMConfig()).gpus == 0


class Scripted:
    def close(self) -> None:
        pass


@pytest.mark.parametrize("planner,shared", [(JUDGE, True), (OTHER, False)])
def test_the_genrm_scorer_shares_the_judges_engine_with_an_equal_planner(monkeypatch, planner, shared):
    built = []

    def make_engine(cfg):
        built.append(cfg.model)
        return Scripted()

    monkeypatch.setattr(pr_rlhf.models, "make_engine", make_engine)
    judge = Scripted()
    scorer = GenRMScorer(reward_config(kind="genrm", judge=JUDGE, planner=planner, input_mode="plan"), engine=judge)
    assert (scorer.planner.engine is judge) is shared
    assert built == ([] if shared else ["tiny-genrm"])
