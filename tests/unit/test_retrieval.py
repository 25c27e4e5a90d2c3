"""Embedders, the embedding cache, BM25 and top-k profile retrieval (all offline, CPU, no downloads)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.optional import need

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pr_rlhf.models.embedders import (
    BM25Scorer,
    CachedEmbedder,
    HFEncoderEmbedder,
    SentenceTransformerEmbedder,
    make_embedder,
    minilm_path,
    word_tokens,
)
from pr_rlhf.records import Pair, Profile, Query, RetrievedItem
from pr_rlhf.retrieval import (
    copy_retrieved_to_pairs,
    rank_profile,
    ranking_order,
    retrieve_for_queries,
)
from pr_rlhf.reward.inputs import render_profile

PROFILE = [
    {"id": "p0", "text": "My favourite anime this season is a slow mecha drama.", "category": "anime"},
    {"id": "p1", "text": "I bake sourdough bread every weekend with a rye starter.", "category": "cooking"},
    {"id": "p2", "text": "Training for my first marathon: long runs on Sundays.", "category": "running"},
    {"id": "p3", "text": "How do I make fresh pasta without a pasta machine?", "category": "cooking"},
    {"id": "p4", "text": "Looking for board games that two players enjoy.", "category": "games"},
]


class CountingEmbedder:
    """A deterministic fake embedder that records every text it is asked to encode."""

    name = "counting-v1"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts, batch_size=64):
        self.seen.extend(texts)
        out = np.zeros((len(texts), 26), dtype=np.float32)
        for row, text in enumerate(texts):
            for ch in text.lower():
                if "a" <= ch <= "z":
                    out[row, ord(ch) - 97] += 1.0
        return out


@pytest.fixture(scope="module")
def minilm():
    return make_embedder("minilm")


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    """A random 2-layer BERT plus a WordPiece tokenizer trained on a few sentences, saved like a hub folder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny_bert")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    tok.train_from_iterator([p["text"] for p in PROFILE] * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", model_max_length=64).save_pretrained(path)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(path)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Package hygiene and the factory
# ---------------------------------------------------------------------------------------------------------------

def test_import_does_not_load_torch_or_sentence_transformers():
    code = ("import sys, pr_rlhf.retrieval, pr_rlhf.models.embedders; "
            "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_spec_lists_options_and_says_offline():
    with pytest.raises(ValueError) as err:
        make_embedder("facebook/contriever-msmarco")
    message = str(err.value)
    assert "'minilm'" in message and "'bm25'" in message and "local" in message and "offline" in message


def test_non_model_directory_and_bad_options_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="neither a sentence-transformers folder"):
        make_embedder(str(tmp_path))
    with pytest.raises(ValueError, match="lexical"):
        make_embedder("bm25", normalize=True)
    with pytest.raises(ValueError, match="pooling"):
        make_embedder(minilm_path(), pooling="cls")
    assert isinstance(make_embedder("BM25"), BM25Scorer)


# ---------------------------------------------------------------------------------------------------------------
# BM25
# ---------------------------------------------------------------------------------------------------------------

def test_bm25_matches_hand_computation():
    docs = ["the cat sat", "the dog", "cat cat"]
    scores = BM25Scorer(k1=1.5, b=0.75).score("Cat!", docs)
    avgdl = (3 + 2 + 2) / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # "cat" is in 2 of 3 docs

    def term(tf, dl):
        return idf * tf * 2.5 / (tf + 1.5 * (1 - 0.75 + 0.75 * dl / avgdl))

    np.testing.assert_allclose(scores, [term(1, 3), 0.0, term(2, 2)], rtol=1e-6)
    assert word_tokens("Don't STOP, e.g. 3rd") == ["don", "t", "stop", "e", "g", "3rd"]
    assert BM25Scorer().score("", docs).tolist() == [0.0, 0.0, 0.0]
    assert BM25Scorer().score("cat", []).shape == (0,)


def test_bm25_agrees_with_bm25s_lucene_up_to_the_k1_plus_1_factor():
    need("bm25s", load=False)
    corpus = [p["text"] for p in PROFILE] + ["pasta pasta bread", "anime and board games"]
    # bm25s imports numba, whose llvmlite objects break vLLM's kernel rebinding (it scans sys.modules) in any
    # later vLLM engine of the same process: the reference runs in a process of its own.
    code = ("import json, sys, bm25s; corpus, query = json.load(sys.stdin); "
            "ref = bm25s.BM25(k1=1.5, b=0.75, method='lucene'); ref.index(corpus, show_progress=False); "
            "print(json.dumps(ref.get_scores(query).tolist()))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps([[word_tokens(c) for c in corpus],
                                                                         ["pasta", "bread", "anime"]]),
                         capture_output=True, text=True, check=True).stdout
    # bm25s (Lucene >= 8) drops the constant (k1 + 1) numerator factor; the ranking is the same.
    expected = np.array(json.loads(out)) * 2.5
    np.testing.assert_allclose(BM25Scorer().score("pasta bread anime", corpus), expected, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Ranking
# ---------------------------------------------------------------------------------------------------------------

def test_ranked_items_keep_their_own_ids_and_texts():
    # Scores reverse the input order, so every item moves; each id must still sit next to its own text.
    def reverse(query, texts):
        return [float(i) for i in range(len(texts))]
    ranked = rank_profile("anything", PROFILE, top_k=None, scorer=reverse)
    assert [r["id"] for r in ranked] == ["p4", "p3", "p2", "p1", "p0"]
    by_id = {p["id"]: p for p in PROFILE}
    for r in ranked:
        assert r["text"] == by_id[r["id"]]["text"] and r["category"] == by_id[r["id"]]["category"]
    assert list(ranked[0]) == [f.name for f in dataclasses.fields(RetrievedItem)]


def test_ties_break_by_original_index_and_top_k_bounds():
    assert ranking_order([1.0, 3.0, 1.0, 3.0, float("nan"), 2.0]).tolist() == [1, 3, 5, 0, 2, 4]
    def flat(query, texts):
        return [0.0] * len(texts)
    assert [r["id"] for r in rank_profile("q", PROFILE, top_k=3, scorer=flat)] == ["p0", "p1", "p2"]
    assert len(rank_profile("q", PROFILE, top_k=50, scorer=flat)) == 5
    assert rank_profile("q", PROFILE, top_k=0, scorer=flat) == []
    assert rank_profile("q", [], top_k=10, scorer=flat) == []


def test_render_profile_matches_prb_format():
    items = [{"id": "a", "text": "first", "category": "x"}, {"id": "b", "text": "second", "category": "y"}]
    assert render_profile(items) == "Post 1 (Category: x):\nfirst\nPost 2 (Category: y):\nsecond"
    assert render_profile(items, k=1) == "Post 1 (Category: x):\nfirst"
    assert render_profile([]) == ""


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------

def test_cache_embeds_each_unique_text_once(tmp_path):
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, cache_dir=tmp_path)
    texts = ["alpha", "beta", "alpha", "gamma", "beta"]
    first = cached.encode(texts)
    assert inner.seen == ["alpha", "beta", "gamma"]
    np.testing.assert_array_equal(first, inner.encode(texts))
    inner.seen.clear()
    np.testing.assert_array_equal(cached.encode(["gamma", "alpha"]), first[[3, 0]])
    assert inner.seen == [] and cached.misses == 3 and cached.hits == 4

    cached.save()
    reloaded_inner = CountingEmbedder()
    reloaded = CachedEmbedder(reloaded_inner, cache_dir=tmp_path)
    np.testing.assert_array_equal(reloaded.encode(texts), first)
    assert reloaded_inner.seen == []
    reloaded.encode(["delta", "alpha"])
    assert reloaded_inner.seen == ["delta"]


def test_cache_is_keyed_by_embedder_name(tmp_path):
    first = CachedEmbedder(CountingEmbedder(), cache_dir=tmp_path)
    first.encode(["alpha"])
    first.save()
    other_inner = CountingEmbedder()
    other_inner.name = "counting-v2"
    CachedEmbedder(other_inner, cache_dir=tmp_path).encode(["alpha"])
    assert other_inner.seen == ["alpha"]


# ---------------------------------------------------------------------------------------------------------------
# Real backends
# ---------------------------------------------------------------------------------------------------------------

def test_minilm_is_normalized_and_ranks_the_relevant_post_first(minilm):
    vectors = minilm.encode(["hello world", "pasta"])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    top = rank_profile("What sauce goes with homemade pasta?", PROFILE, top_k=2, scorer=minilm)
    assert top[0]["id"] == "p3" and top[0]["score"] >= top[1]["score"]
    assert minilm.name.startswith("minilm@")


def test_local_sentence_transformers_dir_uses_its_own_modules(minilm):
    embedder = make_embedder(minilm_path(), cache=False)
    assert isinstance(embedder, SentenceTransformerEmbedder)
    np.testing.assert_allclose(embedder.encode(["pasta"]), minilm.encode(["pasta"]), atol=1e-5)


def test_hf_encoder_mean_pooling_dot_product_without_normalization(tiny_bert_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    embedder = make_embedder(str(tiny_bert_dir), cache=False)
    assert isinstance(embedder, HFEncoderEmbedder) and embedder.pooling == "mean" and not embedder.normalize
    texts = ["fresh pasta", "sourdough bread every weekend with a rye starter and more"]
    vectors = embedder.encode(texts, batch_size=2)

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    model = AutoModel.from_pretrained(tiny_bert_dir).eval()
    with torch.inference_mode():
        alone = tokenizer(texts[:1], return_tensors="pt")  # no padding: the plain mean over its tokens
        expected = model(**alone).last_hidden_state[0].mean(dim=0).numpy()
    # Mask-aware: padding next to a longer text does not change the short text's vector.
    np.testing.assert_allclose(vectors[0], expected, atol=1e-5)
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0)

    cls = make_embedder(str(tiny_bert_dir), pooling="cls", normalize=True, cache=False)
    with torch.inference_mode():
        first_token = model(**alone).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(cls.encode(texts[:1])[0], first_token / np.linalg.norm(first_token), atol=1e-5)
    assert cls.name != embedder.name  # different options never share cache entries


def test_hf_encoder_truncates_to_the_position_table(tiny_bert_dir):
    embedder = make_embedder(str(tiny_bert_dir), cache=False)
    assert embedder.encode(["pasta " * 500]).shape == (1, 32)


# ---------------------------------------------------------------------------------------------------------------
# Batched retrieval
# ---------------------------------------------------------------------------------------------------------------

def _queries() -> list[Query]:
    def query(qid: str, user: str, question: str) -> Query:
        return Query(query_id=qid, user_id=user, source="test", subset="s", split="test", question=question)

    return [query("q0", "u1", "What sauce goes with homemade pasta?"),
            query("q1", "u1", "Any anime like a mecha drama?"),
            query("q2", "u2", "What sauce goes with homemade pasta?"),
            query("q3", "nobody", "Is anyone there?")]


def _profiles() -> dict:
    # u2 shares three posts with u1 (repeated texts across users, as in PRB) and has one of its own.
    shared = [dict(p, id=f"u2_{p['id']}") for p in PROFILE[1:4]]
    return {"u1": Profile(user_id="u1", source="test", subset="s", items=list(PROFILE)),
            ("u2", "s"): shared + [{"id": "u2_x", "text": "Knitting socks for winter.", "category": "crafts"}]}


def test_batched_retrieval_matches_single_query_ranking(minilm):
    queries, profiles = _queries(), _profiles()
    stats = retrieve_for_queries(queries, profiles, top_k=3, embedder=minilm)
    assert stats.queries == 4 and stats.missing_profile == 1 and stats.items_ranked == 5 + 5 + 4
    for query in queries[:3]:
        profile = profiles.get(query.user_id) or profiles[(query.user_id, query.subset)]
        items = profile.items if isinstance(profile, Profile) else profile
        single = rank_profile(query.question, items, top_k=3, scorer=minilm)
        assert [r["id"] for r in query.retrieved] == [r["id"] for r in single]
        np.testing.assert_allclose([r["score"] for r in query.retrieved], [r["score"] for r in single], atol=1e-5)
        text_of = {i["id"]: i["text"] for i in items}
        assert all(text_of[r["id"]] == r["text"] for r in query.retrieved)
    assert queries[0].retrieved[0]["id"] == "p3" and queries[2].retrieved[0]["id"] == "u2_p3"
    assert queries[3].retrieved == []


def test_batched_retrieval_encodes_each_distinct_text_once(tmp_path):
    inner = CountingEmbedder()
    embedder = CachedEmbedder(inner, cache_dir=tmp_path)
    queries, profiles = _queries(), _profiles()
    stats = retrieve_for_queries(queries, profiles, top_k=2, embedder=embedder, progress=True)
    distinct = {q.question for q in queries[:3]} | {p["text"] for p in PROFILE} | {"Knitting socks for winter."}
    assert sorted(inner.seen) == sorted(distinct) and stats.unique_texts == len(distinct)
    inner.seen.clear()
    retrieve_for_queries(_queries(), profiles, top_k=2, embedder=embedder)
    assert inner.seen == []  # second pass: everything from the cache
    assert len(CachedEmbedder(CountingEmbedder(), cache_dir=tmp_path)) == len(distinct)  # saved by the pass


def test_bm25_retrieval_and_copy_to_pairs():
    queries, profiles = _queries(), _profiles()
    retrieve_for_queries(queries, profiles, top_k=2, embedder=make_embedder("bm25"))
    assert queries[0].retrieved[0]["id"] == "p3"  # "pasta" is a lexical match
    pairs = [Pair(pair_id=f"x{i}", query_id=q, user_id="u", source="t", subset="s", split="test", question="?",
                  chosen="a", rejected="b") for i, q in enumerate(["q0", "q0", "q2", "missing"])]
    assert copy_retrieved_to_pairs(queries, pairs) == 3
    assert pairs[0].retrieved == queries[0].retrieved and pairs[0].retrieved is not pairs[1].retrieved
    pairs[0].retrieved[0]["text"] = "edited"
    assert queries[0].retrieved[0]["text"] != "edited" and pairs[1].retrieved[0]["text"] != "edited"
    assert pairs[3].retrieved == []
