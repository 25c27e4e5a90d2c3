"""Scalar reward model: a sequence-classification head scores (user block + question, answer) pointwise.

The prompt is the ``scalar_rm`` template as the user turn and the answer as the assistant turn, through the
tokenizer's chat template (plain ``prompt\\n\\nanswer`` when it has none). Inputs longer than ``max_length``
tokens (capped by the model's position table) lose tokens from the left of the user block first, so the question
and the answer are kept; only if they alone are too long is the rest cut from the left. Scoring is batched, in
eval mode under ``no_grad``, and deterministic (a sequence's score does not depend on the batch it is in, up to
float rounding: CPU kernels differ by ~1e-8 between batch rows).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pr_rlhf.configs.recipe import ScalarRMConfig
from pr_rlhf.prompts import fragment
from pr_rlhf.reward.inputs import InputMode, RMInput, conversation_block, user_block
from pr_rlhf.reward.pointwise import PointScores

# Stands in for the user block while the chat template is applied, so the block's tokens can be cut alone.
_SLOT = "\u2063PR_RLHF_USER_BLOCK\u2063"


def sequence_scores(model: Any, input_ids: Any, attention_mask: Any, last: Any, position_ids: Any = None) -> Any:
    """A decoder sequence-classification model's score ``[B]`` read at token ``last[i]`` of each row: its backbone's
    hidden state there through its ``score`` head. Scoring (:class:`ScalarRM`) and training (the learner's reward
    model) both read it here, so a trained RM scores exactly as it was trained. (The model's own pooling looks for
    the pad id, which may also be the last real token when pad = eos.)"""
    import torch

    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
    picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]
    return model.score(picked.to(model.score.weight.dtype)).float().squeeze(-1)


class RemoteCodeRefused(ValueError):
    """A checkpoint that ships its own modelling code, loaded without the recipe's consent."""


def checkpoint_config(path: str, trust_remote_code: bool, field: str) -> Any:
    """The checkpoint's config; a checkpoint whose ``config.json`` maps classes to its own code (``auto_map``) is
    refused unless ``trust_remote_code`` (``field`` names the recipe field that allows it)."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    config_file = Path(path) / "config.json"
    raw = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if raw.get("auto_map") and not trust_remote_code:
        raise RemoteCodeRefused(f"{path}: the checkpoint ships its own modelling code (config.json auto_map: "
                                f"{sorted(raw['auto_map'])}); it runs only with {field}: true")
    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


class ScalarRMEncoder:
    """(user block + question, answer) -> the token ids a scalar RM reads, truncated as the module says. Needs the
    tokenizer only, so a trainer encodes its pairs without loading the model."""

    def __init__(self, tokenizer: Any, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def for_model(cls, path: str, max_length: int, trust_remote_code: bool = False) -> ScalarRMEncoder:
        """The encoder of the model folder ``path``: its tokenizer, ``max_length`` capped by its position table."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        config = checkpoint_config(path, trust_remote_code, "scalar_rm.trust_remote_code")
        positions = getattr(config, "max_position_embeddings", None)
        return cls(tokenizer, min(max_length, positions) if positions else max_length)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _split_template(self, user_text: str, answer: str) -> tuple[str, str]:
        """The full input text around the user-block slot: (before, after)."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": user_text}, {"role": "assistant", "content": answer}], tokenize=False)
        else:
            text = f"{user_text}\n\n{answer}"
        if _SLOT in text:
            before, after = text.split(_SLOT, 1)
            return before, after
        return "", text

    def encode(self, block: str, rest_template: str, answer: str) -> list[int]:
        """Token ids of ``rest_template`` (holding ``_SLOT`` where the block goes) with ``answer``, truncated."""
        before, after = self._split_template(rest_template, answer)
        head, body, tail = self._ids(before), self._ids(block), self._ids(after)
        budget = self.max_length - len(head) - len(tail)
        # Posts are ranked most relevant first: when the block must shrink, its end (the least relevant) goes.
        body = body[:budget] if budget > 0 else []
        ids = head + body + tail
        return ids[-self.max_length:]

    def encode_input(self, inp: RMInput, answer: str, mode: InputMode, top_k: int) -> list[int]:
        block = user_block(inp, mode, top_k)
        rest = fragment("scalar_rm", "user", user_block=_SLOT if block else "",
                        conversation_block=conversation_block(inp), question=inp.question)
        return self.encode(block, rest, answer)

    def encode_text(self, prompt: str, answer: str) -> list[int]:
        """A free (prompt, answer) pair; a too-long prompt is cut from its left."""
        return self.encode(prompt, _SLOT, answer)


class ScalarRM:
    def __init__(self, cfg: ScalarRMConfig, *, device: str = "cpu", dtype: str = "float32"):
        import torch
        from transformers import AutoModelForSequenceClassification

        from pr_rlhf.models.hf_engine import quiet_hf_loading
        from pr_rlhf.models.sources import resolve_model

        self.cfg = cfg
        self.device = torch.device(device)
        path = resolve_model(cfg.model)
        quiet_hf_loading()
        remote = cfg.trust_remote_code
        config = checkpoint_config(path, remote, "scalar_rm.trust_remote_code")
        self.encoder = ScalarRMEncoder.for_model(path, cfg.max_length, remote)
        self.tokenizer = self.encoder.tokenizer
        self.max_length = self.encoder.max_length
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        # A reward model's folder holds its head (decoders' `score`, encoders' `classifier`): loaded as it is, with
        # however many outputs it has. A causal LM's folder (the tiny one) has none: a seeded one-output head keeps
        # the scores reproducible (without touching the caller's random state).
        trained = any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])
        heads = {} if trained else {"num_labels": 1}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch_dtype,
                                                                            trust_remote_code=remote, **heads)
        outputs = int(getattr(self.model.config, "num_labels", 1))
        if outputs > 1 and cfg.label is None:
            raise ValueError(f"{path}: the head has {outputs} outputs ({getattr(self.model.config, 'id2label', {})});"
                             " say which one is the reward with scalar_rm.label")
        if cfg.label is not None and not 0 <= cfg.label < outputs:
            raise ValueError(f"scalar_rm.label {cfg.label}: the head of {path} has {outputs} output(s)")
        self.label = cfg.label or 0
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device).eval()

    def encode_input(self, inp: RMInput, answer: str, mode: InputMode, top_k: int) -> list[int]:
        return self.encoder.encode_input(inp, answer, mode, top_k)

    # ------------------------------------------------------------------------------------------------------------
    # Scoring
    # ------------------------------------------------------------------------------------------------------------

    def score_ids(self, sequences: Sequence[list[int]]) -> list[float]:
        import torch

        scores: list[float] = []
        pad = self.tokenizer.pad_token_id
        for lo in range(0, len(sequences), self.cfg.batch_size):
            batch = sequences[lo:lo + self.cfg.batch_size]
            width = max(len(s) for s in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, seq in enumerate(batch):  # right padding: the head reads the last real token
                ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[row, :len(seq)] = 1
            with torch.no_grad():
                logits = self._logits(ids.to(self.device), mask.to(self.device), [len(s) for s in batch])
            scores += [float(x) for x in logits]
        return scores

    def _logits(self, ids: Any, mask: Any, lengths: list[int]) -> Any:
        import torch

        if not isinstance(getattr(self.model, "score", None), torch.nn.Module):  # encoders pool on their own
            return self.model(input_ids=ids, attention_mask=mask).logits.float()[:, self.label].cpu()
        if self.model.config.num_labels > 1:
            return self.model(input_ids=ids, attention_mask=mask).logits.float()[:, self.label].cpu()
        return sequence_scores(self.model, ids, mask, torch.tensor(lengths) - 1).cpu()

    def score_texts(self, prompts: Sequence[str], answers: Sequence[str]) -> list[float]:
        """Scores of (prompt, answer) pairs; a too-long prompt is cut from its left."""
        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        return self.score_ids([self.encoder.encode_text(p, a) for p, a in zip(prompts, answers)])

    def score_pairs(self, inputs: Sequence[RMInput], mode: InputMode, top_k: int) -> list[PointScores]:
        n = len(inputs)
        seqs = [self.encode_input(inp, inp.chosen, mode, top_k) for inp in inputs]
        seqs += [self.encode_input(inp, inp.rejected, mode, top_k) for inp in inputs]
        scores = self.score_ids(seqs)
        return [PointScores(c, r, None) for c, r in zip(scores[:n], scores[n:])]
