"""Resources checked before anything starts (pr_rlhf.resources) on the actors each command declares
(pr_rlhf.actors): engines against their actors' GPUs, bundles against the nodes, each phase against the cluster, with
errors naming the recipe field; vLLM's executor chosen explicitly; every command that starts actors checked."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pr_rlhf.actors import declare
from pr_rlhf.configs.base import engine_config, vllm_eager, vllm_weight_transfer
from pr_rlhf.configs.recipe import RecipeError, load_recipe
from pr_rlhf.resources import ClusterFitError, ResourceError, check

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "recipes" / "gpu"
COMMAND = {"ppo_personalized": "train", "pgenrm_pipeline": "pgenrm", "pgenrm_real": "pgenrm", "rm_bt": "train-rm",
           "bon_sweep": "bon"}


def kuberay_node(group: dict) -> dict[str, float]:
    """What Ray offers on a pod of ``group``: its container's limits, unless its rayStartParams say otherwise."""
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    params = group.get("rayStartParams") or {}
    return {"CPU": float(params.get("num-cpus", limits["cpu"])),
            "GPU": float(params.get("num-gpus", limits.get("nvidia.com/gpu", 0)))}


def kuberay_nodes() -> list[dict[str, float]]:
    """The nodes of cluster/kuberay_rayjob.yaml: the head and the GPU worker group's replicas."""
    spec = yaml.safe_load((ROOT / "cluster" / "kuberay_rayjob.yaml").read_text())["spec"]["rayClusterSpec"]
    nodes = [kuberay_node(spec["headGroupSpec"])]
    for group in spec["workerGroupSpecs"]:
        nodes += [kuberay_node(group)] * group["replicas"]
    return nodes


SPLIT = ("train.layout=split", "train.rollout_workers=2", "train.rollout_num_gpus=1")   # ppo_personalized, split
PGENRM_SPLIT = ("pgenrm.layout=split", "pgenrm.rollout_workers=2", "pgenrm.rollout_num_gpus=2",
                "pgenrm.rollout.tensor_parallel_size=2")   # the P-GenRM recipes with two TP-2 engines of their own


def gpu_recipe(name: str, *overrides: str):
    return load_recipe(GPU / f"{name}.yaml", list(overrides))


def test_every_gpu_recipe_fits_two_8_gpu_nodes():
    assert sorted(p.stem for p in GPU.glob("*.yaml")) == sorted(COMMAND)
    nodes = kuberay_nodes()
    assert [n.get("GPU", 0) for n in nodes] == [0, 8, 8]
    for name, command in COMMAND.items():
        groups = check(gpu_recipe(name), command, nodes)
        assert groups and all(g.bundles or g.colocated_with for g in groups), name


def test_rollout_tp_must_equal_the_rollout_workers_gpus():
    with pytest.raises(ResourceError) as err:
        check(gpu_recipe("pgenrm_pipeline", *PGENRM_SPLIT, "pgenrm.rollout_num_gpus=1"), "pgenrm")
    assert "pgenrm.rollout.tensor_parallel_size is 2" in str(err.value) and "pgenrm.rollout_num_gpus is 1" in \
        str(err.value)
    with pytest.raises(ResourceError, match=r"train.rollout.tensor_parallel_size is 2.*train.rollout_num_gpus is 1"):
        check(gpu_recipe("ppo_personalized", *SPLIT, "train.rollout.tensor_parallel_size=2"), "train")
    # the reward workers' judge likewise, and a GPU engine in an actor holding no GPU
    with pytest.raises(ResourceError, match=r"reward.judge.tensor_parallel_size is 2.*reward.pool.num_gpus is 1"):
        check(gpu_recipe("ppo_personalized", "reward.pool.num_gpus=1"), "train")
    with pytest.raises(ResourceError, match=r"bon.policy runs on cuda.*bon.rollout_num_gpus is 0"):
        check(gpu_recipe("bon_sweep", "bon.rollout_num_gpus=0"), "bon")
    with pytest.raises(ResourceError, match=r"rm.planner.*rm.eval.device"):
        check(gpu_recipe("rm_bt", "rm.planner.tensor_parallel_size=2"), "train-rm")


def test_a_bundle_larger_than_any_node_is_refused():
    recipe = gpu_recipe("ppo_personalized", "reward.judge.tensor_parallel_size=16",
                        "reward.planner.tensor_parallel_size=16", "reward.pool.num_gpus=16")
    check(recipe, "train")   # consistent on its own: only the cluster refuses it
    with pytest.raises(ClusterFitError) as err:
        check(recipe, "train", kuberay_nodes())
    assert str(err.value).startswith("reward.pool.num_gpus: ") and "GPU 16 > the largest node's GPU 8" in str(err.value)
    with pytest.raises(ClusterFitError, match=r"^train.learner.resources: .*learner_host 1"):
        check(gpu_recipe("ppo_personalized", 'train.learner.resources={"learner_host": 1}'), "train", kuberay_nodes())
    # each resource exists somewhere, never together
    with pytest.raises(ClusterFitError, match="no node offers all of it at once"):
        check(gpu_recipe("rm_bt"), "train-rm", [{"CPU": 64.0}, {"CPU": 1.0, "GPU": 8.0}])


def test_a_phase_larger_than_the_cluster_is_refused():
    one_node = [{"CPU": 16.0, "GPU": 8.0}]
    with pytest.raises(ClusterFitError, match=r"^pgenrm GRPO \(cre, curriculum\): .* GPU 12 \(pgenrm.learner."
                                              r"num_gpus_per_worker: 8 x 1, pgenrm.rollout_num_gpus: 2 x 2\), the "
                                              r"cluster has 8"):
        check(gpu_recipe("pgenrm_pipeline", *PGENRM_SPLIT), "pgenrm", one_node)
    with pytest.raises(ClusterFitError, match=r"^train: .* CPU 12 \(train.learner.num_cpus_per_worker: 4 x 0.5, "
                                              r"train.rollout_num_cpus: 2 x 1, reward.pool.num_cpus: 2 x 4\)"):
        check(gpu_recipe("ppo_personalized", *SPLIT), "train", [{"CPU": 8.0, "GPU": 8.0}, {"CPU": 2.0, "GPU": 8.0}])
    # phases run one after the other: bon's pool and its scoring pools never add up
    check(gpu_recipe("bon_sweep"), "bon", [{"CPU": 4.0, "GPU": 1.0}])
    # custom resources count too
    with pytest.raises(ClusterFitError, match="learner_host"):
        check(gpu_recipe("rm_bt", 'rm.learner.resources={"learner_host": 1}'), "train-rm", kuberay_nodes())


def test_placement_strategies():
    nodes = [{"CPU": 16.0, "GPU": 4.0}] * 2
    with pytest.raises(ClusterFitError, match="STRICT_PACK"):
        check(gpu_recipe("rm_bt", "rm.learner.placement_strategy=STRICT_PACK"), "train-rm", nodes)
    check(gpu_recipe("rm_bt"), "train-rm", nodes)   # PACK may spread the ranks over both nodes
    with pytest.raises(ClusterFitError, match="STRICT_SPREAD"):
        check(gpu_recipe("rm_bt", "rm.learner.placement_strategy=STRICT_SPREAD"), "train-rm", nodes)


def test_groups_mirror_the_drivers():
    groups = {g.name: g for g in declare(gpu_recipe("ppo_personalized", *SPLIT), "train")}
    assert {name: (len(g.bundles), g.bundles[0], g.placement_group, g.engine_gpus) for name, g in groups.items()} == {
        "train.learner": (4, {"CPU": 0.5, "GPU": 1.0}, "PACK", 0),
        "train.rollout workers": (2, {"CPU": 1.0, "GPU": 1.0}, "PACK", 1),
        "reward pool": (2, {"CPU": 4.0, "GPU": 2.0}, None, 2)}
    assert {g.phase for g in groups.values()} == {"train"}
    # a learner with device auto takes GPUs only where the cluster has them
    cpu = declare(load_recipe(ROOT / "recipes" / "grpo_tiny.yaml"), "train")[0]
    assert "GPU" not in cpu.bundle
    gpu = declare(load_recipe(ROOT / "recipes" / "grpo_tiny.yaml"), "train", cluster_gpus=8)[0]
    assert gpu.bundle["GPU"] == 1.0
    sweep = declare(load_recipe(ROOT / "recipes" / "ppo_personalized_vs_global.yaml"), "rl-sweep")
    arms = list(load_recipe(ROOT / "recipes" / "ppo_personalized_vs_global.yaml").rl_sweep.arms)
    assert list(dict.fromkeys(g.phase for g in sweep)) == [f"rl-sweep arm {a}" for a in arms]   # one after the other
    assert f"rl_sweep.arms.{arms[0]} pool" in {g.name for g in sweep}
    with pytest.raises(ResourceError, match="no bon: section"):
        check(load_recipe(ROOT / "recipes" / "grpo_tiny.yaml"), "bon")


def test_vllm_executor_is_explicit_with_tensor_parallelism():
    assert engine_config(backend="vllm", tensor_parallel_size=2).executor_backend() == "mp"
    assert engine_config(backend="vllm").executor_backend() is None
    assert engine_config(backend="vllm", tensor_parallel_size=2, distributed_executor_backend="ray")\
        .executor_backend() == "ray"
    # CUDA graphs on a GPU unless asked otherwise; eager on CPU (vLLM captures none there)
    assert vllm_eager("cuda", engine_config(backend="vllm").enforce_eager) is False
    assert vllm_eager("cpu", engine_config(backend="vllm").enforce_eager) is True
    assert vllm_eager("cuda", True) is True
    assert vllm_weight_transfer("cuda", "auto") == "nccl" and vllm_weight_transfer("cpu", "auto") == "gloo"
    assert vllm_weight_transfer("cuda", "gloo") == "gloo"
    with pytest.raises(ValueError, match="'uni' runs one GPU worker"):
        engine_config(backend="vllm", tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ResourceError, match=r"pgenrm.rollout.distributed_executor_backend 'ray'.*waits forever"):
        check(gpu_recipe("pgenrm_pipeline", *PGENRM_SPLIT, "pgenrm.rollout.distributed_executor_backend=ray"),
              "pgenrm")
    with pytest.raises(RecipeError, match="pgenrm.rollout"):
        gpu_recipe("pgenrm_pipeline", *PGENRM_SPLIT, "pgenrm.rollout.distributed_executor_backend=uni")


def test_learner_attention_conflict_is_refused_before_start():
    with pytest.raises(ResourceError, match=r"pgenrm.learner: .*shared_prefix"):
        check(gpu_recipe("pgenrm_pipeline", "pgenrm.learner.attn_implementation=flash_attention_2"), "pgenrm")
    check(gpu_recipe("rm_bt", "rm.learner.attn_implementation=flash_attention_2"), "train-rm")   # 2-D masks only


def test_a_persona_read_by_a_gpu_scalar_rm_needs_a_gpu_in_its_pool():
    """The persona scorer builds its judge and, when set, a scalar RM: one on cuda in a worker holding no GPU is
    refused like any other engine."""
    recipe = load_recipe(ROOT / "recipes" / "grpo_tiny.yaml", ["reward.kind=persona", "reward.scalar_rm.device=cuda"])
    with pytest.raises(ResourceError, match=r"reward.scalar_rm runs on cuda.*reward.pool.num_gpus is 0"):
        check(recipe, "train")
    check(load_recipe(ROOT / "recipes" / "grpo_tiny.yaml", ["reward.kind=persona", "reward.scalar_rm.device=cuda",
                                                            "reward.pool.num_gpus=1"]), "train")


def test_leaderboard_model_rows_are_checked_like_any_reward_pool():
    recipe = load_recipe(ROOT / "recipes" / "leaderboard.yaml",
                         ["leaderboard.models.pgenrm_shipped.reward.judge.device=cuda"])
    with pytest.raises(ResourceError, match=r"leaderboard.models.pgenrm_shipped.reward.judge runs on cuda"):
        check(recipe, "leaderboard")


def test_scaling_and_serve_reward_are_checked_before_they_start():
    scaling = load_recipe(ROOT / "recipes" / "scaling_grid.yaml", ["scaling.torch_threads=32"])
    with pytest.raises(ClusterFitError, match=r"^scaling.torch_threads: .*CPU 32 > the largest node's CPU 16"):
        check(scaling, "scaling", [{"CPU": 16.0}])
    check(load_recipe(ROOT / "recipes" / "scaling_grid.yaml"), "scaling", [{"CPU": 16.0}])
    serve = load_recipe(ROOT / "recipes" / "serve_reward.yaml", ["serve.replicas=3", "serve.num_gpus=1"])
    with pytest.raises(ClusterFitError, match=r"serve.num_gpus: 3 x 1\), the cluster has 2"):
        check(serve, "serve-reward", [{"CPU": 16.0, "GPU": 2.0}])
    with pytest.raises(ResourceError, match=r"serve.reward.judge runs on cuda.*serve.num_gpus is 0"):
        check(load_recipe(ROOT / "recipes" / "serve_reward.yaml", ["serve.reward.judge.device=cuda"]), "serve-reward")


def test_bon_phases_follow_the_driver_downstream_judge_first():
    phases = list(dict.fromkeys(g.phase for g in check(gpu_recipe("bon_sweep"), "bon")))
    names = list(gpu_recipe("bon_sweep").bon.reward_models)
    assert phases == ["bon generate", "bon score downstream", *[f"bon score {n}" for n in names]]


def test_a_colocated_rollout_shares_the_learner_ranks_bundles():
    """layout colocated: each learner rank's bundle also holds one engine (its CPUs added, the rank's GPU shared:
    the engine asks for rollout_num_gpus of it, the rank for the rest); the rollout group reserves nothing of its
    own, so the run needs the learner's GPUs only."""
    split = {g.role: g for g in check(gpu_recipe("ppo_personalized", *SPLIT), "train", kuberay_nodes())}
    recipe = gpu_recipe("ppo_personalized")   # colocated, 4 engines with 0.4 of their rank's GPU each
    groups = {g.role: g for g in check(recipe, "train", kuberay_nodes())}
    learner, rollout = groups["learner"], groups["rollout"]
    train = recipe.train
    assert learner.bundle == {"CPU": train.learner.num_cpus_per_worker + train.rollout_num_cpus, "GPU": 1.0}
    assert learner.options()["num_gpus"] == pytest.approx(0.6) and rollout.options()["num_gpus"] == 0.4
    assert rollout.colocated_with == "train.learner" and rollout.bundles == () and rollout.total() == {}
    gpus = sum(g.total().get("GPU", 0.0) for g in groups.values())
    assert gpus == sum(g.total().get("GPU", 0.0) for g in split.values()) - split["rollout"].total()["GPU"]
    cpu_recipe = load_recipe(ROOT / "recipes" / "grpo_tiny.yaml", ["train.layout=colocated"])
    [learner] = [g for g in declare(cpu_recipe, "train") if g.role == "learner"]
    assert learner.bundle == {"CPU": cpu_recipe.train.learner.num_cpus_per_worker + cpu_recipe.train.rollout_num_cpus}
