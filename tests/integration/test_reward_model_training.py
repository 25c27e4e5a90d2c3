"""Bradley-Terry reward-model training on the learner ranks (``trains: reward_model``): the same steps on one
plain rank and on two FSDP2 ranks, learning a toy preference, checkpoint and resume, and the exported folder
scored by the ``scalar`` reward kind exactly as the learner scores it."""

import pytest
import torch

from pr_rlhf.configs.learner import LearnerConfig
from pr_rlhf.configs.reward import reward_config
from pr_rlhf.models.sources import resolve_model
from pr_rlhf.reward.scalar import ScalarRM, ScalarRMEncoder
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.learner import LearnerGroup

RM = {"model": "tiny", "trains": "reward_model", "lr": 1e-3, "weight_decay": 0.0, "micro_batch_size": 3,
      "num_cpus_per_worker": 0.25, "seed": 5}
WORDS = "rice stew soup bread pasta salad curry beans tea coffee".split()


def toy_pairs(n: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """The same answer with and without a closing 'thank you': the chosen one always has it."""
    encoder = ScalarRMEncoder.for_model(resolve_model("tiny"), 256)
    g = torch.Generator().manual_seed(seed)
    chosen, rejected = [], []
    for _ in range(n):
        words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (6,), generator=g)]
        prompt, answer = f"How do I cook {words[0]}?", " ".join(words[1:])
        chosen.append(encoder.encode_text(prompt, answer + ", thank you."))
        rejected.append(encoder.encode_text(prompt, answer + "."))
    return chosen, rejected


def train(group, steps: range) -> list[dict]:
    out = []
    for step in steps:
        chosen, rejected = toy_pairs(8, step)
        out.append(group.update_reward_model({"chosen_ids": chosen, "rejected_ids": rejected}))
    return out


def accuracy(group, chosen, rejected) -> float:
    return float((group.compute_rewards({"input_ids": chosen}) > group.compute_rewards({"input_ids": rejected}))
                 .float().mean())


@pytest.fixture(scope="module")
def trained(ray_cluster, tmp_path_factory):  # noqa: F811
    one = LearnerGroup(LearnerConfig(**RM, strategy="none", world_size=1))
    two = LearnerGroup(LearnerConfig(**RM, strategy="fsdp2", world_size=2))
    try:
        held_out = toy_pairs(24, 999)
        before = accuracy(one, *held_out)
        metrics = (train(one, range(12)), train(two, range(12)))
        folder = tmp_path_factory.mktemp("rm") / "model"
        two.export_model(folder)
        yield {"one": one, "two": two, "metrics": metrics, "held_out": held_out, "before": before,
               "folder": folder}
    finally:
        one.shutdown()
        two.shutdown()


def test_two_fsdp2_ranks_take_the_same_steps_as_one_and_learn_the_preference(trained):
    one_m, two_m = trained["metrics"]
    assert [m["rm/optimizer_steps"] for m in one_m] == [1.0] * 12
    for a, b in zip(one_m, two_m):   # a step is the same whatever the world size (loss normalized globally)
        assert a["rm/bt_loss"] == pytest.approx(b["rm/bt_loss"], abs=2e-4)
        assert a["rm/accuracy"] == b["rm/accuracy"]
    assert one_m[-1]["rm/bt_loss"] < 0.5 * one_m[0]["rm/bt_loss"]
    held_out = trained["held_out"]
    assert trained["before"] < 0.8   # the fresh head does not know the preference
    for group in (trained["one"], trained["two"]):
        assert accuracy(group, *held_out) >= 0.95
    torch.testing.assert_close(trained["one"].compute_rewards({"input_ids": held_out[0]}),
                               trained["two"].compute_rewards({"input_ids": held_out[0]}), atol=2e-3, rtol=1e-3)


def test_the_exported_folder_scores_as_the_learner_through_the_scalar_kind(trained):
    from transformers import AutoConfig

    from pr_rlhf.scorers import RewardRequest, ScalarScorer

    folder, (chosen, _) = trained["folder"], trained["held_out"]
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["Qwen2ForSequenceClassification"] and config.num_labels == 1
    rm = ScalarRM(reward_config(kind="scalar", scalar_rm={"model": str(folder)}).scalar_rm)
    learner = trained["two"].compute_rewards({"input_ids": chosen})
    torch.testing.assert_close(torch.tensor(rm.score_ids(chosen)), learner, atol=1e-4, rtol=1e-4)
    untrained = ScalarRM(reward_config(kind="scalar").scalar_rm)
    assert not torch.allclose(torch.tensor(untrained.score_ids(chosen)), learner, atol=1e-2)
    scorer = ScalarScorer(reward_config(kind="scalar", scalar_rm={"model": str(folder)}))
    scores = scorer.score([RewardRequest("a", "u", "How do I cook rice?", "stew soup tea, thank you."),
                           RewardRequest("b", "u", "How do I cook rice?", "stew soup tea.")])
    assert all(err is None for _, err in scores)


def test_checkpoint_resume_continues_exactly(ray_cluster, tmp_path):  # noqa: F811
    cfg = LearnerConfig(**RM, strategy="fsdp2", world_size=2)
    with LearnerGroup(cfg) as a:
        train(a, range(2))
        a.save_checkpoint(tmp_path / "ckpt", step=2)
        after = train(a, range(2, 4))
    assert (tmp_path / "ckpt" / "reward_model" / "model.safetensors").is_file()
    with LearnerGroup(cfg) as b:
        assert b.load_checkpoint(tmp_path / "ckpt")["step"] == 2
        resumed = train(b, range(2, 4))
    assert [m["rm/bt_loss"] for m in resumed] == pytest.approx([m["rm/bt_loss"] for m in after], abs=1e-6)
