"""SynthesizeMe's persona (``pr_rlhf.reward.persona``) with a scripted engine: only reasoning traces that predicted
the user's choice are kept, the candidate persona that predicts the user's held-out choices best is chosen, a
user with too few pairs gets none, unreadable guesses are counted; the ``persona`` reward kind reads it as the
user's stated preferences."""
from __future__ import annotations

import re

import pytest

from pr_rlhf.configs.reward import reward_config
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.reward.judge import chosen_slot
from pr_rlhf.reward.persona import Choice, synthesize
from pr_rlhf.scorers import PersonaScorer, RewardRequest

CHOICES = [Choice(f"c{i}", f"question {i}", f"short answer {i}", f"a long and winding answer {i}") for i in range(6)]


class Oracle:
    """Guesses right on the listed choices, wrong on the others; writes persona candidates in turn; rates answers by
    whether the persona it is shown mentions brevity and the answer is short."""

    name = "oracle"

    def __init__(self, right: set[str], personas: list[str]) -> None:
        self.right, self.personas, self.written = right, list(personas), 0
        self.prompts: list = []

    def _answer(self, messages) -> str:
        system, user = messages[0]["content"], messages[-1]["content"]
        self.prompts.append(user)
        if "Write their persona" in user:
            self.written += 1
            return self.personas[(self.written - 1) % len(self.personas)]
        if "Which answer did this person pick" in user:
            i = int(re.search(r"question (\d+)", user).group(1))
            truth = chosen_slot(0, f"c{i}")
            if f"c{i}" in self.right or "brief" in user:
                return f"They like brevity.\nResult: {truth}"
            if i == 5:
                return "I cannot tell."
            return f"They like detail.\nResult: {'B' if truth == 'A' else 'A'}"
        if "Score: N" in system:
            short = "short answer" in user
            return f"Score: {9 if short and 'brief' in user else 3}"
        return ""

    def generate(self, prompts, params):
        return [Generation(samples=[Sample(text=self._answer(p), token_ids=[1])]) for p in prompts]


def test_traces_are_kept_only_when_they_predict_the_choice_and_the_best_candidate_wins():
    engine = Oracle(right={"c0", "c2"}, personas=["Likes detail.", "Wants brief answers.", "Unclear."])
    persona = synthesize(engine, CHOICES, params=None, seed=0, candidates=3, validation=2)
    # induction on c0-c3 (c4, c5 held out): c0 and c2 guessed right, c1 and c3 wrong
    assert (persona.traces, persona.traces_kept, persona.unparsed) == (4, 2, 0)
    kept = [p for p in engine.prompts if "Observations" in p][0]
    assert kept.count("They like brevity.") == 2 and "They like detail" not in kept
    # the persona mentioning brevity predicts both held-out choices; the others predict them as the trace did
    assert persona.text == "Wants brief answers." and dict(persona.candidates)["Wants brief answers."] == 1.0
    assert dict(persona.candidates)["Likes detail."] == 0.0


def test_a_user_with_too_few_pairs_gets_no_persona_and_unreadable_guesses_are_counted():
    assert synthesize(Oracle(set(), ["x"]), CHOICES[:2], params=None, validation=2).text == ""
    persona = synthesize(Oracle(set(), ["x"]), CHOICES, params=None, validation=0)
    assert persona.unparsed == 1 and persona.traces_kept == 0 and persona.text == ""


def test_the_persona_kind_reads_the_persona_as_the_users_stated_preferences():
    engine = Oracle(right={"c0", "c1", "c2", "c3"}, personas=["Wants brief answers."])
    scorer = PersonaScorer(reward_config(kind="persona", candidates=1), engine=engine)
    history = [{"question": c.question, "chosen": c.chosen, "rejected": c.rejected} for c in CHOICES]
    requests = [RewardRequest(f"r{i}", "u1", "question 9", answer, {"history": history})
                for i, answer in enumerate(["short answer 9", "a long and winding answer 9"])]
    scores = [s for s, _ in scorer.score(requests)]
    assert scores == [9.0, 3.0]
    assert scorer.book.personas and next(iter(scorer.book.personas.values())).text == "Wants brief answers."
    rating = [p for p in engine.prompts if "How well does this answer suit" in p][0]
    assert "Wants brief answers." in rating


def test_the_pairwise_reader_shows_the_persona_to_the_judge_against_the_reference():
    """``reader: pairwise`` (SynthesizeMe's own reader): the persona in the pairwise judge's user block, the response
    in slot A against the request's reference; with the probability readout, the judge's share of 'Result: A'. A
    user without a persona gets exactly the prompt of the judge that knows nothing of the user."""
    from pr_rlhf.reward.judge import VERDICT_LINES, judge_prompt
    from pr_rlhf.scorers import GenRMScorer, request_input

    class Reader(Oracle):
        def __init__(self, *a):
            super().__init__(*a)
            self.scored: list = []

        def score_continuations(self, prefix, continuations):
            assert continuations == list(VERDICT_LINES)
            self.scored.append(prefix)
            text = prefix[-1]["content"]
            answer_a = text.split("[Answer A]")[1].split("[End of Answer A]")[0]
            fits = "brief" in text and "short answer" in answer_a
            return (-0.1, -2.0) if fits else (-2.0, -0.1)

    engine = Reader({"c0", "c1", "c2", "c3"}, ["Wants brief answers."])
    cfg = reward_config(kind="persona", candidates=1, reader="pairwise", verdict_readout="probability")
    scorer = PersonaScorer(cfg, engine=engine)
    assert scorer.compares_with_reference and cfg.compares_with_reference
    history = [{"question": c.question, "chosen": c.chosen, "rejected": c.rejected} for c in CHOICES]
    short, long = "short answer 9", "a long and winding answer 9"
    requests = [RewardRequest("r0", "u1", "question 9", short, {"history": history, "reference": long}),
                RewardRequest("r1", "u1", "question 9", long, {"history": history, "reference": short}),
                RewardRequest("r2", "u2", "question 9", short, {"history": history[:1], "reference": long}),
                RewardRequest("r3", "u1", "question 9", short, {"history": history})]
    got = scorer.score(requests)
    assert got[0][0] > 0.8 and got[1][0] < 0.2        # the persona makes the short answer win in either slot
    assert got[3][0] is None and got[3][1].startswith("missing_reference")
    assert "Wants brief answers." in engine.scored[0][-1]["content"]
    # u2 has one pair: no persona, and the judge's prompt is the one that shows nothing about the user
    assert engine.scored[2] == judge_prompt(request_input(requests[2]), short, long)
    genrm = GenRMScorer(reward_config(kind="genrm", genrm_mode="pairwise", verdict_readout="probability"),
                        engine=engine)
    assert genrm.score(requests[2:3]) == got[2:3]
    # a pair sent to the reward service: both responses' scores, each against the other (as r0 and r1 above)
    from pr_rlhf.serve.schema import ScoreItem
    from workers.reward_service import _evaluate

    (pair,) = _evaluate(scorer, [ScoreItem(user_id="u1", query="question 9", responses=[short, long],
                                           history=history)])
    assert pair.scores == pytest.approx([got[0][0], got[1][0]]), pair


def test_the_persona_readers_settings_are_checked():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="verdict_readout"):
        reward_config(kind="persona", verdict_readout="probability")
    with pytest.raises(ValidationError, match="scalar_rm"):
        reward_config(kind="persona", reader="pairwise", scalar_rm={"model": "tiny"})
    assert not reward_config(kind="persona").compares_with_reference
