"""P-GenRM's data on the synthetic world (``psi.source: world``): the world's oracle teacher writes PSI's chains
(pgenrm.psi_data), the GRPO stages' PR is exact (the user's true weights: pgenrm.cre_reward), contested pairs are
a kind of hard negative, and the offline headroom check (pgenrm.headroom) runs before RL.

Run-level files: ``references.json`` (the world's reference predictors on the evaluation pairs),
``contested.json`` (pair id -> contested, for every evaluation pair) and ``headroom.json``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pr_rlhf.configs.pgenrm import GRPO_STAGES, GRPOStageConfig, WorldGRPOStageConfig, WorldPGenRMConfig
from pr_rlhf.eval.groups import EVAL_GROUPS
from pr_rlhf.files import atomic_write_text
from pr_rlhf.pgenrm.cre_reward import CREReward, cre_reward
from pr_rlhf.pgenrm.headroom import HeadroomGateError, held_out_items, pipeline_headroom
from pr_rlhf.pgenrm.psi_data import PSIExample, grpo_pool, in_other_order, is_contested, psi_examples
from pr_rlhf.pgenrm.report import CONTESTED_FILE, HEADROOM_FILE, REFERENCES_FILE, world_references
from pr_rlhf.pgenrm.sources import Log, PGenRMSource, pair_kinds
from pr_rlhf.world.generator import build_world
from pr_rlhf.world.reference import WorldPrior


class WorldSource(PGenRMSource):
    eval_format = "sec_compact"

    def __init__(self, cfg: WorldPGenRMConfig, seed: int, out: Path, on_event: Log):
        super().__init__(out, seed, on_event)
        self.cfg = cfg
        self.world = build_world(cfg.world)
        self.prior = WorldPrior.of(self.world)
        self.pairs = {p.pair_id: p for p in self.world.pairs}
        self.headroom = WorldHeadroom(self)
        self._examples: dict[bool, list[PSIExample]] = {}
        self._contested: dict[str, bool] | None = None

    def examples(self, keep_incorrect: bool) -> list[PSIExample]:
        """The (history, pair) examples with the teacher's chains, built once per run (PSI, the GRPO pool and the
        headroom check share them); ``keep_incorrect``: no label filter."""
        if keep_incorrect not in self._examples:
            psi = self.cfg.psi
            examples, stats = psi_examples(self.world, self.cfg.history_size, seed=self.seed,
                                           keep_incorrect=keep_incorrect, prior=self.prior,
                                           style=self.cfg.chain_style, history_variants=psi.history_variants,
                                           teacher=psi.teacher)
            self.on_event(f"{len(examples)} (history, pair) examples from {stats.examples} ({psi.teacher} "
                          f"teacher; correct chains: {stats.kept_share:.0%}; "
                          f"{'no label filter' if keep_incorrect else 'label-filtered'})")
            self._examples[keep_incorrect] = examples
        return self._examples[keep_incorrect]

    def contested_pairs(self) -> dict[str, bool]:
        """pair id -> contested, for every evaluation pair (seen and cold-start users, with their own history)."""
        if self._contested is None:
            self._contested = {it.pair.pair_id: is_contested(self.world, self.prior, it.pair, it.history)
                               for group in EVAL_GROUPS
                               for it in held_out_items(self.world, group, self.cfg.history_size)}
        return self._contested

    def prepare(self) -> None:
        if not (self.out / REFERENCES_FILE).is_file():
            refs = world_references(self.world, self.cfg.history_size)
            (self.out / REFERENCES_FILE).write_text(json.dumps(refs, indent=1))
        gate = self.headroom.offline()["gate"]
        if not (self.out / CONTESTED_FILE).is_file():
            (self.out / CONTESTED_FILE).write_text(json.dumps(self.contested_pairs()))
        self.on_event(headroom_line(gate, self.cfg.psi.teacher, self.cfg.stages))

    def psi_examples(self, stage_dir: Path) -> list[PSIExample]:
        return self.examples(keep_incorrect=not self.cfg.psi.label_filter)

    def grpo_pool(self, scfg: WorldGRPOStageConfig, stage_dir: Path) -> tuple[list[PSIExample], list[bool]]:
        pool = grpo_pool(self.examples(keep_incorrect=True), scfg.min_history)
        return pool, [e.contested if scfg.hard_kind == "contested" else e.hardness == "hard" for e in pool]

    def other_order(self, item: PSIExample) -> PSIExample:
        return in_other_order(item, self.world)

    def rewards(self, items: Sequence[PSIExample], texts: Sequence[Sequence[str]], scfg: GRPOStageConfig
                ) -> tuple[list[list[CREReward]], dict[str, float]]:
        out = []
        for item, chains in zip(items, texts):
            pair = self.pairs[item.pair_id]
            x1, x2 = (pair.x_chosen, pair.x_rejected) if item.first_is_chosen else (pair.x_rejected, pair.x_chosen)
            weights = self.world.user(item.user_id).weights
            out.append([cre_reward(t, item.first_is_chosen, self.world.attribute_names, x1, x2, weights,
                                   alpha=scfg.alpha, beta=scfg.beta, format_penalty=scfg.format_penalty)
                        for t in chains])
        return out, {}

    def pair_kinds(self) -> dict[str, set[str]]:
        return pair_kinds({p.pair_id: p.hardness for p in self.world.pairs}, self.contested_pairs())


class WorldHeadroom:
    """The headroom check of a world run: the offline report (teacher vs best rule vs Bayes on the evaluation
    pairs, the gate, the GRPO pool's expected share of groups with reward variance; ``<out>/headroom.json``,
    written once) and the gate it puts before the GRPO stages."""

    def __init__(self, source: WorldSource):
        self.source = source
        self.after_psi = source.cfg.headroom.after_psi   # measure the PSI model too (a Ray task of the driver)

    def offline(self) -> dict:
        path = self.source.out / HEADROOM_FILE
        if path.is_file():
            return json.loads(path.read_text())
        src = self.source
        out = pipeline_headroom(src.cfg, src.seed, src.world, src.prior, src.examples(keep_incorrect=True))
        atomic_write_text(path, json.dumps(out, indent=1))
        return out

    def check_gate(self, stage: str) -> None:
        """Refuse a GRPO stage (``gate: enforce``) or say it runs anyway (``warn``) while the gate says no go."""
        mode = self.source.cfg.headroom.gate
        if stage not in GRPO_STAGES or mode == "off":
            return
        verdict = self.offline()["gate"]
        if verdict["go"]:
            return
        if mode == "enforce":
            raise HeadroomGateError(f"stage {stage!r}: {verdict['verdict']} ({self.source.out / HEADROOM_FILE}; "
                                    f"set pgenrm.headroom.gate: warn to run it anyway)")
        self.source.on_event(f"{stage}: runs although the headroom check says {verdict['verdict']}")


def headroom_line(gate: dict, teacher: str, stages: Sequence[str]) -> str:
    """The headroom check's verdict as the run's log says it: it gates the GRPO stages, so for a run without any
    (SFT only, the quickstart's) a "no go" says what RL would find here, not that this run failed."""
    grpo = [s for s in stages if s in GRPO_STAGES]
    if gate["go"] or grpo:
        return f"headroom check for GRPO ({teacher} teacher): {gate['verdict']}"
    return (f"headroom check for GRPO ({teacher} teacher): little for RL to find beyond the teacher in this world "
            f"({'; '.join(gate['failed'])}); this run's stages ({', '.join(stages)}) are SFT only, so it gates "
            "nothing here")
