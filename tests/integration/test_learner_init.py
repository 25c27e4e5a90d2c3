"""Learner memory 1/N: with fsdp2 over 2 ranks and ``load_weights_on: rank0`` only rank 0 reads the weights; rank 1
builds on the meta device and receives its shards (and the non-persistent buffers) from rank 0. The models it ends
with (policy, frozen reference, critic with its freshly drawn value head) are the ones every rank loading the
whole model gets: same weights, same log-probs, values and reference log-probs."""
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.learner import LearnerGroup

ray = need("ray")
torch = need("torch")

BATCH = {"prompt_ids": [[1, 2, 3, 4], [5, 6, 7]], "response_ids": [[8, 9, 10], [11, 12]]}


def learner_outputs(load_weights_on: str) -> dict:
    cfg = {"model": "tiny", "world_size": 2, "strategy": "fsdp2", "device": "cpu", "num_cpus_per_worker": 0.25,
           "kl": {"coef": 0.1}, "critic": {"enabled": True}, "load_weights_on": load_weights_on, "seed": 3}
    with LearnerGroup(cfg) as learner:
        return {"state": learner.state_dict_for_rollout(), "logprobs": learner.compute_logprobs(BATCH),
                "ref": learner.compute_ref_logprobs(BATCH), "values": learner.compute_values(BATCH),
                "ranks": learner.describe()}


def test_rank0_loading_gives_every_rank_the_models_whole_loading_gives(ray_cluster):  # noqa: F811
    from_rank0, everywhere = learner_outputs("rank0"), learner_outputs("every_rank")
    assert from_rank0["state"].keys() == everywhere["state"].keys()
    for name, tensor in everywhere["state"].items():
        assert torch.equal(from_rank0["state"][name], tensor), name
    for key in ("logprobs", "ref", "values"):
        assert torch.equal(from_rank0[key], everywhere[key]), key
    assert all(r["reference"] and r["critic"] for r in from_rank0["ranks"])
    assert [r["read_weights"] for r in from_rank0["ranks"]] == [True, False]    # rank 1 built on meta
    assert [r["read_weights"] for r in everywhere["ranks"]] == [True, True]
