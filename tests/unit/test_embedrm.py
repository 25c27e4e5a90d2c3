"""The embedding reward models (``pr_rlhf.embedrm``) on a toy population of two user types with opposite
preferences (8-d embeddings; a pair's chosen side is the one its user's type prefers, with a margin), where one
global reward cannot beat a coin: the global Bradley-Terry floor stays near 50% on seen users' held-out pairs, each
personalized method reaches 90% or more, and a new user's 4 pairs move its prediction to the user's type. Bad
input is an error naming the user, pair or field; training is deterministic under a seed; a saved model scores as
the trained one, through the reward kind's scorer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pr_rlhf.configs.reward import reward_config
from pr_rlhf.embedrm.methods import Context
from pr_rlhf.embedrm.scoring import pair_text
from pr_rlhf.embedrm.train import (
    EmbeddingDataError,
    PairData,
    TrainSettings,
    load_method,
    pair_probability,
    save_method,
    train_method,
)

DIM = 8
PERSONALIZED = ["pal", "lore", "vpl", "gpo"]


def population(seed: int, users: int = 40, train: int = 8, test: int = 4, prefix: str = "u") -> tuple[dict, dict]:
    """(train rows, test rows) per split: (user, pair id, chosen, rejected); even users prefer a high ``v . x``,
    odd users a low one."""
    rng = np.random.default_rng(seed)
    v = np.ones(DIM) / np.sqrt(DIM)
    rows: dict[str, list] = {"train": [], "test": []}
    for u in range(users):
        sign = 1 if u % 2 == 0 else -1
        for split, n in (("train", train), ("test", test)):
            for j in range(n):
                a, b = rng.normal(size=DIM), rng.normal(size=DIM)
                while abs(v @ (a - b)) < 0.5:
                    a, b = rng.normal(size=DIM), rng.normal(size=DIM)
                chosen, rejected = (a, b) if sign * v @ (a - b) > 0 else (b, a)
                rows[split].append((f"{prefix}{u}", f"{prefix}{u}-{split}{j}", chosen, rejected))
    return rows["train"], rows["test"]


def pairs(rows: list) -> PairData:
    users, ids, chosen, rejected = zip(*rows)
    return PairData.from_arrays(users, ids, np.stack(chosen), np.stack(rejected))


def settings(method: str, seed: int = 0) -> TrainSettings:
    episodic = method in ("vpl", "gpo")
    return TrainSettings(steps=400 if episodic else 1000, users_per_step=8, seed=seed)


@pytest.fixture(scope="module")
def toy():
    train, test = population(0)
    return pairs(train), pairs(test)


@pytest.fixture(scope="module")
def trained(toy):
    train, _ = toy
    torch.set_num_threads(1)
    return {m: train_method(m, train, settings(m)) for m in ["bt_embedding", *PERSONALIZED]}


def seen_accuracy(model, train: PairData, test: PairData) -> float:
    correct = []
    for user, ctx in test.contexts.items():
        state = model.state(user, train.contexts[user])
        correct += (pair_probability(model, ctx.chosen, ctx.rejected, state) > 0.5).tolist()
    return float(np.mean(correct))


def test_one_global_reward_stays_near_a_coin_and_each_personalized_method_learns_the_users(toy, trained):
    train, test = toy
    accuracy = {m: seen_accuracy(model, train, test) for m, model in trained.items()}
    assert 0.35 <= accuracy["bt_embedding"] <= 0.65, accuracy
    assert all(accuracy[m] >= 0.9 for m in PERSONALIZED), accuracy


@pytest.mark.parametrize("method", PERSONALIZED)
def test_a_new_users_four_pairs_move_the_prediction_to_their_type(trained, method):
    model = trained[method]
    context_rows, probe_rows = population(7, users=2, train=4, test=100, prefix="new")
    contexts, probes = pairs(context_rows).contexts, pairs(probe_rows).contexts
    for user in ("new0", "new1"):   # one of each type, unseen in training
        probe = probes[user]
        before = pair_probability(model, probe.chosen, probe.rejected, model.state(None, None))
        after = pair_probability(model, probe.chosen, probe.rejected, model.state(None, contexts[user]))
        assert (after > 0.5).float().mean() >= 0.9, (method, user)
        assert after.mean() > before.mean(), (method, user)   # towards the user's side, from the population's


def test_training_is_deterministic_under_a_seed(toy):
    train, _ = toy
    for method in ("pal", "vpl"):
        a, b = (train_method(method, train, TrainSettings(steps=60, users_per_step=4, seed=3)) for _ in range(2))
        c = train_method(method, train, TrainSettings(steps=60, users_per_step=4, seed=4))
        assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict()), method
        assert not all(torch.equal(a.state_dict()[k], c.state_dict()[k]) for k in a.state_dict()), method


def test_bad_input_is_an_error_naming_the_user_pair_or_field(toy):
    chosen = np.zeros((2, DIM), dtype=np.float32)
    rejected = np.ones((2, DIM), dtype=np.float32)
    rejected[1, 3] = np.nan
    with pytest.raises(EmbeddingDataError, match=r"pair 'p1' \(user 'b'\): its rejected embedding is not finite"):
        PairData.from_arrays(["a", "b"], ["p0", "p1"], chosen, rejected)
    with pytest.raises(EmbeddingDataError, match="pair 'p1' has no user_id"):
        PairData.from_arrays(["a", ""], ["p0", "p1"], chosen, np.ones((2, DIM)))
    with pytest.raises(EmbeddingDataError, match="2 users, 1 pair ids"):
        PairData.from_arrays(["a", "b"], ["p0"], chosen, np.ones((2, DIM)))
    empty = PairData({"lonely": Context(torch.zeros(0, DIM), torch.zeros(0, DIM)),
                      **{u: c for u, c in list(toy[0].contexts.items())[:2]}})
    with pytest.raises(EmbeddingDataError, match="user 'lonely' has no pairs"):
        train_method("pal", empty, TrainSettings(steps=1))
    with pytest.raises(ValueError, match="unknown embedding reward method 'dpo'"):
        train_method("dpo", toy[0], TrainSettings(steps=1))


class TableEmbedder:
    """A stand-in encoder: the toy's vector of each text it was told about."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def encode(self, texts, batch_size: int = 64) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def test_a_saved_model_scores_through_its_reward_kind(tmp_path, toy, trained):
    from pr_rlhf.scorers import EmbeddingScorer, RewardRequest

    train, _ = toy
    folder = save_method(trained["pal"], tmp_path / "pal")
    model, config = load_method(folder)
    assert config["method"] == "pal"
    context_rows, probe_rows = population(11, users=2, train=4, test=3, prefix="cold")
    table = {}
    for user, pid, chosen, rejected in context_rows + probe_rows:
        table[pair_text(f"q {pid}", f"chosen {pid}")] = chosen
        table[pair_text(f"q {pid}", f"rejected {pid}")] = rejected
    history = [{"question": f"q {pid}", "chosen": f"chosen {pid}", "rejected": f"rejected {pid}"}
               for user, pid, _, _ in context_rows if user == "cold1"]
    probe = [(pid, c, r) for user, pid, c, r in probe_rows if user == "cold1"]
    cfg = reward_config(kind="pal", model=str(folder))
    scorer = EmbeddingScorer(cfg, embedder=TableEmbedder(table))
    requests = [RewardRequest(f"{pid}.{side}", "cold1", f"q {pid}", f"{side} {pid}", {"history": history})
                for pid, _, _ in probe for side in ("chosen", "rejected")]
    scores = [s for s, _ in scorer.score(requests)]
    def vectors(texts: list[str]) -> torch.Tensor:
        return torch.from_numpy(np.stack([table[t] for t in texts]).astype(np.float32))

    context = Context(*(vectors([pair_text(h["question"], h[side]) for h in history])
                        for side in ("chosen", "rejected")))
    x = vectors([pair_text(f"q {pid}", f"{side} {pid}") for pid, _, _ in probe for side in ("chosen", "rejected")])
    expected = model.reward(x, model.state(None, context))
    assert np.allclose(scores, expected.detach().numpy(), atol=1e-5)
    assert all(scores[2 * i] > scores[2 * i + 1] for i in range(len(probe)))   # the cold user's side, from 4 pairs
    bad = scorer.evaluate([RewardRequest("x", "cold1", "q", "a", {"history": [{"question": "q", "chosen": "c"}]})])
    assert bad[0].scores is None and bad[0].error.startswith("bad_history") and "'rejected'" in bad[0].error
    with pytest.raises(EmbeddingDataError, match="a trained 'pal' model, but the reward kind is 'lore'"):
        EmbeddingScorer(reward_config(kind="lore", model=str(folder)), embedder=TableEmbedder(table))
