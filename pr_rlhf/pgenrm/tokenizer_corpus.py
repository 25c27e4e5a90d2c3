"""The text ``tiny-genrm``'s tokenizer learns besides the world corpus: compact P-GenRM prompts and oracle chains,
so a chain's signed attributes and keys are few tokens (registered with :mod:`pr_rlhf.models.sources` by
:mod:`pr_rlhf.pgenrm`)."""
from __future__ import annotations

from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.pgenrm.psi_data import psi_examples
from pr_rlhf.world.generator import build_world


def genrm_corpus() -> list[str]:
    """Compact P-GenRM prompts and oracle chains of a small world with its own seed (not the worlds trained or
    evaluated on): the tokenizer learns the chain's vocabulary, so prompts and chains are short."""
    world = build_world(WorldConfig(seed=1000, users=60, cold_start_users=0, rendering="compact",
                                    reference_samples=1000))
    texts = []
    for style in ("compact", "vote"):   # the vote chain's lines are a superset of the trace chain's
        examples, _ = psi_examples(world, style=style, keep_incorrect=True)
        texts += [e.target for e in examples]
    # every style has the same prompts: the last style's examples give them once
    return [m["content"] for e in examples for m in e.messages] + texts
