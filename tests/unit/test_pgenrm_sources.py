"""P-GenRM's data behind one interface (pr_rlhf.pgenrm.sources): the synthetic world's source and real data's source
answer the driver alike (prompt pools and their hard flags, the other slot order, chain rewards, pair kinds), each
with what only it has (the world's headroom check; real data's teacher engine and PR judge behind the cache). And
the configs as unions: the P-GenRM section chosen by psi.source, the data build by data.source, a field of the
other member named by the recipe's own path."""
from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import get_args

import pytest

from pr_rlhf.configs.pgenrm import (
    RealPGenRMConfig,
    TeacherPSIConfig,
    WorldPGenRMConfig,
    WorldPSIConfig,
    pgenrm_config,
)
from pr_rlhf.configs.recipe import (
    DATA_MEMBERS,
    Recipe,
    RecipeError,
    RetrievalConfig,
    SourceName,
    SyntheticDataConfig,
    apply_override,
    data_config,
    dump_recipe,
    load_recipe,
)
from pr_rlhf.models.base import Generation, Sample
from pr_rlhf.models.generation_cache import CachedEngine
from pr_rlhf.pgenrm.headroom import HeadroomGateError
from pr_rlhf.pgenrm.open_source import open_source
from pr_rlhf.pgenrm.real_source import RealSource
from pr_rlhf.pgenrm.sources import PROMPTS_FILE
from pr_rlhf.pgenrm.world_source import WorldSource
from pr_rlhf.reward.sec import SEC, Criterion, CriterionScore, format_sec
from tests import fixtures_raw as fx

ROOT = Path(__file__).resolve().parents[2]
TEACHER = {"backend": "openai", "model": "teacher", "base_url": "http://127.0.0.1:9/v1"}
WORLD = {"rendering": "compact", "users": 12, "cold_start_users": 3, "reference_samples": 300}
REAL = {"psi": {"source": "teacher", "teacher": TEACHER}, "process_reward": "judge", "pr_judge": TEACHER,
        "curriculum": {"alpha": 0.0, "hard_share_start": 0.3, "hard_share_end": 0.8}}


def chain(prefers_first: bool) -> str:
    s1, s2 = (8, 3) if prefers_first else (3, 8)
    return format_sec(SEC("Likes steps.", [Criterion("Steps", 1.0)], [CriterionScore("Steps", s1, s2)]))


class Scripted:
    """A teacher that prefers the slot holding the fixture's chosen answer (a short plan), and a judge that grades
    every chain 7/10; counts the prompts it was sent."""

    name = "scripted"

    def __init__(self):
        self.sent = 0

    def generate(self, prompts, params):
        self.sent += len(prompts)
        out = []
        for prompt in prompts:
            text = prompt[-1]["content"]
            if "Coverage" in json.dumps(prompt):
                out.append(Generation(samples=[Sample("Coverage: 7/10")] * params.n))
                continue
            tail = text[text.rindex("Short plan") if "Short plan" in text else 0:]
            first = "A long, general essay" in tail   # the short plan comes first: the rejected answer after it
            out.append(Generation(samples=[Sample(chain(first))] * params.n))
        return out

    def close(self):
        pass


@pytest.fixture(scope="module")
def world_source(tmp_path_factory):
    cfg = pgenrm_config(world=WORLD, chain_style="vote", psi={"teacher": "recent_pair"},
                        curriculum={"alpha": 0.0, "hard_kind": "contested", "hard_share_start": 0.3,
                                    "hard_share_end": 0.8}, headroom={"gate": "enforce"})
    events: list[str] = []
    source = open_source(cfg, 0, tmp_path_factory.mktemp("world_run"), events.append)
    source.events = events
    return source


@pytest.fixture(scope="module")
def real_source(tmp_path_factory):
    from data_pipelines.build import build_shards

    root = tmp_path_factory.mktemp("real")
    raw = fx.prism_users_fixture(root / "raw")
    build_shards(data_config(source="personal_rewardbench", input=str(root / "raw"), out=str(root / "shards"),
                             options={"survey": str(raw["survey"])},
                             retrieval=RetrievalConfig(embedder="bm25", top_k=2)))
    cfg = pgenrm_config(**REAL, shards=str(root / "shards"), out=str(root / "run"))
    events: list[str] = []
    source = open_source(cfg, 0, root / "run", events.append)
    engines: dict[str, Scripted] = {}

    def cached_engine(engine_cfg, name):   # the run's cache in front of a scripted engine instead of a server
        engines[name] = engines.get(name) or Scripted()
        return CachedEngine(engines[name], root / "run" / "cache" / f"{name}.jsonl", {"model": name})
    source.cached_engine = cached_engine
    source.engines, source.events, source.raw = engines, events, raw
    (root / "run").mkdir()
    return source


@pytest.fixture(params=["world", "real"])
def source(request, world_source, real_source):
    return world_source if request.param == "world" else real_source


def test_the_config_member_chooses_the_source_and_its_capabilities(world_source, real_source):
    assert isinstance(world_source, WorldSource) and isinstance(world_source.cfg, WorldPGenRMConfig)
    assert isinstance(real_source, RealSource) and isinstance(real_source.cfg, RealPGenRMConfig)
    assert world_source.headroom is not None and real_source.headroom is None   # no world: no headroom check
    assert (world_source.eval_format, real_source.eval_format) == ("sec_compact", "sec")


def test_both_sources_give_pools_slot_orders_rewards_and_kinds_alike(source, tmp_path):
    for stage in ("cre", "curriculum"):
        scfg = source.cfg.stage_config(stage)
        pool, hard = source.grpo_pool(scfg, tmp_path)
        assert pool and len(hard) == len(pool) and set(hard) == {True, False}
        assert all(len(e.history_ids) >= scfg.min_history for e in pool)
    item = pool[0]
    other = source.other_order(item)
    assert (other.pair_id, other.user_id, other.history_ids) == (item.pair_id, item.user_id, item.history_ids)
    assert other.first_is_chosen != item.first_is_chosen and other.messages != item.messages
    assert source.other_order(other).messages == item.messages
    items = pool[:3]
    rewards, metrics = source.rewards(items, [[chain(True), chain(False), "no chain"]] * len(items),
                                      source.cfg.stage_config("cre"))
    assert [[r.outcome for r in per] for per in rewards] == [[float(i.first_is_chosen), float(not i.first_is_chosen),
                                                              None] for i in items]
    assert all(per[2].reward == -0.1 and not per[2].parsed for per in rewards)
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    kinds = source.pair_kinds()
    assert {e.pair_id for e in pool} <= set(kinds)
    assert all(len(k & {"standard", "hard"}) == 1 for k in kinds.values())
    source.end_stage(tmp_path)


def test_the_world_source_reads_the_world(world_source, tmp_path):
    curriculum = world_source.cfg.stage_config("curriculum")
    pool, hard = world_source.grpo_pool(curriculum, tmp_path)
    assert hard == [e.contested for e in pool]                          # hard_kind: contested
    pool, hard = world_source.grpo_pool(world_source.cfg.stage_config("cre"), tmp_path)
    assert hard == [e.hardness == "hard" for e in pool]                 # the world's one-attribute pairs
    psi = world_source.psi_examples(tmp_path)
    assert psi and all(e.correct and e.target for e in psi)            # label-filtered teacher chains
    assert not (tmp_path / PROMPTS_FILE).exists()
    # the exact PR: the teacher's own (correct) chain gets its outcome and a process reward from the true weights
    rewards, metrics = world_source.rewards(psi[:5], [[e.target] for e in psi[:5]], world_source.cfg.cre)
    assert metrics == {} and all(per[0].outcome == 1.0 and per[0].process is not None for per in rewards)
    contested = world_source.contested_pairs()
    kinds = world_source.pair_kinds()
    assert all(("contested" in kinds[p]) == flag for p, flag in contested.items())
    world_source.prepare()
    out = world_source.out
    assert json.loads((out / "contested.json").read_text()) == contested
    assert set(json.loads((out / "references.json").read_text())) == {"seen", "cold"}
    assert world_source.events[-1].startswith("headroom check for GRPO (recent_pair teacher): ")
    assert world_source.headroom.offline()["gate"]["go"]               # the beatable teacher leaves room
    world_source.headroom.check_gate("cre")


def test_the_world_headroom_gate_refuses_rl_when_the_teacher_is_the_best_rule(tmp_path):
    events: list[str] = []
    for gate in ("enforce", "warn"):
        cfg = pgenrm_config(world=WORLD, chain_style="vote", headroom={"gate": gate})   # the vote teacher
        headroom = open_source(cfg, 0, tmp_path, events.append).headroom
        assert not headroom.offline()["gate"]["go"]
        headroom.check_gate("psi")                                     # never a supervised stage
        if gate == "enforce":
            with pytest.raises(HeadroomGateError, match="headroom.json"):
                headroom.check_gate("cre")
        else:
            headroom.check_gate("cre")
            assert events[-1].startswith("cre: runs although the headroom check says no go")


def test_the_real_source_asks_its_engines_once_and_records_what_each_stage_saw(real_source, tmp_path):
    psi_dir = tmp_path / "psi"
    psi_dir.mkdir()
    chains = real_source.psi_examples(psi_dir)
    teacher = json.loads((psi_dir / "teacher.json").read_text())
    assert teacher["pairs"] == len(real_source.data.examples) == 12 and teacher["kept"] == len(chains) == 12
    written = [json.loads(line) for line in (psi_dir / PROMPTS_FILE).read_text().splitlines()]
    user_of = {r["conversation_id"]: r["user_id"] for r in real_source.raw["rows"]}
    assert [w["target"] for w in written] == [e.target for e in chains]
    assert all(real_source.raw["stated"][user_of[w["pair_id"]]] in json.dumps(w["messages"]) for w in written)
    sent = real_source.engines["teacher"].sent
    assert real_source.psi_examples(psi_dir) == chains and real_source.engines["teacher"].sent == sent

    cre = tmp_path / "cre"
    cre.mkdir()
    pool, hard = real_source.grpo_pool(real_source.cfg.stage_config("cre"), cre)
    assert hard == [real_source.data.hard[e.pair_id] for e in pool]   # the label-margin rule
    written = [json.loads(line) for line in (cre / PROMPTS_FILE).read_text().splitlines()]
    assert [w["hard"] for w in written] == hard and not any("STATED-" in json.dumps(w) for w in written)
    rewards, metrics = real_source.rewards(pool[:2], [[chain(True), chain(False)]] * 2,
                                           real_source.cfg.stage_config("cre"))
    assert metrics == {"reward/pr_graded": 4, "reward/pr_failed": 0, "reward/pr_unavailable": 0}
    assert all(r.process == pytest.approx(0.7) for per in rewards for r in per)
    real_source.end_stage(cre)
    assert json.loads((cre / "pr_judge.json").read_text())["graded"] == 4
    real_source.prepare()
    assert json.loads((real_source.out / "real_data.json").read_text())["hard_rule"] == "label_margin"


# ----------------------------------------------------------------------------------------------------------------
# The configs as unions
# ----------------------------------------------------------------------------------------------------------------

def recipe_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    return str(err.value)


ENGINE = "{backend: openai, model: teacher, base_url: 'http://127.0.0.1:9/v1'}"
REAL_YAML = f"pgenrm:\n  psi: {{source: teacher, teacher: {ENGINE}}}\n  process_reward: judge\n  pr_judge: {ENGINE}\n"


@pytest.mark.parametrize("text,field", [
    ("pgenrm:\n  psi: {source: teacher}\n", "pgenrm.psi.teacher: Field required"),
    (f"pgenrm:\n  psi: {{teacher: {ENGINE}}}\n", "pgenrm.psi.teacher: Input should be 'votes' or 'recent_pair'"),
    (f"pgenrm:\n  process_reward: judge\n  pr_judge: {ENGINE}\n", "pgenrm.pr_judge: Extra inputs"),
    (f"pgenrm:\n  process_reward: judge\n  pr_judge: {ENGINE}\n", "pgenrm.process_reward: Input should be 'exact'"),
    ("pgenrm:\n  world: {users: 10}\n  hard_quantile: 0.3\n", "pgenrm.hard_quantile: Extra inputs"),
    ("pgenrm:\n  curriculum: {hard_kind: label_margin}\n", "pgenrm.curriculum.hard_kind: Input should be "
                                                           "'one_attribute' or 'contested'"),
    (REAL_YAML + "  curriculum: {alpha: 0, hard_kind: contested, hard_share_start: 0.3, hard_share_end: 0.8}\n",
     "pgenrm.curriculum.hard_kind: Input should be 'label_margin'"),
    (REAL_YAML.replace("teacher: {backend", "label_filter: false, teacher: {backend"),
     "pgenrm.psi.label_filter: Extra inputs"),
    (REAL_YAML + "  world: {users: 10}\n", "pgenrm.world: Extra inputs"),
    (REAL_YAML + "  headroom: {gate: enforce}\n", "pgenrm.headroom: Extra inputs"),
    ("pgenrm:\n  psi: {source: bogus}\n", "pgenrm: unknown P-GenRM data source psi.source"),
    (REAL_YAML.replace("process_reward: judge", "process_reward: exact"), "pgenrm: Value error, real data"),
    (REAL_YAML.replace(f"  pr_judge: {ENGINE}\n", ""), "pgenrm: Value error, process_reward 'judge' needs pr_judge"),
    ("data: {source: prb, options: {flip_sed: 1}}\n", "data.options.flip_sed: Extra inputs"),
    ("data: {source: synthetic, input: raw/}\n", "data.input: Extra inputs"),
    ("data: {source: dsp, options: {test_share: 2}}\n", "data.options.test_share: Input should be less than or equal"),
    ("data: {source: prbb}\n", "data: unknown data source"),
])
def test_a_field_of_another_member_is_named_by_the_recipes_path(tmp_path, text, field):
    assert f"field {field}" in recipe_error(tmp_path, text)


def test_members_hold_only_their_datas_fields():
    world, real = set(WorldPGenRMConfig.model_fields), set(RealPGenRMConfig.model_fields)
    assert world - real == {"world", "chain_style", "headroom"}
    assert real - world == {"pr_judge", "pr_judge_max_tokens", "hard_quantile"}
    assert set(WorldPSIConfig.model_fields) - set(TeacherPSIConfig.model_fields) == {"history_variants",
                                                                                    "label_filter"}
    assert set(TeacherPSIConfig.model_fields) - set(WorldPSIConfig.model_fields) == {
        "samples_per_pair", "teacher_temperature", "teacher_max_tokens", "cache"}
    assert "options" not in SyntheticDataConfig.model_fields and "input" not in SyntheticDataConfig.model_fields


def test_a_section_without_a_source_is_the_world_and_real_data_keeps_the_roots_world_out():
    recipe = Recipe.model_validate({"world": {"users": 20}, "pgenrm": {}})
    assert isinstance(recipe.pgenrm, WorldPGenRMConfig) and recipe.pgenrm.world.users == 20
    assert recipe.pgenrm.shards_world() == recipe.pgenrm.world and recipe.pgenrm.pr_judge is None
    real = Recipe.model_validate({"world": {"users": 20}, "pgenrm": REAL})
    assert isinstance(real.pgenrm, RealPGenRMConfig) and real.pgenrm.shards_world() is None
    assert Recipe(pgenrm=real.pgenrm).pgenrm == real.pgenrm            # a built member validates as itself
    assert real.pgenrm.stage_config("control").hard_kind == "label_margin"


@pytest.mark.parametrize("name", ["pgenrm_real.yaml", "gpu/pgenrm_real.yaml", "pgenrm_pipeline.yaml"])
def test_a_dumped_pgenrm_recipe_loads_to_the_same_recipe(name, tmp_path):
    recipe = load_recipe(ROOT / "recipes" / name)
    path = tmp_path / "again.yaml"
    path.write_text(dump_recipe(recipe))
    assert load_recipe(path).model_dump(mode="json") == recipe.model_dump(mode="json")


@pytest.mark.parametrize("source", sorted(set(DATA_MEMBERS) - {"synthetic"}))
def test_each_sources_options_are_its_loaders_keywords_with_the_same_defaults(source):
    import importlib

    loader = inspect.signature(importlib.import_module(f"data_pipelines.{source}").load)
    common = {"input", "skip_invalid", "encoding_errors", "subsets"}
    wanted = {n: p.default for n, p in loader.parameters.items() if n not in common}
    options = DATA_MEMBERS[source].model_fields["options"].annotation
    assert {n: f.default for n, f in options.model_fields.items()} == wanted


def test_the_command_lines_source_names_are_the_unions_members():
    assert set(get_args(SourceName)) == set(DATA_MEMBERS)


def test_switching_the_data_source_keeps_the_shared_fields():
    tree: dict = {"data": {"source": "synthetic", "out": "data/x", "retrieval": {"top_k": 5}}}
    apply_override(tree, "data.source=personal_rewardbench")
    apply_override(tree, "data.options.survey=s.jsonl")
    data = Recipe.model_validate(tree).data
    assert data.options.survey == "s.jsonl" and data.out == "data/x" and data.retrieval.top_k == 5
    assert data.input is None and data.options.cold_start_max_train == 1


def test_the_headroom_line_of_an_sft_only_run_is_not_a_failure():
    """The gate's "no go" reads as an error in a run that has no GRPO stage to gate (the quickstart's brief PSI)."""
    from pr_rlhf.pgenrm.world_source import headroom_line

    no_go = {"go": False, "failed": ["the best rule beats the teacher by +1.0 points overall (needs >= 3)"],
             "verdict": "no go: change the setting first (the best rule beats the teacher by +1.0 points overall)"}
    sft_only = headroom_line(no_go, "votes", ["base", "psi"])
    assert "no go" not in sft_only and "SFT only" in sft_only and "+1.0 points" in sft_only
    assert headroom_line(no_go, "votes", ["psi", "cre"]).endswith(no_go["verdict"])
    assert "go: the best" in headroom_line({"go": True, "failed": [], "verdict": "go: the best rule"}, "votes", ["psi"])
