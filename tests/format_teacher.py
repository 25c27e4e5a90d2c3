"""A "format teacher" for end-to-end tests: the tiny random-init model, fine-tuned on CPU so that, greedy, it answers
every P-GenRM prompt with one fixed, well-formed evaluation chain (FORMAT_CHAIN) and every PR judge prompt with
"Coverage: 7/10". A served copy then exercises the real parsing / reward path with outputs that parse, which the
random-init model never writes.

The suite does not train it: it ships in ``tests/data/format_teacher/`` with a MANIFEST.json that records the sha256
of every file and of its training inputs (prompts, answers, settings); ``tests/unit/test_format_teacher.py`` checks
both and the shipped model's held-out outputs, so a change to what it is trained on fails until it is re-shipped:

    python -m tests.format_teacher --ship     # train, check on held-out prompts, write tests/data/format_teacher/
    python -m tests.format_teacher            # train into a temporary folder and check it (prints the timings)
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from pathlib import Path

from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parent / "data" / "format_teacher"
SHIP_COMMAND = "python -m tests.format_teacher --ship"
# What the shipped teacher was trained on: (prompt count, seed) per kind, and the optimiser's settings.
TRAINING = {"sec": (64, 1), "judge": (64, 2), "steps": 200, "seed": 0, "batch_size": 4, "lr": 3e-3}

SEC_SYSTEM = "You are a personalized reward model"
JUDGE_SYSTEM = "You grade evaluation rubrics"
JUDGE_ANSWER = "Coverage: 7/10"
MAX_PROMPT_TOKENS = 1600  # longer prompts keep their end (the query and the instruction, which tell the kinds apart)

# 0.6 * 8 + 0.4 * 7 = 7.6 against 0.6 * 4 + 0.4 * 5 = 4.4: the chain prefers response_1.
FORMAT_CHAIN = format_sec(SEC(
    persona="This user wants practical, step-by-step answers and little padding.",
    criteria=[Criterion("Concrete steps", 0.6, "gives actionable steps"), Criterion("Brevity", 0.4, "stays short")],
    scores=[CriterionScore("Concrete steps", 8, 4, "lists clear steps"),
            CriterionScore("Brevity", 7, 5, "shorter and to the point")],
    final={"response_1": 7.6, "response_2": 4.4}))


def build_format_teacher(out_dir: Path, prompts_sec: list[list[dict]], prompts_judge: list[list[dict]],
                         steps: int = 200, seed: int = 0, batch_size: int = 4, lr: float = 3e-3) -> Path:
    """Fine-tune a copy of the "tiny" model on (prompt -> fixed answer + eos) and save it (float32, with its
    tokenizer) in ``out_dir``. Stops early once both kinds' answers are near-certain (per-token loss < 1e-3)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from pr_rlhf.models.hf_engine import quiet_hf_loading
    from pr_rlhf.models.prompting import encode_prompt, load_tokenizer
    from pr_rlhf.models.sources import resolve_model

    quiet_hf_loading()
    base = resolve_model("tiny")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()

    def examples(prompts: list[list[dict]], system: str, answer: str) -> list[tuple[list[int], list[int]]]:
        answer_ids = tok(answer, add_special_tokens=False).input_ids + [tok.eos_token_id]
        for p in prompts:
            assert p[0]["role"] == "system" and p[0]["content"].startswith(system), p[0]["content"][:60]
        # encode_prompt is what the engines do (chat template, add_generation_prompt, no extra specials)
        return [(encode_prompt(tok, p)[-MAX_PROMPT_TOKENS:], answer_ids) for p in prompts]

    kinds = [examples(prompts_sec, SEC_SYSTEM, FORMAT_CHAIN), examples(prompts_judge, JUDGE_SYSTEM, JUDGE_ANSWER)]

    def kind_loss(batch: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        # One kind per forward pass: similar lengths, little padding. Loss only on answer + eos, and the LM head
        # only on those positions (the prompt's logits would cost more than the rest of the model).
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        targets = torch.full((len(batch), width), -100)
        for i, (p, a) in enumerate(batch):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            mask[i, :len(p) + len(a)] = 1
            targets[i, len(p) - 1:len(p) + len(a) - 1] = torch.tensor(a)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        keep = targets != -100
        return F.cross_entropy(model.lm_head(hidden[keep]), targets[keep])

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.1, 1 - s / steps))
    for step in range(steps):
        # each kind weighs the same, whatever its answer's length (the judge line is a few tokens)
        losses = [kind_loss(rng.sample(ex, min(batch_size, len(ex)))) for ex in kinds if ex]
        loss = sum(losses) / len(losses)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if max(x.item() for x in losses) < 1e-3:
            break
    log.info("format teacher: %d steps, final losses %s", step + 1, [round(x.item(), 5) for x in losses])
    out_dir = Path(out_dir)
    model.eval()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


# ----------------------------------------------------------------------------------------------------------------
# Realistic prompts of both kinds, from short varied texts (held_out=True draws from questions training never saw)
# ----------------------------------------------------------------------------------------------------------------

QUESTIONS = [
    "How do I keep basil alive on a windowsill?", "What is a good first programming language?",
    "How can I fall asleep faster?", "Any tips for a first marathon?", "How do I ask my boss for a raise?",
    "What should I pack for a weekend in the mountains?", "How do I fix a squeaky door?",
    "What is an easy vegetarian dinner for four?", "How do I start learning the guitar?",
    "How can I stop procrastinating on my thesis?", "What's the best way to learn Spanish vocabulary?",
    "How do I clean a cast iron pan?", "Should I rent or buy a flat in a big city?",
    "How do I explain recursion to a child?", "What are good houseplants for low light?",
    "How do I prepare for a job interview in tech?", "How much water should I drink a day?",
    "How do I make my bike chain stop skipping?", "What board games are good for two players?",
    "How can I save money on groceries?",
]
RESPONSES = [
    "Water it when the soil is dry and give it six hours of sun.", "Start with Python: it reads like English.",
    "Keep a fixed bedtime, no screens for an hour before, and a cool dark room.",
    "Build up slowly, about ten percent more distance a week, and rest well.",
    "List what you achieved this year, pick a calm moment and name a number.",
    "Layers, a rain jacket, good boots, snacks and a map.", "Put a drop of oil on the hinge pin.",
    "A chickpea curry with rice takes thirty minutes.", "Learn three chords and play songs you love every day.",
    "Work in 25-minute blocks and start with the smallest task.", "Use spaced repetition cards for ten minutes daily.",
    "Scrub with salt, rinse, dry on the stove and oil it lightly.", "It depends on how long you plan to stay.",
    "It is a function that calls itself on a smaller problem until it is trivial.",
    "Pothos, snake plants and ZZ plants handle low light well.", "Practice coding problems and prepare stories.",
    "About two liters, more when it is hot or you exercise.", "Check the derailleur alignment and chain wear.",
    "Patchwork, Jaipur and 7 Wonders Duel.", "Plan meals, buy store brands and avoid shopping hungry.",
    "Honestly, I am not sure; you could search online.", "There are many opinions on this topic.",
    "Here is a very long and detailed answer covering the history, the theory and every exception at length.",
]
STATED = [
    "I like short, direct answers with concrete steps.", "I prefer detailed explanations with examples.",
    "Please be friendly and encouraging.", "I want facts, not opinions.", "I care about cost and practicality.",
    "",
]
CRITERIA = ["Concrete steps", "Brevity", "Friendly tone", "Factual accuracy", "Practicality", "Examples",
            "Safety", "Clarity", "Cost awareness"]


def _questions(held_out: bool) -> list[str]:
    return QUESTIONS[1::2] if held_out else QUESTIONS[::2]


def sec_prompts(n: int, seed: int = 0, held_out: bool = False) -> list[list[dict]]:
    """P-GenRM prompts with 0-6 history triples of one- or two-sentence responses: about 450 to 1400 tokens.
    The spread matters: a teacher trained only on short prompts writes garbage at positions it never saw
    (real PRISM prompts of ~870 tokens broke one trained on prompts under 800)."""
    from pr_rlhf.reward.inputs import RMInput
    from pr_rlhf.reward.sec import sec_prompt

    rng = random.Random(seed)
    questions = _questions(held_out)
    out = []

    def response() -> str:
        return " ".join(rng.sample(RESPONSES, rng.randint(1, 2)))

    for i in range(n):
        history = [{"question": rng.choice(QUESTIONS), "chosen": response(), "rejected": response()}
                   for _ in range(rng.randint(0, 6))]
        inp = RMInput(pair_id=f"p{seed}-{i}", user_id=f"u{rng.randint(0, 9)}", subset="prism",
                      question=rng.choice(questions), chosen=rng.choice(RESPONSES), rejected=rng.choice(RESPONSES),
                      history=history, stated_preferences=rng.choice(STATED))
        r1, r2 = (inp.chosen, inp.rejected) if rng.random() < 0.5 else (inp.rejected, inp.chosen)
        out.append(sec_prompt(inp, r1, r2, use_stated=rng.random() < 0.5))
    return out


def judge_prompts(n: int, seed: int = 0, held_out: bool = False) -> list[list[dict]]:
    from pr_rlhf.pgenrm.pr_judge import judge_prompt
    from pr_rlhf.reward.sec import normalize

    rng = random.Random(seed)
    questions = _questions(held_out)
    out = []
    for _ in range(n):
        names = rng.sample(CRITERIA, rng.randint(2, 4))
        weights = normalize([rng.randint(1, 9) for _ in names])
        sec = SEC(persona="", criteria=[Criterion(name, w) for name, w in zip(names, weights)])
        gold = rng.choice([s for s in STATED if s] + ["\n".join(rng.sample(CRITERIA, 2))])
        out.append(judge_prompt(gold, sec, rng.choice(questions)))
    return out


def training_prompts() -> tuple[list[list[dict]], list[list[dict]]]:
    return sec_prompts(*TRAINING["sec"]), judge_prompts(*TRAINING["judge"])


def heldout_prompts(n: int = 16) -> tuple[list[list[dict]], list[list[dict]]]:
    return sec_prompts(n, seed=3, held_out=True), judge_prompts(n, seed=4, held_out=True)


def training_inputs_sha256() -> str:
    """The hash of everything the teacher learns from: both kinds' prompts, the fixed answers and the settings."""
    sec, judge = training_prompts()
    blob = json.dumps({"sec": sec, "judge": judge, "answers": [FORMAT_CHAIN, JUDGE_ANSWER],
                       "max_prompt_tokens": MAX_PROMPT_TOKENS, "training": TRAINING}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    from pr_rlhf.shards import sha256_file

    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != "MANIFEST.json"}


def shipped_format_teacher() -> Path:
    """The shipped teacher's folder, after checking its files against the manifest (a stale or edited copy is
    refused, naming the command that re-ships it)."""
    manifest = json.loads((SHIPPED / "MANIFEST.json").read_text())
    if file_hashes(SHIPPED) != manifest["files"]:
        raise RuntimeError(f"{SHIPPED}: files differ from MANIFEST.json; re-ship with `{SHIP_COMMAND}`")
    if manifest["training_inputs_sha256"] != training_inputs_sha256():
        raise RuntimeError(f"{SHIPPED}: trained on other prompts or settings; re-ship with `{SHIP_COMMAND}`")
    return SHIPPED


def check_teacher(model_dir: Path, n: int = 16) -> dict:
    """Greedy exact answers and temperature-1 parse counts on held-out prompts of both kinds."""
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.models.hf_engine import HFEngine
    from pr_rlhf.pgenrm.pr_judge import parse_coverage
    from pr_rlhf.reward.sec import parse_sec

    test_sec, test_judge = heldout_prompts(n)
    engine = HFEngine(str(model_dir), max_model_len=2048)
    try:
        greedy = engine.generate(test_sec + test_judge, SamplingParams(temperature=0.0, max_tokens=200))
        want = [FORMAT_CHAIN] * len(test_sec) + [JUDGE_ANSWER] * len(test_judge)
        exact = sum(g.samples[0].text == w for g, w in zip(greedy, want))
        sampled = engine.generate(test_sec + test_judge, SamplingParams(n=4, temperature=1.0, max_tokens=200, seed=0))
    finally:
        engine.close()
    return {"greedy_exact": exact, "prompts": len(want),
            "sampled_sec_parsed": sum(parse_sec(s.text).ok for g in sampled[:len(test_sec)] for s in g.samples),
            "sampled_judge_parsed": sum(parse_coverage(s.text).ok for g in sampled[len(test_sec):]
                                        for s in g.samples),
            "samples_per_kind": 4 * n}


def train_teacher(out_dir: Path) -> Path:
    sec, judge = training_prompts()
    settings = {k: TRAINING[k] for k in ("steps", "seed", "batch_size", "lr")}
    return build_format_teacher(out_dir, sec, judge, **settings)


def ship(dest: Path = SHIPPED) -> dict:
    """Train, check on held-out prompts (every greedy answer exact, or nothing is shipped), write ``dest``."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        model = train_teacher(Path(tmp) / "teacher")
        seconds = time.monotonic() - start
        checks = check_teacher(model)
        if checks["greedy_exact"] != checks["prompts"]:
            raise RuntimeError(f"the trained teacher missed held-out answers, not shipped: {checks}")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(model, dest)
    manifest = {"kind": "format_teacher", "command": SHIP_COMMAND, "training": TRAINING,
                "training_inputs_sha256": training_inputs_sha256(), "train_seconds": round(seconds, 1),
                "heldout": checks, "files": file_hashes(dest)}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


if __name__ == "__main__":
    import os
    import sys
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from pr_rlhf.reward.sec import parse_sec

    chain = parse_sec(FORMAT_CHAIN)
    assert chain.ok and chain.value.prefers_first, chain
    (train_sec, train_judge), (test_sec, test_judge) = training_prompts(), heldout_prompts()
    assert not any(p in train_sec for p in test_sec) and not any(p in train_judge for p in test_judge)
    if "--ship" in sys.argv[1:]:
        print(json.dumps({k: v for k, v in ship().items() if k != "files"}, indent=1))
        print(f"shipped -> {SHIPPED}")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.monotonic()
            out = train_teacher(Path(tmp) / "teacher")
            print(f"trained and saved in {time.monotonic() - start:.1f} s")
            checks = check_teacher(out)
            print(json.dumps(checks))
            assert checks["greedy_exact"] == checks["prompts"]
