"""The learner's batch layout (pr_rlhf/rl/batches.py): ragged and tensor inputs to the canonical padded form."""
import pytest
import torch

from pr_rlhf.rl.batches import collate


def test_collate_layouts():
    ragged = {"prompt_ids": [[7, 8, 9], [5]], "response_ids": [[1, 2], [3, 4, 5]],
              "old_logprobs": [[-1.0, -2.0], [-3.0, -4.0, -5.0]], "advantages": [0.5, -1.0]}
    c = collate(ragged)
    assert c["prompt_ids"].tolist() == [[7, 8, 9], [0, 0, 5]] and c["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert c["response_ids"].tolist() == [[1, 2, 0], [3, 4, 5]]
    assert c["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert c["advantages"].tolist() == [[0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]]  # per-sequence, broadcast
    assert c["old_logprobs"].tolist() == [[-1.0, -2.0, 0.0], [-3.0, -4.0, -5.0]]
    # right-padded prompt tensors with a mask, wider response tensors: same tokens, widths kept
    tensors = {"prompt_ids": torch.tensor([[7, 8, 9], [5, 0, 0]]), "prompt_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
               "response_ids": torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0]]),
               "response_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])}  # a hole: in context, out of the loss
    t = collate(tensors)
    assert t["prompt_ids"].tolist() == c["prompt_ids"].tolist() and t["response_ids"].shape == (2, 4)
    assert t["response_attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    assert t["response_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 1, 0]]
    assert collate(t)["prompt_ids"].tolist() == t["prompt_ids"].tolist()  # idempotent
    # a ragged mask that leaves the last token out of the loss keeps it in the context
    held = collate({"prompt_ids": [[7]], "response_ids": [[1, 2, 3]], "response_mask": [[1, 1, 0]]})
    assert held["response_attention_mask"].tolist() == [[1, 1, 1]] and held["response_mask"].tolist() == [[1, 1, 0]]
    # per-token tensors wider than the responses are cut to the response width
    wide = collate({"prompt_ids": [[7]], "response_ids": [[1, 2]], "returns": torch.ones(1, 5)})
    assert wide["returns"].tolist() == [[1.0, 1.0]]
    empty = collate({"prompt_ids": [], "response_ids": []})
    assert empty["prompt_ids"].shape[0] == 0 and empty["response_ids"].shape[0] == 0
    with pytest.raises(ValueError, match="at least one token"):
        collate({"prompt_ids": [[]], "response_ids": [[1]]})
