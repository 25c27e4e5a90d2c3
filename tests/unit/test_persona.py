"""SynthesizeMe's persona (``pr_rlhf.reward.persona``) with a scripted engine: only reasoning traces that predicted
the user's choice are kept, the candidate persona that predicts the user's held-out choices best is chosen, a
user with too few pairs gets none, unreadable guesses are counted; the ``persona`` reward kind reads it as the
user's stated preferences."""
from __future__ import annotations

import re

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
    assert scorer.personas and next(iter(scorer.personas.values())).text == "Wants brief answers."
    rating = [p for p in engine.prompts if "How well does this answer suit" in p][0]
    assert "Wants brief answers." in rating
