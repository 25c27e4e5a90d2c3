"""Shared-prefix packing: a GRPO group's prompt computed once gives exactly the log-probs of the padded batch."""
import pytest
import torch

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.rl.batches import collate
from pr_rlhf.rl.packing import pack_shared_prefix, shared_prompt_groups
from workers.learner import LearnerWorker


def grouped_batch(seed: int = 1) -> dict:
    """Two prompts of different lengths, 4 responses each (one of them empty), rows interleaved."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 3000, (k,), generator=g).tolist() for k in (6, 9)]
    lengths = [3, 1, 6, 0, 5, 2, 4, 6]
    return {"prompt_ids": [prompts[i % 2] for i in range(8)],
            "response_ids": [torch.randint(5, 3000, (n,), generator=g).tolist() for n in lengths]}


def test_groups_and_layout():
    b = collate(grouped_batch())
    assert shared_prompt_groups(b["prompt_ids"], b["prompt_mask"]) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    packed = pack_shared_prefix(b["prompt_ids"], b["prompt_mask"], b["response_ids"], b["response_attention_mask"])
    assert packed.input_ids.shape == (2, 6 + 3 + 6 + 5 + 4)   # longest group: 6-token prompt + its 4 responses
    assert packed.tokens < b["prompt_ids"].numel() + b["response_ids"].numel()
    mask = packed.attention_mask[1, 0]            # group 1: 9-token prompt, responses of 1, 0, 2 and 6 tokens
    assert mask[9:12, :9].all() and not mask[10, 9]             # a response sees the prompt, not its sibling
    assert mask[11, 10] and not mask[10, 11]                    # causal within a response
    assert packed.position_ids[1, 9].item() == 9 and packed.position_ids[1, 10].item() == 9   # restart per response
    assert not mask[:18, 18:].any()                             # no real token attends to the tail padding
    unique = collate({"prompt_ids": [[1, 2], [3, 4]], "response_ids": [[5], [6]]})
    assert pack_shared_prefix(unique["prompt_ids"], unique["prompt_mask"], unique["response_ids"],
                              unique["response_attention_mask"]) is None   # nothing shared: plain forward


@pytest.fixture(scope="module")
def learners():
    made = []
    for shared in (True, False):
        w = LearnerWorker(LearnerConfig(model="tiny", strategy="none", lr=1e-3, micro_batch_size=8,
                                        shared_prefix=shared, seed=0))
        w.setup()
        made.append(w)
    yield made
    for w in made:
        w.shutdown()


def test_packed_logprobs_and_update_match_the_padded_forward(learners):
    packed, plain = learners
    batch = grouped_batch()
    lp_packed, lp_plain = packed.compute_logprobs(batch), plain.compute_logprobs(batch)
    torch.testing.assert_close(lp_packed, lp_plain, atol=2e-5, rtol=1e-5)
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0, -0.5, 1.0, -1.0, 0.2])
    m1 = packed.update_policy(dict(batch, old_logprobs=lp_packed, advantages=adv))
    m2 = plain.update_policy(dict(batch, old_logprobs=lp_plain, advantages=adv))
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert m1["actor/entropy"] == pytest.approx(m2["actor/entropy"], rel=1e-4)
    s1, s2 = packed.state_dict_for_rollout(), plain.state_dict_for_rollout()
    # Adam's first step moves every weight by ~lr (1e-3) whatever the gradient's size: float noise in near-zero
    # gradients shows up at ~1e-5 here, a wrong gradient at ~1e-3
    assert max(float((s1[k] - s2[k]).abs().max()) for k in s1) < 1e-4
