"""The pairwise judge as a reward (``genrm_mode="pairwise"``): the response in slot A against the request's reference
in slot B, its written verdict or its probability of answering A; the ``history`` input mode (the judge "+ preference
history"); and the leaderboard's sample of users for a slow model row."""
from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from pr_rlhf.configs.reward import reward_config
from pr_rlhf.leaderboard.data import Item, first_pairs, first_users
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.reward.inputs import RMInput, user_block
from pr_rlhf.reward.judge import VERDICT_LINES, slot_a_probabilities
from pr_rlhf.reward.sec import sec_prompt
from pr_rlhf.scorers import GenRMScorer, RewardRequest

HISTORY = [{"question": f"q{i}", "chosen": f"liked {i}", "rejected": f"disliked {i}"} for i in range(5)]


def text_of(prompt) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def slot_a(prompt) -> str:
    text = text_of(prompt)
    return text.split("[Answer A]")[1].split("[End of Answer A]")[0]


class ScriptedJudge:
    """Writes ``reply(slot A's text)``, and scores the two verdict lines by ``logprobs(slot A's text)``."""

    name = "scripted"

    def __init__(self, reply=None, logprobs=None):
        self.reply, self.logprobs = reply, logprobs
        self.prompts: list = []

    def generate(self, prompts, params):
        self.prompts += prompts
        return [Generation(samples=[Sample(text=self.reply(slot_a(p)))]) for p in prompts]

    def score_continuations(self, prefix, continuations):
        self.prompts.append(prefix)
        assert continuations == list(VERDICT_LINES)
        return self.logprobs(slot_a(prefix))

    def close(self):
        pass


def request(response: str, reference: str | None = "the other answer", history=HISTORY) -> RewardRequest:
    meta = {"history": history, **({"reference": reference} if reference is not None else {})}
    return RewardRequest(f"r-{response}", "u1", "What should I cook?", response, meta)


def scorer(engine, **kw) -> GenRMScorer:
    return GenRMScorer(reward_config(kind="genrm", genrm_mode="pairwise", **kw), engine=engine)


def test_the_written_verdict_scores_slot_a_one_or_zero_and_a_failure_is_typed():
    replies = {"GOOD": "Fits them.\nResult: A", "BAD": "Result: B", "MUMBLE": "I cannot decide."}
    engine = ScriptedJudge(reply=lambda a: replies[a.strip()])
    got = scorer(engine).score([request("GOOD"), request("BAD"), request("MUMBLE"), request("GOOD", reference=None)])
    assert got[:2] == [(1.0, None), (0.0, None)]
    assert got[2] == (None, "no_verdict")
    assert got[3][0] is None and got[3][1].startswith("missing_reference")
    assert len(engine.prompts) == 3    # the request without a reference never reached the judge


def test_the_probability_readout_is_the_judges_share_of_result_a():
    engine = ScriptedJudge(logprobs=lambda a: {"GOOD": [-1.0, -2.0], "BAD": [-3.0, -0.5]}[a.strip()])
    (good, e1), (bad, e2) = scorer(engine, verdict_readout="probability").score([request("GOOD"), request("BAD")])
    assert e1 is None and e2 is None
    assert good == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert bad == pytest.approx(1 / (1 + math.exp(2.5)))
    assert not [p for p in engine.prompts if "Result" not in text_of(p)] and engine.prompts   # the judge's prompt


def test_a_prompt_the_engine_refuses_is_that_requests_error_and_an_engine_that_cannot_score_raises():
    def too_long(a):
        raise ValueError("prefix + continuation is 9000 tokens; max_model_len is 2048")

    assert slot_a_probabilities(ScriptedJudge(logprobs=too_long), [[{"role": "user", "content": "[Answer A]x"
                                                                     "[End of Answer A]"}]]) == [(None, "engine_error")]

    def unsupported(a):
        raise RuntimeError("the server cannot score continuations")

    with pytest.raises(RuntimeError, match="cannot score"):
        scorer(ScriptedJudge(logprobs=unsupported), verdict_readout="probability").score([request("GOOD")])


def test_the_history_mode_shows_the_users_first_pairs_to_the_judge():
    engine = ScriptedJudge(reply=lambda a: "Result: A")
    scorer(engine, input_mode="history", top_k_profile=3).score([request("GOOD")])
    text = text_of(engine.prompts[0])
    assert all(f"liked {i}" in text for i in range(3)) and "liked 3" not in text
    engine = ScriptedJudge(reply=lambda a: "Result: A")
    scorer(engine).score([request("GOOD")])                       # input_mode none: nothing about the user
    assert "liked 0" not in text_of(engine.prompts[0])


def test_the_sec_prompt_shows_the_history_once_in_history_mode():
    inp = RMInput("p", "u", "S", "Q?", "one", "two", history=HISTORY[:2])
    assert user_block(inp, "history", 10).count("Chosen: liked 1") == 1
    assert text_of(sec_prompt(inp, "one", "two", mode="history")).count("Chosen: liked 1") == 1


def test_the_config_names_what_the_readout_needs():
    assert reward_config(kind="genrm", genrm_mode="pairwise").compares_with_reference
    assert not reward_config(kind="genrm", genrm_mode="pointwise").compares_with_reference
    with pytest.raises(ValidationError, match="verdict_readout"):
        reward_config(kind="genrm", genrm_mode="pointwise", verdict_readout="probability")


def test_first_users_keeps_every_pair_of_the_first_users_of_each_group():
    items = [Item(f"{g}{u}-{k}", f"{g}-user{u}", g, "q", "c", "r") for g in ("seen", "cold") for u in (3, 1, 2)
             for k in range(2)]
    kept = first_users(items, 2)
    assert {(it.group, it.user_id) for it in kept} == {("seen", "seen-user1"), ("seen", "seen-user2"),
                                                       ("cold", "cold-user1"), ("cold", "cold-user2")}
    assert len(kept) == 8 and kept == [it for it in items if it in kept]     # every pair of theirs, in order
    assert first_users(items, None) == items


def test_first_pairs_keeps_each_users_first_pairs_in_order():
    items = [Item(f"p{k}-{u}", u, "seen", "q", "c", "r") for k in range(5) for u in ("b", "a")]
    kept = first_pairs(items, 2)
    assert [it.pair_id for it in kept] == ["p0-b", "p0-a", "p1-b", "p1-a"]
    assert first_pairs(items, None) == items and first_pairs(items, 9) == items


def test_the_probability_readout_on_a_real_model_is_its_own_two_verdict_probabilities():
    """The tiny random-init model (transformers engine): every request gets a probability strictly inside (0, 1),
    equal to the softmax of the engine's own log-probabilities of the two verdict lines."""
    from pr_rlhf.configs.recipe import engine_config
    from pr_rlhf.models import make_engine
    from pr_rlhf.reward.judge import judge_prompt
    from pr_rlhf.scorers import request_input

    engine = make_engine(engine_config(backend="hf", model="tiny", max_model_len=2048))
    try:
        requests = [request("a short answer"), request("a long answer with steps", reference="short")]
        got = scorer(engine, verdict_readout="probability", input_mode="history").score(requests)
        for (p, error), req in zip(got, requests):
            inp = request_input(req)
            a, b = engine.score_continuations(judge_prompt(inp, inp.chosen, inp.rejected, "history", 10),
                                              list(VERDICT_LINES))
            assert error is None and 0 < p < 1 and p == pytest.approx(1 / (1 + math.exp(b - a)), abs=1e-6)
    finally:
        engine.close()


@pytest.mark.parametrize("readout", ["text", "probability"])
def test_a_pair_sent_to_the_reward_service_gets_each_response_judged_against_the_other(readout):
    """``/score`` with ``responses: [a, b]`` on the pairwise judge: both responses' scores, each response in slot A
    against the other (the leaderboard's both orders, so the position bias cancels), not one verdict and not two
    requests without a reference; a single response still needs its ``reference``."""
    from pr_rlhf.serve.schema import ScoreItem
    from workers.reward_service import _evaluate

    engine = ScriptedJudge(reply=lambda a: {"GOOD": "Result: A", "BAD": "Result: B"}[a.strip()],
                           logprobs=lambda a: {"GOOD": [-0.2, -2.0], "BAD": [-2.0, -0.3]}[a.strip()])
    judge = scorer(engine, verdict_readout=readout)
    pair, single = _evaluate(judge, [ScoreItem(user_id="u1", query="What should I cook?", responses=["GOOD", "BAD"]),
                                     ScoreItem(user_id="u1", query="What should I cook?", response="GOOD")])
    assert pair.status == "ok" and pair.scores is not None and len(pair.scores) == 2, pair
    good, bad = pair.scores
    assert good > 0.5 > bad and pair.score == good
    slots = sorted((slot_a(p).strip(), text_of(p).split("[Answer B]")[1].split("[End of Answer B]")[0].strip())
                   for p in engine.prompts)
    assert slots == [("BAD", "GOOD"), ("GOOD", "BAD")]    # each response against the other
    assert single.score is None and single.status == "missing_reference", single
