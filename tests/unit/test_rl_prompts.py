"""RL prompt loading from the shards, the seeded order a run visits them in, and supervised example encoding."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pr_rlhf.configs.rl import RLConfig
from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.rl.prompts import batch_at, load_prompts, load_warmup_answers, prompt_order, sft_example


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from data_pipelines.build import build_shards
    from pr_rlhf.configs.recipe import data_config

    out = tmp_path_factory.mktemp("rl_prompts") / "shards"
    build_shards(data_config(source="synthetic", out=str(out), retrieval={"embedder": "bm25"}),
                 WorldConfig(users=6, cold_start_users=2, reference_samples=200))
    return out


def test_training_prompts_are_seen_users_and_heldout_are_cold_start(shards):
    cfg = RLConfig(data={"shards": str(shards), "heldout_prompts": 3, "profile_top_k": 2})
    train, held = load_prompts(cfg)
    assert train and len(held) == 3
    assert not {p.user_id for p in train} & {p.user_id for p in held}
    assert load_prompts(cfg) == (train, held)                     # seeded: the same held-out sample each time
    assert all(p.messages[-1]["content"].rstrip() for p in train)
    test = RLConfig(data={"shards": str(shards), "heldout": "test", "heldout_prompts": 1000})
    assert {p.prompt_id for p in load_prompts(test)[1]}.isdisjoint({p.prompt_id for p in train})


def test_rubric_plans_are_shown_and_required(shards):
    plain, _ = load_prompts(RLConfig(data={"shards": str(shards)}))
    planned, _ = load_prompts(RLConfig(data={"shards": str(shards), "plan": "rubrics"}))
    assert [p.prompt_id for p in plain] == [p.prompt_id for p in planned]
    assert all(len(a.messages[-1]["content"]) > len(b.messages[-1]["content"]) for a, b in zip(planned, plain))


def test_history_travels_with_the_reward_request_only(shards):
    from pr_rlhf.reward.inputs import history_rows_by_user
    from pr_rlhf.shards import ShardReader

    plain, plain_held = load_prompts(RLConfig(data={"shards": str(shards)}))
    with_history, held = load_prompts(RLConfig(data={"shards": str(shards), "history_pairs": 2}))
    assert [p.messages for p in plain] == [p.messages for p in with_history]   # the policy never sees it
    assert all("history" not in p.reward_meta() for p in plain + plain_held)
    reader = ShardReader(shards)
    rows = history_rows_by_user(reader.iter_rows("histories"), reader.iter_rows("pairs", "train"))
    for item in with_history + held:
        past = rows[(item.user_id, item.subset)][:2]
        assert item.reward_meta()["history"] == [{"question": p["question"], "chosen": p["chosen"],
                                                  "rejected": p["rejected"]} for p in past]
        assert past


def test_warmup_answers_are_both_answers_of_each_training_pair(shards):
    answers = load_warmup_answers(RLConfig(data={"shards": str(shards)}))
    assert answers and len(answers) % 2 == 0
    for (first, chosen), (second, rejected) in zip(answers[::2], answers[1::2]):
        assert first == second and chosen != rejected


def test_rubric_warmup_answers_do_what_the_shown_aspects_ask(tmp_path):
    from data_pipelines.build import build_shards
    from pr_rlhf.configs.recipe import data_config
    from pr_rlhf.shards import ShardReader
    from pr_rlhf.world.attributes import detect

    out = tmp_path / "compact"
    build_shards(data_config(source="synthetic", out=str(out), retrieval={"embedder": "bm25"}),
                 WorldConfig(rendering="compact", users=6, cold_start_users=2, reference_samples=200))
    cfg = RLConfig(warmup_sft_target="rubric", data={"shards": str(out), "plan": "rubrics"})
    answers = load_warmup_answers(cfg)
    train, _ = load_prompts(cfg)
    assert [item for item, _ in answers] == [item for item in train for _ in range(2)]   # seen users only
    wanted = {r["query_id"]: json.loads(r["meta"])["attributes"] for r in ShardReader(out).iter_rows("rubrics")}
    for item, answer in answers:
        found = detect(answer)
        assert all(found[a["name"]] == int(a["wants"]) for a in wanted[item.prompt_id]), (item.prompt_id, answer)
    assert len({answer for _, answer in answers}) > len(train) / 2   # the unnamed attributes vary
    # only the first k aspects shown: the warm answers do what those ask and vary on the rest
    first = RLConfig(warmup_sft_target="rubric", data={"shards": str(out), "plan": "rubrics", "plan_max_aspects": 1})
    shown = {item.prompt_id: item.messages[-1]["content"] for item in load_prompts(first)[0]}
    rubric_aspects = {r["query_id"]: [a["aspect"] for a in r["aspects"]] for r in ShardReader(out).iter_rows("rubrics")}
    assert all(rubric_aspects[q][0] in text and rubric_aspects[q][1] not in text for q, text in shown.items())
    unnamed = set()
    for item, answer in load_warmup_answers(first):
        found = detect(answer)
        top, second = wanted[item.prompt_id][0], wanted[item.prompt_id][1]
        assert found[top["name"]] == int(top["wants"])
        unnamed.add(found[second["name"]])
    assert unnamed == {0, 1}
    with pytest.raises(ValueError, match="compact synthetic world"):
        load_warmup_answers(RLConfig(warmup_sft_target="rubric", data={"shards": str(shards_varied(tmp_path)),
                                                                        "plan": "rubrics"}))
    with pytest.raises(ValueError, match="data.plan='rubrics'"):
        RLConfig(warmup_sft_target="rubric", data={"shards": str(out)})


def shards_varied(tmp_path):
    from data_pipelines.build import build_shards
    from pr_rlhf.configs.recipe import data_config

    out = tmp_path / "varied"
    build_shards(data_config(source="synthetic", out=str(out), retrieval={"embedder": "bm25"}),
                 WorldConfig(users=3, cold_start_users=1, reference_samples=100))
    return out


def test_batch_at_visits_each_item_once_per_epoch_and_resumes_anywhere():
    items = list(range(7))
    epoch0, epoch1 = batch_at(items, 0, 7, seed=3), batch_at(items, 7, 7, seed=3)
    assert sorted(epoch0) == sorted(epoch1) == items and epoch0 != epoch1      # each epoch reshuffles
    assert epoch0 == [items[i] for i in prompt_order(7, 3, 0)]
    run = batch_at(items, 0, 20, seed=3)
    assert run == [x for pos in range(0, 20, 4) for x in batch_at(items, pos, min(4, 20 - pos), seed=3)]
    assert batch_at(items, 0, 7, seed=4) != epoch0


class WordTokenizer:
    """Whitespace tokens, a chat template that joins the messages (what encode_prompt needs of a tokenizer)."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def apply_chat_template(self, messages, tokenize: bool, add_generation_prompt: bool) -> str:
        return " ".join(m["content"] for m in messages) + " <assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True):
        return SimpleNamespace(input_ids=[self.vocab.setdefault(w, len(self.vocab) + 1) for w in text.split()])


def test_sft_example_is_prompt_ids_and_target_ids_ending_in_eos():
    tok = WordTokenizer()
    prompt, target = sft_example(tok, [{"role": "user", "content": "a b"}], "c d e")
    assert prompt == [1, 2, 3] and target == [4, 5, 6, 0]
    assert sft_example(tok, [{"role": "user", "content": "a b"}], "c d e", max_target_tokens=2)[1] == [4, 5, 0]
