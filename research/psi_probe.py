"""PSI probe: the fastest way to compare chain styles, schedules and models for the from-scratch GenRM.

In-process SFT (plain torch, 2 threads, no Ray) of a model on the oracle's PSI chains of a world, then greedy
decoding of held-out seen-user pairs: accuracy (ties count wrong), parse failures, and per chain line how often
the model's line equals the oracle chain's line on the same prompt, which shows the step of the chain that
fails (history transliteration, Prefers, Fit, criteria, scores). The pipeline (`pr-rlhf pgenrm`) is the measured
path; this probe decides what to run there. The quickstart's design probes (docs/studies/quickstart.md) came from it,
e.g.

    python research/psi_probe.py recipes/pgenrm_smoke.yaml --steps 600
    python research/psi_probe.py recipes/pgenrm_pipeline.yaml --steps 900 --eval-every 300 --eval-n 300 --max-new 420
"""
from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass

import numpy as np
import torch

from pr_rlhf.configs.pgenrm import SFTStageConfig
from pr_rlhf.configs.recipe import load_recipe
from pr_rlhf.models.prompting import encode_prompt, load_tokenizer
from pr_rlhf.models.sources import resolve_model
from pr_rlhf.pgenrm.oracle_chain import oracle_chain
from pr_rlhf.pgenrm.psi_data import psi_examples
from pr_rlhf.reward.inputs import rm_input
from pr_rlhf.reward.sec import format_sec, parse_sec, sec_compact_prompt
from pr_rlhf.rl.prompts import SFTExample, sft_example
from pr_rlhf.world.generator import World, build_world
from pr_rlhf.world.reference import WorldPrior
from workers.rl_loop import sft_steps


@dataclass
class HeldOut:
    prompt_ids: list[int]
    first_is_chosen: bool
    oracle_chain: str


def held_out(world: World, prior: WorldPrior, tok, style: str, n: int, history_size: int = 3, seed: int = 0
             ) -> list[HeldOut]:
    """``n`` val/test pairs of seen users, their first ``history_size`` train pairs as history (as `pr-rlhf eval`),
    seeded slots."""
    rng = np.random.default_rng(seed)
    pairs = [p for u in world.users if not u.cold_start
             for p in world.pairs_of(u.user_id, "val") + world.pairs_of(u.user_id, "test")]
    out = []
    for p in (pairs[i] for i in rng.permutation(len(pairs))[:n]):
        history = world.history(p.user_id, history_size)
        first = bool(rng.random() < 0.5)
        r1, r2 = (p.chosen, p.rejected) if first else (p.rejected, p.chosen)
        chain = oracle_chain(world, prior, p, history, first, style)
        out.append(HeldOut(encode_prompt(tok, sec_compact_prompt(rm_input(p, history), r1, r2)), first,
                           format_sec(chain.sec, final=False)))
    return out


class InProcessSFT:
    """The learner group's ``update_sft`` on one in-process model: token-mean NLL of the targets, AdamW, grad clip
    1.0 (what ``sft_steps`` drives, without Ray)."""

    def __init__(self, model, lr: float) -> None:
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    def update_sft(self, batch: dict, lr: float) -> dict[str, float]:
        pairs = list(zip(batch["prompt_ids"], batch["response_ids"]))
        width = max(len(p) + len(t) for p, t in pairs)
        ids = torch.zeros(len(pairs), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (p, t) in enumerate(pairs):
            ids[i, :len(p) + len(t)] = torch.tensor(p + t)
            mask[i, :len(p) + len(t)] = 1
            labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
        for group in self.opt.param_groups:
            group["lr"] = lr
        loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return {"sft/nll": loss.item()}


def line_key(line: str) -> str:
    return re.sub(r"\d", "#", line.split(":")[0])[:20]


@torch.no_grad()
def evaluate(model, tok, items: list[HeldOut], max_new: int, batch: int = 100) -> dict:
    """Greedy chains for ``items``: accuracy, failures, ties, and per line key (right, seen) against the oracle."""
    model.eval()
    correct = failures = ties = 0
    lines: dict[str, list[int]] = {}
    pad = tok.pad_token_id or 0
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        width = max(len(c.prompt_ids) for c in chunk)
        ids = torch.tensor([[pad] * (width - len(c.prompt_ids)) + c.prompt_ids for c in chunk])
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(c.prompt_ids) for c in chunk])[:, None])
        out = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad, eos_token_id=tok.eos_token_id)
        for item, row in zip(chunk, out):
            text = tok.decode(row[width:], skip_special_tokens=True)
            parsed = parse_sec(text)
            final = (parsed.value.final or parsed.value.weighted_sums()) if parsed.ok and parsed.value else None
            if not final:
                failures += 1
                continue
            if final["response_1"] == final["response_2"]:
                ties += 1
                continue
            correct += int((final["response_1"] > final["response_2"]) == item.first_is_chosen)
            written = text.strip().splitlines()
            for j, gold in enumerate(item.oracle_chain.splitlines()):
                counts = lines.setdefault(line_key(gold), [0, 0])
                counts[1] += 1
                counts[0] += int(j < len(written) and written[j].strip() == gold.strip())
    model.train()
    return {"accuracy": correct / len(items), "failures": failures, "ties": ties,
            "lines": {k: f"{r}/{n}" for k, (r, n) in lines.items() if n > 5}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="a P-GenRM recipe: its world, chain style and model")
    ap.add_argument("--style", choices=["compact", "trace", "vote"], help="override the recipe's chain style")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--history-variants", type=int, default=4)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--max-new", type=int, default=320)
    ap.add_argument("--history-size", type=int, help="override the recipe's history_size")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = load_recipe(a.recipe).pgenrm
    a.style = a.style or cfg.chain_style
    world = build_world(cfg.world)
    prior = WorldPrior.of(world)
    a.history_size = a.history_size or cfg.history_size
    examples, stats = psi_examples(world, a.history_size, style=a.style, history_variants=a.history_variants,
                                   prior=prior)
    from transformers import AutoModelForCausalLM

    path = resolve_model(cfg.model)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = [sft_example(tok, e.messages, e.target) for e in examples]
    items = held_out(world, prior, tok, a.style, a.eval_n, a.history_size)
    print(f"{len(examples)} examples (kept {stats.kept_share:.3f}); prompt {np.mean([len(p) for p, _ in data]):.0f} "
          f"+ chain {np.mean([len(t) for _, t in data]):.0f} tokens; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)
    schedule = SFTStageConfig(steps=a.steps, lr=a.lr, warmup_steps=10)   # the pipeline's warm-up + cosine
    learner = InProcessSFT(model, a.lr)
    order, pos, start = np.random.default_rng(1).permutation(len(data)), 0, time.time()

    def batch(step: int) -> list[SFTExample]:
        """The next ``batch_size`` examples of a shuffled pass; a new pass reshuffles (seeded by its first step)."""
        nonlocal order, pos
        out = []
        for _ in range(a.batch_size):
            if pos == len(order):
                order, pos = np.random.default_rng(step).permutation(len(data)), 0
            out.append(data[order[pos]])
            pos += 1
        return out

    def report(step: int, metrics: dict[str, float]) -> None:
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step} loss {metrics['sft/nll']:.4f} {time.time() - start:.0f}s", flush=True)
        if a.eval_every and step and step % a.eval_every == 0:
            print("EVAL", step, evaluate(model, tok, items, a.max_new), flush=True)

    model.train()
    sft_steps(learner, batch, schedule.lr_at, a.steps, on_step=report)
    print(f"RESULT {a.recipe} {a.style} steps={a.steps} lr={a.lr}", evaluate(model, tok, items, a.max_new), flush=True)


if __name__ == "__main__":
    main()
