"""SynthesizeMe's "FT RM + persona" pieces with a scripted engine: the users' personas induced in one batch (three
engine calls for any number of users, each user's persona the one they get alone), kept in a persona book that a
second run reads instead of inducing; `pr-rlhf train-rm`'s trainer puts each seen user's persona on their training
pairs under the very key the leaderboard's evaluation items look it up by; the persona kind with a scalar RM reads
it in input mode 'persona', as the trainer encodes it; `pr-rlhf train-rm` itself refuses the mode."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pr_rlhf.configs.reward import reward_config
from pr_rlhf.models.base import SamplingParams
from pr_rlhf.reward.persona import PersonaBook, synthesize, synthesize_many
from tests.unit.test_persona import CHOICES, Oracle


class Counting(Oracle):
    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        return super().generate(prompts, params)


def test_many_users_are_induced_in_three_engine_calls_each_as_alone():
    users = {"u1": CHOICES, "u2": CHOICES[:2], "u3": CHOICES[1:]}
    alone = {u: synthesize(Oracle({"c0", "c2", "c3"}, ["Wants brief answers."]), c, None) for u, c in users.items()}
    engine = Counting({"c0", "c2", "c3"}, ["Wants brief answers."])
    together = synthesize_many(engine, users, None)
    assert engine.calls == 3 and together == alone
    assert together["u2"].text == "" and together["u1"].text == "Wants brief answers."
    assert (together["u1"].traces_kept, together["u3"].traces_kept) == (3, 2)   # u3 induces on c1-c3


def test_the_book_induces_a_user_once_and_a_saved_book_induces_nothing(tmp_path):
    history = [{"question": c.question, "chosen": c.chosen, "rejected": c.rejected} for c in CHOICES]
    book = PersonaBook(SamplingParams(max_tokens=8), history_pairs=6, candidates=2, path=tmp_path / "p.json")
    engine = Counting({"c0", "c1", "c2", "c3"}, ["Wants brief answers."])
    assert book.lacks([("u1", history)])
    assert book.fill(engine, [("u1", history), ("u1", history), ("u2", history[:4])]) == 2 and engine.calls == 3
    assert book.fill(engine, [("u1", history)]) == 0 and engine.calls == 3
    assert book.persona("u1", history).text == "Wants brief answers."
    with pytest.raises(KeyError):
        book.persona("u1", history[:5])   # other pairs: another persona, not induced
    book.save()
    again = PersonaBook(SamplingParams(max_tokens=8), history_pairs=6, candidates=2, path=tmp_path / "p.json")
    assert not again.lacks([("u1", history), ("u2", history[:4])])
    assert again.persona("u1", history) == book.persona("u1", history)


def test_the_trainer_puts_each_users_persona_on_their_pairs_under_the_evaluations_key(tmp_path, monkeypatch):
    from data_pipelines.build import ensure_world_shards
    from pr_rlhf.configs.rm import RMTrainConfig
    from pr_rlhf.configs.world import WorldConfig
    from pr_rlhf.leaderboard.data import evaluation_items
    from pr_rlhf.rm.data import training_pairs
    from pr_rlhf.scorers import persona_book
    from pr_rlhf.shards import ShardReader
    from pr_rlhf.world import build_world
    from workers import rm_training

    world = WorldConfig(rendering="compact", users=4, cold_start_users=2, history_size=4, reference_samples=100)
    ensure_world_shards(str(tmp_path / "s"), world, log=lambda *_: None)
    engines: list[Counting] = []

    chosen = {r["chosen"] for r in ShardReader(str(tmp_path / "s")).iter_rows("pairs")}

    class Writer(Counting):   # every guess right; a persona quoting the user's traces
        def _answer(self, messages):
            user = messages[-1]["content"]
            if "Write their persona" in user:
                return "Persona: " + user.split("Observations")[-1]
            answer_a = user.split("[Answer A]\n")[1].split("\n[End of Answer A]")[0]
            return f"Because {answer_a}.\nResult: {'A' if answer_a in chosen else 'B'}"

        def generate(self, prompts, params):
            from pr_rlhf.models.base import Generation, Sample

            self.calls += 1
            return [Generation(samples=[Sample(text=self._answer(p), token_ids=[1])]) for p in prompts]

        def close(self) -> None:
            self.closed = True

    def make_engine(_cfg):
        engines.append(Writer(set(), []))
        return engines[-1]

    monkeypatch.setattr("pr_rlhf.models.make_engine", make_engine)
    persona = {"judge": {"backend": "hf", "model": "tiny"}, "history_pairs": 4, "candidates": 1}
    cfg = RMTrainConfig(shards=str(tmp_path / "s"), input_modes=["persona"], persona=persona)
    data = training_pairs(cfg.shards, cfg.train_split)
    book_path = tmp_path / "persona" / "personas.json"
    said: list[str] = []
    inputs = rm_training.persona_inputs(cfg, data.inputs, book_path, said.append)
    assert len(said) == 1 and said[0].startswith(f"persona: {data.users} seen users, 0 without a persona")
    assert f"0 of {2 * data.users} guesses unreadable" in said[0]
    assert len(engines) == 1 and engines[0].calls == 3 and engines[0].closed and book_path.is_file()
    assert len(inputs) == len(data.inputs) and all(inp.stated_preferences for inp in inputs)
    assert len({inp.stated_preferences for inp in inputs}) == data.users   # one persona a user
    # the evaluation's seen users carry the same history: the scorer's book finds every one of them
    scoring = persona_book(reward_config(kind="persona", **persona, personas=str(book_path)))
    seen = [it for it in evaluation_items(build_world(world)) if it.group == "seen"]
    assert seen and not scoring.lacks([(it.user_id, it.history) for it in seen])
    by_user = {inp.user_id: inp.stated_preferences for inp in inputs}
    assert all(scoring.persona(it.user_id, it.history).text == by_user[it.user_id] for it in seen)
    assert rm_training.persona_inputs(cfg, data.inputs, book_path, said.append) == inputs   # read back ...
    assert len(engines) == 1   # ... without an engine


def test_the_persona_kind_reads_with_a_scalar_rm_as_the_trainer_encodes():
    from pr_rlhf.reward.scalar import ScalarRM
    from pr_rlhf.scorers import PersonaScorer, RewardRequest, request_input

    engine = Oracle({"c0", "c1", "c2", "c3"}, ["Wants brief answers."])
    scorer = PersonaScorer(reward_config(kind="persona", candidates=1, scalar_rm={"model": "tiny", "max_length": 256}),
                           engine=engine)
    sent: list = []
    scorer.rm.score_ids = lambda ids: sent.extend(ids) or [0.0] * len(ids)
    history = [{"question": c.question, "chosen": c.chosen, "rejected": c.rejected} for c in CHOICES]
    request = RewardRequest("r0", "u1", "question 9", "short answer 9", {"history": history})
    scorer.score([request])
    inp = replace(request_input(request), stated_preferences="Wants brief answers.")
    assert isinstance(scorer.rm, ScalarRM)
    assert sent == [scorer.rm.encode_input(inp, "short answer 9", "persona", 1)]
    assert "Wants brief answers." in scorer.rm.encoder.tokenizer.decode(sent[0])


def test_persona_mode_needs_its_induction_and_train_rm_refuses_it():
    from pydantic import ValidationError

    from pr_rlhf.configs.recipe import Recipe
    from pr_rlhf.configs.rm import RMTrainConfig
    from workers.rm_training import run_train_rm

    with pytest.raises(ValidationError, match="rm.persona"):
        RMTrainConfig(input_modes=["persona"])
    recipe = Recipe(name="x", rm={"input_modes": ["none", "persona"], "persona": {}})   # the leaderboard's trainer
    with pytest.raises(ValueError, match="leaderboard.bt_rm.input_modes"):
        run_train_rm(recipe)   # before Ray starts


def test_the_leaderboard_scores_bt_persona_with_the_book_the_trainer_wrote_beside_its_model():
    from pr_rlhf.actors import leaderboard_bt_reward
    from pr_rlhf.configs.leaderboard import LeaderboardConfig

    cfg = LeaderboardConfig(bt_rm={"input_modes": ["none", "persona"], "persona": {"candidates": 2}})
    reward = leaderboard_bt_reward(cfg, "persona", "runs/lb/w2/bt_rm/persona/model")
    assert reward.kind == "persona" and reward.candidates == 2 and reward.reader == "pointwise"
    # workers.rm_training.RMTrainer.train writes <out>/persona/personas.json beside <out>/persona/model
    assert reward.personas == "runs/lb/w2/bt_rm/persona/personas.json"
    assert reward.scalar_rm.model == "runs/lb/w2/bt_rm/persona/model" and reward.pool == cfg.pool
    assert leaderboard_bt_reward(cfg, "none", "m").kind == "scalar"


def test_a_scalar_rm_reading_a_full_book_starts_no_engine(tmp_path, monkeypatch):
    """bt_persona's scoring: seen users' personas come from the book, a cold-start user's one pair is too few for
    any, so the judge's engine (a vLLM start in every reward worker) is never started."""
    from pr_rlhf.scorers import PersonaScorer, RewardRequest, persona_book

    def no_engine(_cfg):
        raise AssertionError("an engine was started")

    history = [{"question": c.question, "chosen": c.chosen, "rejected": c.rejected} for c in CHOICES]
    cfg = reward_config(kind="persona", candidates=1, personas=str(tmp_path / "book.json"),
                        scalar_rm={"model": "tiny", "max_length": 256})
    book = persona_book(cfg)
    book.fill(Oracle({"c0", "c1", "c2", "c3"}, ["Wants brief answers."]), [("u1", history)])
    book.save()
    monkeypatch.setattr("pr_rlhf.models.make_engine", no_engine)
    scorer = PersonaScorer(cfg)
    requests = [RewardRequest("r0", "u1", "question 9", "short answer 9", {"history": history}),
                RewardRequest("r1", "u9", "question 9", "short answer 9", {"history": history[:1]})]
    assert all(score is not None for score, _ in scorer.score(requests))
    scorer.close()
    with pytest.raises(AssertionError, match="an engine was started"):   # a seen user the book lacks needs one
        scorer.score([RewardRequest("r2", "u2", "question 9", "short answer 9", {"history": history})])
