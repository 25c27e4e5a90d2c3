"""The user prototypes (pr_rlhf.scaling: embedding, kmeans, refine, index, build): K-means, neighbour lookup,
artifacts and prototype refinement, on synthetic data with a hashing bag-of-words embedder (no MiniLM, no
network)."""
from __future__ import annotations

import hashlib
import itertools
import json
import math

import numpy as np
import pytest
import torch

from pr_rlhf.configs.scaling import RefineConfig
from pr_rlhf.scaling.build import build_index
from pr_rlhf.scaling.embedding import embed_personas, embedder_name
from pr_rlhf.scaling.index import FORMAT_VERSION, MANIFEST_FILE, TENSORS_FILE, PrototypeIndex
from pr_rlhf.scaling.kmeans import explained_variance, kmeans
from pr_rlhf.scaling.refine import PrototypeRefiner, RefineBatch, UserHistory, evaluate_refiner, refine


class HashingEmbedder:
    """Deterministic signed bag-of-words hashing (md5, not Python's salted hash); empty text -> zero vector."""

    def __init__(self, dim: int = 64, name: str | None = "hash-bow"):
        self.dim = dim
        if name is not None:
            self.name = name

    def encode(self, texts, batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                digest = hashlib.md5(word.encode()).digest()
                out[i, int.from_bytes(digest[:4], "little") % self.dim] += 1.0 if digest[4] & 1 else -1.0
        return out


TOPICS = {
    "food": ["cooking", "recipes", "spicy", "noodles", "baking", "bread", "garlic", "kitchen"],
    "sport": ["football", "soccer", "marathon", "running", "tennis", "stadium", "coach", "league"],
    "code": ["python", "compiler", "debugging", "rust", "kernels", "algorithms", "git", "refactor"],
}


def persona_world(per_topic: int = 6, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """User ids, persona texts (random word subsets of one topic) and each user's topic."""
    rng = np.random.default_rng(seed)
    ids, texts, topics = [], [], []
    for topic, words in TOPICS.items():
        for i in range(per_topic):
            ids.append(f"{topic}-{i}")
            texts.append(" ".join(rng.choice(words, size=5, replace=False)))
            topics.append(topic)
    return ids, texts, topics


def blobs(k: int = 3, per: int = 20, dim: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * 10.0
    x = np.concatenate([c + rng.normal(size=(per, dim)) * 0.3 for c in centres]).astype(np.float32)
    return x, np.repeat(np.arange(k), per)


def same_partition(a, b) -> bool:
    """Labels agree up to a permutation of cluster ids."""
    pairs = set(zip(np.asarray(a).tolist(), np.asarray(b).tolist()))
    return len(pairs) == len(set(np.asarray(a).tolist())) == len(set(np.asarray(b).tolist()))


def unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def preference_world(n_users: int = 24, k: int = 3, dim: int = 8, length: int = 6, seed: int = 0):
    """Users whose chosen responses lean along their cluster's preference direction, rejected ones against it."""
    rng = np.random.default_rng(seed)
    centroids = unit(rng.normal(size=(k, dim))).astype(np.float32)
    directions = unit(rng.normal(size=(k, dim)))
    users, labels = [], []
    for u in range(n_users):
        p = u % k
        h = rng.normal(size=(length, dim)) / math.sqrt(dim)
        base = rng.normal(size=(length, dim)) * 0.3
        r_plus = base + 0.5 * directions[p] + rng.normal(size=(length, dim)) * 0.1
        r_minus = base - 0.5 * directions[p] + rng.normal(size=(length, dim)) * 0.1
        users.append(UserHistory(f"u{u:02d}", h, r_plus, r_minus))
        labels.append(p)
    return users, labels, centroids


def trained(cfg: RefineConfig, seed: int = 0):
    users, labels, centroids = preference_world()
    refiner = PrototypeRefiner(centroids.shape[1], centroids.shape[0], centroids, seed=seed)
    metrics = refine(refiner, users, labels, cfg)
    return refiner, metrics, users, labels


# ---------------------------------------------------------------- embedding and clustering

def test_embed_personas_normalizes_and_keeps_empty_text_zero():
    x = embed_personas(["spicy noodles garlic", "", "football coach"], HashingEmbedder())
    assert x.dtype == np.float32 and x.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(x[[0, 2]], axis=1), 1.0, rtol=1e-6)
    assert not x[1].any() and np.isfinite(x).all()


def test_embed_personas_rejects_bad_input_and_bad_embedder_output():
    with pytest.raises(TypeError, match="persona text 1"):
        embed_personas(["ok", None], HashingEmbedder())

    class Broken(HashingEmbedder):
        def encode(self, texts, batch_size=64):
            return super().encode(texts)[:-1]

    with pytest.raises(ValueError, match="'broken'.*for 2 texts"):
        embed_personas(["a", "b"], Broken(name="broken"))
    assert embedder_name(HashingEmbedder(name=None)) == "HashingEmbedder"


def test_kmeans_recovers_separated_clusters():
    x, truth = blobs()
    result = kmeans(x, 3, seed=0)
    assert result.centroids.shape == (3, 5) and result.labels.shape == (60,)
    assert same_partition(result.labels, truth)
    assert result.inertia < 60 * 5 * 0.3 ** 2 * 2   # about the noise variance, nowhere near the between-blob spread


def test_kmeans_validates_k():
    x, _ = blobs(per=2)
    for bad in (0, -1, 7):
        with pytest.raises(ValueError, match=rf"k={bad}.*\(6\)|\(6\).*k={bad}"):
            kmeans(x, bad)


def test_explained_variance_is_monotone_and_skips_large_k():
    x, _ = blobs()
    ev = explained_variance(x, [5, 1, 2, 3, 4, 61, 1000])
    assert list(ev) == [1, 2, 3, 4, 5]
    assert ev[1] == pytest.approx(0.0, abs=1e-6)
    assert ev[3] > 0.99
    values = list(ev.values())
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(values))


# ---------------------------------------------------------------- neighbour lookup

def handmade_index() -> PrototypeIndex:
    """Prototype 1 was refined onto the x axis while centroid 0 sits there: the lookup must use the refined one."""
    ids = ["self", "u_b", "u_c", "u_a", "y1", "y2"]
    emb = unit([[1, 0, 0], [1, 0.5, 0], [1, 0.1, 0], [1, 0.5, 0], [0, 1, 0], [0.1, 1, 0]]).astype(np.float32)
    return PrototypeIndex(embedder="hash-bow", k=2, dim=3, centroids=np.eye(3, dtype=np.float32)[:2],
                          prototypes=np.array([[0, 1, 0], [1, 0, 0]], dtype=np.float32), user_ids=ids,
                          embeddings=emb, labels=np.array([1, 1, 1, 1, 0, 0]))


def test_neighbours_nearest_prototype_exclusion_order_and_ties():
    index = handmade_index()
    assert index.nearest_prototype(np.array([1.0, 0.0, 0.0])) == 1
    assert index.nearest_prototype(np.array([0.0, 3.0, 0.1])) == 0
    found = index.neighbours(np.array([2.0, 0.0, 0.0]), 3, exclude="self")
    assert [u for u, _ in found] == ["u_c", "u_a", "u_b"]   # u_a and u_b tie exactly: user id decides
    assert found[1][1] == found[2][1] == pytest.approx(1 / math.sqrt(1.25))
    assert found[0][1] > found[1][1]
    assert [u for u, _ in index.neighbours(np.array([1.0, 0, 0]), 2)] == ["self", "u_c"]


def test_neighbours_small_clusters_and_zero():
    index = handmade_index()
    assert [u for u, _ in index.neighbours(np.array([1.0, 0, 0]), 50, exclude="self")] == ["u_c", "u_a", "u_b"]
    assert [u for u, _ in index.neighbours(np.array([0, 1.0, 0]), 50, exclude="not-a-member")] == ["y1", "y2"]
    assert index.neighbours(np.array([1.0, 0, 0]), 0) == []
    with pytest.raises(ValueError, match="n must be"):
        index.neighbours(np.array([1.0, 0, 0]), -1)
    with pytest.raises(ValueError, match="index dim is 3"):
        index.neighbours(np.ones(4), 1)


# ---------------------------------------------------------------- artifacts

def small_index(refined: bool = True) -> tuple[PrototypeIndex, list[str], list[str]]:
    ids, texts, topics = persona_world()
    rng = np.random.default_rng(1)
    histories = [UserHistory(uid, rng.normal(size=(4, 64)), rng.normal(size=(4, 64)), rng.normal(size=(4, 64)))
                 for uid in ids[::2]]
    kwargs = {"histories": histories, "refine_cfg": RefineConfig(steps=3, batch_size=8, centroid_coef=0.1)} \
        if refined else {}
    index = build_index(ids, texts, HashingEmbedder(), k=3, seed=0, fingerprint="abc123", **kwargs)
    return index, ids, topics


def test_build_index_clusters_topics_and_refines():
    index, ids, topics = small_index()
    assert index.user_ids == ids and index.embedder == "hash-bow" and index.dim == 64
    assert same_partition(index.labels, topics)
    assert index.refined and index.refine_config["steps"] == 3
    assert not np.array_equal(index.prototypes, index.centroids)   # Adam moved them
    plain, _, _ = small_index(refined=False)
    assert not plain.refined and np.array_equal(plain.prototypes, plain.centroids)


def test_build_index_rejects_untrusted_input():
    with pytest.raises(ValueError, match="duplicate user id 'a'"):
        build_index(["a", "b", "a"], ["x", "y", "z"], HashingEmbedder(), k=1)
    with pytest.raises(ValueError, match="2 user ids but 1 persona"):
        build_index(["a", "b"], ["x"], HashingEmbedder(), k=1)
    with pytest.raises(ValueError, match="both histories and refine_cfg"):
        build_index(["a", "b"], ["x", ""], HashingEmbedder(), k=1, refine_cfg=RefineConfig())
    index = build_index(["a", "b"], ["", ""], HashingEmbedder(), k=1)   # empty personas are embedded as given
    assert not index.embeddings.any()


def test_save_load_round_trip(tmp_path):
    index, ids, _ = small_index()
    assert index.save(tmp_path / "idx") == tmp_path / "idx"
    manifest = json.loads((tmp_path / "idx" / MANIFEST_FILE).read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["refined"] is True
    assert manifest["user_ids"] == ids and manifest["embedder"] == "hash-bow" and manifest["fingerprint"] == "abc123"
    assert (manifest["k"], manifest["dim"]) == (3, 64) and manifest["refine_config"]["steps"] == 3
    loaded = PrototypeIndex.load(tmp_path / "idx", expected_embedder="hash-bow")
    for name in ("centroids", "prototypes", "embeddings", "labels"):
        a, b = getattr(index, name), getattr(loaded, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    for name in ("embedder", "fingerprint", "k", "dim", "user_ids", "refine_config", "created"):
        assert getattr(loaded, name) == getattr(index, name), name
    assert loaded.refiner_state.keys() == index.refiner_state.keys()
    assert all(torch.equal(loaded.refiner_state[n], t) for n, t in index.refiner_state.items())
    refiner = PrototypeRefiner(loaded.dim, loaded.k, loaded.centroids)
    refiner.load_state_dict(loaded.refiner_state)
    assert np.array_equal(refiner.prototypes.detach().numpy(), loaded.prototypes)
    query = loaded.embeddings[0]
    assert loaded.neighbours(query, 3) == index.neighbours(query, 3)

    plain, _, _ = small_index(refined=False)
    back = PrototypeIndex.load(plain.save(tmp_path / "plain"))
    assert not back.refined and back.refiner_state is None and np.array_equal(back.prototypes, plain.prototypes)


def test_load_errors(tmp_path):
    index, _, _ = small_index(refined=False)
    folder = index.save(tmp_path / "idx")
    with pytest.raises(ValueError, match=r"prototypes\.json.*'hash-bow'.*'minilm@123'"):
        PrototypeIndex.load(folder, expected_embedder="minilm@123")

    manifest_path = folder / MANIFEST_FILE
    good = manifest_path.read_text()
    manifest = json.loads(good)
    manifest["user_ids"] = manifest["user_ids"][:-1]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"embeddings has shape \(18, 64\).*\(17, 64\)"):
        PrototypeIndex.load(folder)

    manifest = json.loads(good)
    manifest["user_ids"][1] = manifest["user_ids"][0]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"prototypes\.json.*duplicate user id"):
        PrototypeIndex.load(folder)

    manifest = json.loads(good)
    manifest["format_version"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="unknown format_version 99"):
        PrototypeIndex.load(folder)

    manifest["format_version"], manifest["refined"] = FORMAT_VERSION, True
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="no refiner weights"):
        PrototypeIndex.load(folder)

    manifest_path.write_text(good)
    intact = (folder / TENSORS_FILE).read_bytes()
    (folder / TENSORS_FILE).write_bytes(intact[:40])
    with pytest.raises(ValueError, match=r"prototypes\.safetensors: not a readable"):
        PrototypeIndex.load(folder)
    (folder / TENSORS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"prototypes\.safetensors"):
        PrototypeIndex.load(folder)
    with pytest.raises(FileNotFoundError, match=r"prototypes\.json"):
        PrototypeIndex.load(tmp_path / "nowhere")


# ---------------------------------------------------------------- refinement

def test_refiner_loss_finite_and_gradients_reach_every_part():
    torch.manual_seed(0)
    dim, k = 6, 2
    refiner = PrototypeRefiner(dim, k, np.random.default_rng(0).normal(size=(k, dim)), seed=0)
    batch = RefineBatch(proto=torch.tensor([0, 1, 1, 0]), q=torch.randn(4, dim), r_plus=torch.randn(4, dim),
                        r_minus=torch.randn(4, dim), hist_h=torch.randn(4, 3, dim), hist_plus=torch.randn(4, 3, dim),
                        hist_minus=torch.randn(4, 3, dim),
                        mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool))
    out = refiner(batch)
    torch.testing.assert_close(out["pairwise"], -torch.nn.functional.logsigmoid(out["margin"]))
    loss = out["pairwise"].mean() + (out["smooth_sq"] * out["smooth_mask"]).sum() + refiner.centroid_penalty()
    assert torch.isfinite(loss)
    loss.backward()
    for name in ("w_o.weight", "w_q.weight", "w_s.weight", "prototypes"):
        grad = dict(refiner.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_prefix_summaries_match_the_definition():
    """s_t is the attention summary over the first t items; padded prefixes repeat the full summary."""
    dim = 4
    refiner = PrototypeRefiner(dim, 1, np.zeros((1, dim)), seed=0)
    o = torch.randn(1, 3, dim)
    anchor = torch.randn(1, dim)
    mask = torch.tensor([[True, True, False]])
    got = refiner.prefix_summaries(o, mask, anchor)[0]
    for t in (1, 2):
        weights = torch.softmax(o[0, :t] @ anchor[0], dim=0)
        torch.testing.assert_close(got[t - 1], weights @ o[0, :t])
    torch.testing.assert_close(got[2], got[1])


def test_refine_adds_both_regularizers_and_is_deterministic():
    cfg = RefineConfig(steps=5, lr=0.05, batch_size=16, centroid_coef=0.7, smooth_coef=0.3)
    first, metrics, _, _ = trained(cfg)
    second, again, _, _ = trained(cfg)
    assert metrics == again
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert metrics[-1]["centroid"] > 0 and metrics[-1]["smooth"] > 0
    for m in metrics:
        assert m["loss"] == pytest.approx(m["pairwise"] + 0.7 * m["centroid"] + 0.3 * m["smooth"], rel=1e-5)


def test_pairwise_loss_decreases_on_preference_data():
    users, labels, centroids = preference_world()
    refiner = PrototypeRefiner(8, 3, centroids, seed=0)
    before = evaluate_refiner(refiner, users, labels)
    metrics = refine(refiner, users, labels, RefineConfig(steps=60, lr=0.05, batch_size=32, centroid_coef=0.1))
    after = evaluate_refiner(refiner, users, labels)
    assert before["examples"] == after["examples"] == 24 * 5
    assert after["pairwise"] < 0.5 * before["pairwise"]
    assert after["accuracy"] > 0.9
    assert np.mean([m["pairwise"] for m in metrics[-10:]]) < np.mean([m["pairwise"] for m in metrics[:10]])


def test_centroid_regularizer_keeps_prototypes_near_centroids():
    base = {"steps": 60, "lr": 0.05, "batch_size": 32, "smooth_coef": 0.0}
    free, _, _, _ = trained(RefineConfig(centroid_coef=0.0, **base))
    tied, _, _, _ = trained(RefineConfig(centroid_coef=10.0, **base))
    distance = [r.centroid_penalty().item() for r in (free, tied)]
    assert distance[1] < 0.25 * distance[0]


def test_smoothness_regularizer_smooths_user_summaries():
    base = {"steps": 60, "lr": 0.05, "batch_size": 32, "centroid_coef": 0.0}
    free, _, users, labels = trained(RefineConfig(smooth_coef=0.0, **base))
    smooth, _, _, _ = trained(RefineConfig(smooth_coef=10.0, **base))
    measured = [evaluate_refiner(r, users, labels)["smooth"] for r in (free, smooth)]
    assert measured[1] < 0.5 * measured[0]


def test_refine_input_checks():
    users, labels, centroids = preference_world(n_users=3)
    refiner = PrototypeRefiner(8, 3, centroids)
    with pytest.raises(ValueError, match="outside"):
        refine(refiner, users, [0, 1, 3], RefineConfig(steps=1))
    with pytest.raises(ValueError, match="no prototype assignment for user 'u02'"):
        refine(refiner, users, {"u00": 0, "u01": 1}, RefineConfig(steps=1))
    short = [UserHistory("solo", users[0].h[:1], users[0].r_plus[:1], users[0].r_minus[:1])]
    with pytest.raises(ValueError, match="no training examples"):
        refine(refiner, short, [0], RefineConfig(steps=1))
    assert refine(refiner, users, {u.user_id: p for u, p in zip(users, labels)}, RefineConfig(steps=0)) == []
    with pytest.raises(ValueError, match="dim 8, the refiner 4"):
        refine(PrototypeRefiner(4, 1, np.zeros((1, 4))), users, [0, 0, 0], RefineConfig(steps=1))


def test_refined_index_places_every_member_in_its_own_cluster():
    """Refinement moves prototypes (far, with no centroid regularizer): members are re-assigned to their nearest
    refined prototype, so a member's own persona finds its own cluster, and its neighbours are its cluster mates."""
    ids = [f"u{i:02d}" for i in range(24)]
    texts = [f"topic{i % 3} words{i % 3} extra{i}" for i in range(24)]
    rng = np.random.default_rng(2)
    histories = [UserHistory(uid, rng.normal(size=(4, 64)), rng.normal(size=(4, 64)), rng.normal(size=(4, 64)))
                 for uid in ids]
    index = build_index(ids, texts, HashingEmbedder(), k=3, seed=0, histories=histories,
                        refine_cfg=RefineConfig(steps=60, lr=0.1, centroid_coef=0.0, batch_size=8))
    for i, uid in enumerate(ids):
        assert index.nearest_prototype(index.embeddings[i]) == index.labels[i]
        mates = {ids[j] for j in np.flatnonzero(index.labels == index.labels[i])} - {uid}
        assert {u for u, _ in index.neighbours(index.embeddings[i], 30, exclude=uid)} == mates
    assert 0.0 <= index.created["kmeans_label_kept"] <= 1.0
