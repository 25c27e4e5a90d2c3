"""Every shape of reward model Personalized RewardBench evaluates, each with a tiny model built here: encoder RMs with
a ``classifier`` head (BERT-like) and heads with several outputs (the reward is the one named), RMs that ship their
own modelling code (refused unless the recipe says ``trust_remote_code: true``, the message naming the field), and
generative judges whose verdict is not ``Result: A|B``: a reasoning RM's tagged answer (RM-R1) and a JSON verdict
(R3 / mR3), with their failures counted by kind."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from pr_rlhf.configs.base import ScalarRMConfig
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.models.sources import resolve_model
from pr_rlhf.reward.inputs import RMInput
from pr_rlhf.reward.judge import PairwiseJudge, chosen_slot
from pr_rlhf.reward.scalar import RemoteCodeRefused, ScalarRM
from pr_rlhf.reward.verdicts import parse_json_verdict, parse_tagged_verdict

PROMPTS = ["What should I cook tonight?", "Plan my weekend."]
ANSWERS = ["A spicy curry with rice.", "Hike in the morning, read in the evening."]


def with_tokenizer(folder: Path) -> int:
    """The tiny model's tokenizer copied into ``folder``; its vocabulary size."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def encoder_rm(folder: Path, outputs: int = 1) -> Path:
    from transformers import BertConfig, BertForSequenceClassification

    vocab = with_tokenizer(folder)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=512, num_labels=outputs))
    model.save_pretrained(folder)
    return folder


def direct_logits(folder: Path, rm: ScalarRM) -> torch.Tensor:
    """The checkpoint's logits for the same token ids, computed without ScalarRM."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    out = []
    for prompt, answer in zip(PROMPTS, ANSWERS):
        ids = torch.tensor([rm.encoder.encode_text(prompt, answer)])
        with torch.no_grad():
            out.append(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0])
    return torch.stack(out)


def test_an_encoder_rm_with_a_classifier_head_scores_as_its_checkpoint(tmp_path):
    folder = encoder_rm(tmp_path / "bert_rm")
    rm = ScalarRM(ScalarRMConfig(model=str(folder), max_length=128))
    assert not hasattr(rm.model, "score") and hasattr(rm.model, "classifier")
    scores = rm.score_texts(PROMPTS, ANSWERS)
    assert torch.allclose(torch.tensor(scores), direct_logits(folder, rm)[:, 0], atol=1e-5)


def test_a_head_with_several_outputs_needs_the_reward_named(tmp_path):
    folder = encoder_rm(tmp_path / "two_labels", outputs=2)
    with pytest.raises(ValueError, match="2 outputs.*scalar_rm.label"):
        ScalarRM(ScalarRMConfig(model=str(folder), max_length=128))
    rm = ScalarRM(ScalarRMConfig(model=str(folder), max_length=128, label=1))
    assert torch.allclose(torch.tensor(rm.score_texts(PROMPTS, ANSWERS)), direct_logits(folder, rm)[:, 1],
                          atol=1e-5)
    with pytest.raises(ValueError, match="scalar_rm.label 2: the head .* has 2 output"):
        ScalarRM(ScalarRMConfig(model=str(folder), max_length=128, label=2))


CONFIG_CODE = '''
from transformers import PretrainedConfig


class ToyRMConfig(PretrainedConfig):
    model_type = "toy_rm"

    def __init__(self, vocab_size=100, hidden_size=16, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
'''
MODEL_CODE = '''
import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_toy import ToyRMConfig


class ToyRM(PreTrainedModel):
    config_class = ToyRMConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.classifier = torch.nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        return SequenceClassifierOutput(logits=self.classifier(pooled))
'''


def remote_code_rm(folder: Path) -> Path:
    """A checkpoint whose classes live in its own files (config.json auto_map), as internlm2-reward's do."""
    vocab = with_tokenizer(folder)
    (folder / "configuration_toy.py").write_text(CONFIG_CODE)
    (folder / "modeling_toy.py").write_text(MODEL_CODE.replace("from .configuration_toy", "from configuration_toy"))
    sys.path.insert(0, str(folder))
    try:
        from configuration_toy import ToyRMConfig
        from modeling_toy import ToyRM

        torch.manual_seed(0)
        ToyRM(ToyRMConfig(vocab_size=vocab, hidden_size=16)).save_pretrained(folder)
    finally:
        sys.path.remove(str(folder))
        for name in ("configuration_toy", "modeling_toy"):
            sys.modules.pop(name, None)
    (folder / "modeling_toy.py").write_text(MODEL_CODE)   # as shipped: a relative import inside the package
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_toy.ToyRMConfig",
                          "AutoModelForSequenceClassification": "modeling_toy.ToyRM"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_modelling_code_shipped_with_a_checkpoint_runs_only_when_the_recipe_allows_it(tmp_path):
    folder = remote_code_rm(tmp_path / "toy_rm")
    with pytest.raises(RemoteCodeRefused, match="ships its own modelling code.*scalar_rm.trust_remote_code: true"):
        ScalarRM(ScalarRMConfig(model=str(folder), max_length=64))
    rm = ScalarRM(ScalarRMConfig(model=str(folder), max_length=64, trust_remote_code=True))
    assert type(rm.model).__name__ == "ToyRM"
    scores = rm.score_texts(PROMPTS, ANSWERS)
    assert len(scores) == 2 and scores[0] != scores[1]
    shutil.rmtree(folder)


class ScriptedEngine:
    """Answers each prompt with the next scripted text (an engine's interface, no model)."""

    name = "scripted"

    def __init__(self, texts: list[str]) -> None:
        self.texts = list(texts)
        self.prompts: list = []

    def generate(self, prompts, params):
        self.prompts += prompts
        return [Generation(samples=[Sample(text=self.texts.pop(0), token_ids=[1])]) for _ in prompts]


def pair(i: int) -> RMInput:
    return RMInput(pair_id=f"p{i}", user_id="u", subset="", question="Q?", chosen=f"good {i}", rejected=f"bad {i}")


@pytest.mark.parametrize("fmt,right,wrong,broken,failure", [
    ("tagged", "<think>the user wants brevity</think>\nRubric: brevity.\n<answer>[[{slot}]]</answer>",
     "<answer>[[{slot}]]</answer>", "I cannot decide.", "no_verdict"),
    ("json", '```json\n{{"explanation": "shorter, as the user asked", "score": "Assistant {slot}"}}\n```',
     '{{"explanation": "x", "score": "Assistant {slot}"}}', '{"explanation": "no verdict here"}', "no_verdict"),
])
def test_judges_with_other_verdict_formats_are_read_and_their_failures_counted(fmt, right, wrong, broken, failure):
    inputs = [pair(i) for i in range(3)]
    slots = [chosen_slot(0, inp.pair_id) for inp in inputs]
    other = {"A": "B", "B": "A"}
    engine = ScriptedEngine([right.format(slot=slots[0]), wrong.format(slot=other[slots[1]]), broken])
    judge = PairwiseJudge(engine, params=None, seed=0, fmt=fmt)
    verdicts = judge.judge(inputs, mode="none", top_k=4)
    assert [v.correct for v in verdicts] == [True, False, False]
    assert [v.error for v in verdicts] == [None, None, failure]
    system = engine.prompts[0][0]["content"]
    assert ("<answer>[[A]]</answer>" in system) if fmt == "tagged" else ('"score"' in system)


def test_verdict_parsers_never_raise_and_name_the_failure():
    assert parse_tagged_verdict("<answer>Chatbot B</answer>").value == "B"
    assert parse_tagged_verdict("<answer>[[A]] vs [[B]]</answer>").error == "ambiguous"
    assert parse_tagged_verdict("<think>still thinking").error == "unclosed_think"
    assert parse_json_verdict('{"winner": "Response 2"}').value == "B"
    assert parse_json_verdict('{"score": "tie"}').error == "ambiguous"
    assert parse_json_verdict("{not json}").error == "bad_json"
    assert parse_json_verdict("plain text").error == "no_json"
    for junk in (None, 3, "", "{" * 1000, '{"score": ' + "[" * 500):
        assert parse_tagged_verdict(junk).error is not None and parse_json_verdict(junk).error is not None
