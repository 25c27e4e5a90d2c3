"""How the RL controller turns a reward pool's results into per-sample rewards: the reference a comparing reward
(the P-GenRM's chain) judges each sample against, and what an unscorable sample gets."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pr_rlhf.configs.reward import GenRMRewardConfig, GoldRewardConfig
from pr_rlhf.configs.rl import RLConfig
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.rl.prompts import PromptItem
from workers.controller import RLController


class RecordingPool:
    """Scores a response by its length; responses containing 'bad' cannot be scored."""

    def __init__(self):
        self.requests = []

    def score(self, requests):
        self.requests += requests
        return [SimpleNamespace(score=None if "bad" in r.response else float(len(r.response)),
                                error="unparsed" if "bad" in r.response else None) for r in requests]


def controller(reward, failures="raise"):
    c = RLController.__new__(RLController)
    c.cfg = RLConfig(reward_failures=failures)
    c.reward_pool = RecordingPool()
    c.reward_compares = bool(getattr(reward, "compares_with_reference", False))
    return c


def items_and_gens(groups):
    items = [PromptItem(f"q{i}", f"u{i}", "s", "question", [], (), ({"question": "h", "chosen": "a",
                                                                  "rejected": "b"},)) for i in range(len(groups))]
    gens = [Generation(samples=[Sample(text=t, token_ids=[]) for t in texts]) for texts in groups]
    return items, gens


def test_a_comparing_reward_judges_every_sample_against_its_prompts_first_sample():
    c = controller(GenRMRewardConfig())
    items, gens = items_and_gens([["aa", "bbbb", "c"], ["dd", "e"]])
    rewards, failed = c._score(items, gens, "t")
    assert failed == 0 and rewards.tolist() == [2, 4, 1, 2, 1]
    assert [r.meta["reference"] for r in c.reward_pool.requests] == ["aa", "aa", "aa", "dd", "dd"]
    assert all(r.meta["history"] == [{"question": "h", "chosen": "a", "rejected": "b"}]
               for r in c.reward_pool.requests)
    plain = controller(GoldRewardConfig())
    plain._score(items, gens, "t")
    assert all("reference" not in r.meta for r in plain.reward_pool.requests)


def test_an_unscored_sample_stops_the_step_or_gets_its_prompts_mean():
    items, gens = items_and_gens([["aa", "bad", "aaaa"], ["bad", "bad"]])
    with pytest.raises(RuntimeError, match="3 of 5 rewards failed.*reward_failures"):
        controller(GoldRewardConfig())._score(items, gens, "t")
    rewards, failed = controller(GoldRewardConfig(), "neutral")._score(items, gens, "t")
    assert failed == 3
    np.testing.assert_allclose(rewards, [2, 3, 4, 0, 0])   # the prompt's scored mean; none scored: 0


def test_a_comparing_reward_needs_groups():
    from pr_rlhf.configs.recipe import Recipe

    with pytest.raises(ValueError, match="group_size must be >= 2"):
        RLController(Recipe(reward={"kind": "genrm"}, train={"algorithm": "ppo", "group_size": 1,
                                                             "learner": {"critic": {"enabled": True}}}))
