"""Sharded learner checkpoints (workers/learner/checkpoint.py, format v2) on Ray, 2 FSDP2 ranks over gloo: every
rank writes its own shard of the policy, critic, rebased reference and AdamW states (torch.distributed.checkpoint),
no file holds the whole model, the checkpoint loads the same at world size 1 (a plain module) and 2, the HF export
streams (one file or HF's sharded layout) and loads with transformers, and a v1 checkpoint still loads."""

import json

import pytest
import torch

from pr_rlhf.configs.learner import LearnerConfig
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.learner import LearnerGroup
from workers.learner import checkpoint as ckpt

# critic on, a KL reference that a warm start rebases (so the checkpoint holds all four kinds of state)
BASE = {"model": "tiny", "lr": 1e-3, "grad_clip": 1.0, "micro_batch_size": 2, "mini_batch_size": 4,
        "kl": {"coef": 0.05, "kind": "k3", "where": "loss"}, "critic": {"enabled": True, "lr": 2e-4},
        "num_cpus_per_worker": 0.25, "seed": 11}


def make_batch(seed: int, n: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"prompt_ids": [torch.randint(5, 3000, (int(k),), generator=g).tolist()
                           for k in torch.randint(2, 8, (n,), generator=g)],
            "response_ids": [torch.randint(5, 3000, (int(k),), generator=g).tolist()
                             for k in torch.randint(1, 6, (n,), generator=g)]}


def rl_step(group: LearnerGroup, seed: int) -> None:
    batch = make_batch(seed)
    adv = torch.linspace(-1, 1, 6)
    values = group.compute_values(batch)
    group.update_policy(dict(batch, old_logprobs=group.compute_logprobs(batch), advantages=adv))
    group.update_critic(dict(batch, values=values, returns=[[float(a)] * len(r)
                                                            for a, r in zip(adv, batch["response_ids"])]))


def probe(group: LearnerGroup) -> dict:
    """What a loaded learner must reproduce: policy weights, reference and critic outputs."""
    batch = make_batch(99)
    return {"policy": group.state_dict_for_rollout(), "ref": group.compute_ref_logprobs(batch),
            "values": group.compute_values(batch)}


def assert_same_weights(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"weights differ: {differ[:5]}"


@pytest.fixture(scope="module")
def saved(ray_cluster, tmp_path_factory):  # noqa: F811
    """A 2-rank learner after a warm start (rebased reference) and two RL steps: its checkpoint, its state at the
    save, and the state one more RL step later (what a correct resume must reach)."""
    root = tmp_path_factory.mktemp("sharded")
    with LearnerGroup(LearnerConfig(**BASE, strategy="fsdp2", world_size=2)) as two:
        two.update_sft(make_batch(1), lr=3e-3)
        two.rebase_reference()
        rl_step(two, 2)
        rl_step(two, 3)
        two.save_checkpoint(root / "ckpt", step=3, data_position={"index": 12})
        at_save = probe(two)
        rng = two.rng_sample()
        two.export_model(root / "export")
        import ray

        ray.get([w.export_model.remote(str(root / "export_sharded"), 1 << 20) for w in two.workers])
        rl_step(two, 4)
        after = two.state_dict_for_rollout()
    return {"root": root, "at_save": at_save, "rng": rng, "after": after}


def test_every_rank_writes_its_own_shard_and_no_file_holds_the_model(saved):
    from torch.distributed.checkpoint import FileSystemReader

    root = saved["root"] / "ckpt"
    meta = json.loads((root / "meta.json").read_text())
    assert meta["format"] == ckpt.CHECKPOINT_FORMAT and meta["world_size"] == 2
    assert meta["models"] == {"policy": {"optimizer": True, "hf_export": True},
                              "critic": {"optimizer": True, "hf_export": False},
                              "reference": {"optimizer": False, "hf_export": False}}
    assert sorted(p.name for p in (root / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert sorted(p.name for p in (root / "rng").iterdir()) == ["rank_0.pt", "rank_1.pt"]
    assert not list(root.rglob("optimizer.pt"))   # no consolidated optimizer state any more

    storage = FileSystemReader(str(root / "shards")).read_metadata().storage_data
    policy_bytes = sum(t.numel() * t.element_size() for t in saved["at_save"]["policy"].values())
    per_file: dict[str, int] = {}
    for index, info in storage.items():
        if index.fqn.startswith("policy.model."):
            per_file[info.relative_path] = per_file.get(info.relative_path, 0) + info.length
    assert sorted(per_file) == ["__0_0.distcp", "__1_0.distcp"]
    # each rank holds about half the policy (torch.save framing aside), neither holds all of it
    assert all(0.3 * policy_bytes < n < 0.75 * policy_bytes for n in per_file.values()), (per_file, policy_bytes)
    names = {index.fqn for index in storage}
    for kind in ("exp_avg", "exp_avg_sq"):
        assert f"policy.optimizer.state.model.layers.0.mlp.up_proj.weight.{kind}" in names
        assert any(n.startswith("critic.optimizer.state.") and n.endswith(kind) for n in names)
    assert any(n.startswith("reference.model.") for n in names)
    # the checkpoint's policy folder is the HF export of the weights at the save
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(root / "policy", dtype=torch.float32).state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in saved["at_save"]["policy"].items())


@pytest.mark.parametrize(("strategy", "world_size"), [("fsdp2", 2), ("none", 1)])
def test_loads_the_same_at_world_size_one_and_two(saved, strategy, world_size):
    """Weights bitwise; reference and critic outputs; the optimizer states: the next step from the loaded state
    reaches the saved learner's next step (a fresh AdamW would move every weight by about the learning rate)."""
    at_save = saved["at_save"]
    with LearnerGroup(LearnerConfig(**BASE, strategy=strategy, world_size=world_size)) as group:
        meta = group.load_checkpoint(saved["root"] / "ckpt")
        assert meta["step"] == 3 and meta["data_position"] == {"index": 12} and meta["world_size"] == 2
        loaded = probe(group)
        assert_same_weights(loaded["policy"], at_save["policy"])
        if world_size == 2:   # same ranks: the RNG streams continue; the outputs are bitwise the saved learner's
            assert group.rng_sample() == saved["rng"]
            assert torch.equal(loaded["ref"], at_save["ref"]) and torch.equal(loaded["values"], at_save["values"])
        else:
            torch.testing.assert_close(loaded["ref"], at_save["ref"], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(loaded["values"], at_save["values"], atol=2e-5, rtol=1e-5)
        rl_step(group, 4)
        after = group.state_dict_for_rollout()
    if world_size == 2:
        assert_same_weights(after, saved["after"])
    else:
        worst = max(float((after[k] - saved["after"][k]).abs().max()) for k in after)
        assert worst < 2e-5, worst
    assert max(float((after[k] - at_save["policy"][k]).abs().max()) for k in after) > 1e-4   # the step moved it


def test_the_streamed_export_loads_with_transformers(saved):
    from transformers import AutoModelForCausalLM

    full = saved["at_save"]["policy"]
    one = saved["root"] / "export"
    assert (one / "model.safetensors").is_file() and not (one / ckpt.WEIGHTS_INDEX).exists()
    assert (one / "config.json").is_file() and (one / "tokenizer.json").is_file()
    assert (one / "generation_config.json").is_file()
    sharded = saved["root"] / "export_sharded"   # files of at most 1 MiB (one larger tensor alone)
    index = json.loads((sharded / ckpt.WEIGHTS_INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == ckpt.export_file_names(len(files))
    assert not (sharded / "model.safetensors").exists()
    assert set(index["weight_map"]) == set(full)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in full.values())
    for folder in (one, sharded):
        assert_same_weights(ckpt.read_export(folder), full)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        state = model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in full.items())


def test_export_plan_keeps_files_under_the_limit():
    shapes = [("a", (10, 10), torch.float32), ("b", (300,), torch.float32), ("c", (5,), torch.bfloat16),
              ("d", (2,), torch.float32)]
    assert ckpt.plan_export_files(shapes, 1000) == [["a"], ["b"], ["c", "d"]]   # b (1200 B) alone
    assert ckpt.plan_export_files(shapes, 10**6) == [["a", "b", "c", "d"]]
    assert ckpt.export_file_names(1) == ["model.safetensors"]
    assert ckpt.export_file_names(2) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_a_checkpoint_of_another_format_is_refused_by_name(tmp_path):
    """Only the sharded format loads; an older full-file checkpoint or an unknown one fails naming the folder and
    both formats, before any rank reads a tensor."""
    for old in ("pr_rlhf-learner-v1", "pr_rlhf-learner-v0"):
        (tmp_path / "meta.json").write_text(json.dumps({"format": old, "models": {}}))
        with pytest.raises(ValueError, match=f"{tmp_path}: checkpoint format '{old}'; this learner reads "
                                             f"'{ckpt.CHECKPOINT_FORMAT}' only"):
            ckpt.read_checkpoint_meta(tmp_path)
