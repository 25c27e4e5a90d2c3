"""One-step-off rollout's schedule (``workers.rl_loop.OneStepOff``) on real Ray actors: an engine that records what it
does and when. The next step's generation runs while the driver (the learner's update) works; the learner's weights
reach an engine only between its generations (a sync asked for while it generates waits for the generation to end);
each batch carries the version of the weights that drew it; a step nothing was launched for (the first, the first
after a resume) is drawn at once with the engine's weights. The engine is a stand-in (sleeps instead of decoding) so
that the overlap is measured on times the test controls; the real engines run this schedule in
tests/e2e/test_rl.py."""
import time

import pytest

from pr_rlhf.models.base import Generation, Sample, SamplingParams
from tests.ray_fixtures import ray_cluster  # noqa: F401  (a session-wide Ray cluster)
from workers.rl_loop import OneStepOff

GENERATE_S = 1.0


class RecordingEngine:
    """A rollout worker's two calls the schedule uses: ``generate`` (sleeps GENERATE_S) and a weight update."""

    def __init__(self) -> None:
        self.version = -1
        self.log: list[tuple] = []

    def generate(self, messages: list, params: SamplingParams) -> list[Generation]:
        self.log.append(("generate", params.seed, self.version, time.time()))
        time.sleep(GENERATE_S)
        self.log.append(("generated", params.seed, self.version, time.time()))
        return [Generation([Sample(f"{m} v{self.version}", [1], [-0.1])], [1]) for m in messages]

    def take_weights(self, version: int) -> None:
        self.log.append(("weights", version, None, time.time()))
        self.version = version

    def events(self) -> list[tuple]:
        return self.log


class Learner:
    """``push_weights`` as the learner group's: the call returns once every engine has the weights."""

    def push_weights(self, rollouts: list, version: int) -> None:
        import ray

        ray.get([r.take_weights.remote(version) for r in rollouts])


@pytest.mark.timeout(120)
def test_generation_overlaps_the_update_and_weights_land_between_rollouts(ray_cluster):  # noqa: F811
    import ray

    engines = [ray.remote(RecordingEngine).options(num_cpus=0.25).remote() for _ in range(2)]
    ray.get([e.events.remote() for e in engines])
    learner, prompts = Learner(), ["a", "b", "c", "d"]
    pipeline = OneStepOff(engines, version=-1)

    def params(step: int) -> SamplingParams:
        return SamplingParams(seed=step, logprobs=True)

    pipeline.sync(learner, 0)                          # run(): the engines start from the learner's weights
    gens, drawn_by = pipeline.take(0, prompts, params(0))
    assert drawn_by == 0 and [g.samples[0].text for g in gens] == ["a v0", "b v0", "c v0", "d v0"]
    pipeline.sync(learner, 0)                          # already there: no update
    pipeline.launch(1, prompts, params(1))
    start = time.time()
    time.sleep(GENERATE_S)                             # step 0's update, while step 1 generates
    gens, drawn_by = pipeline.take(1, prompts, params(1))
    overlapped = time.time() - start
    assert drawn_by == 0 and gens[0].samples[0].text == "a v0"     # one update stale
    assert overlapped < 1.7 * GENERATE_S, overlapped               # not update + generation one after the other

    pipeline.sync(learner, 1)
    pipeline.launch(2, prompts, params(2))
    pipeline.sync(learner, 2)                          # asked mid-generation (an evaluation): waits for it
    gens, drawn_by = pipeline.take(2, prompts, params(2))
    assert drawn_by == 1 and gens[0].samples[0].text == "a v1"
    gens, drawn_by = pipeline.take(3, prompts, params(3))         # nothing launched for it: drawn now
    assert drawn_by == 2 and gens[0].samples[0].text == "a v2"

    for log in ray.get([e.events.remote() for e in engines]):
        assert [(kind, a) for kind, a, _, _ in log] == [
            ("weights", 0), ("generate", 0), ("generated", 0), ("generate", 1), ("generated", 1), ("weights", 1),
            ("generate", 2), ("generated", 2), ("weights", 2), ("generate", 3), ("generated", 3)]
        drawn = {seed: version for kind, seed, version, _ in log if kind == "generate"}
        assert drawn == {0: 0, 1: 0, 2: 1, 3: 2}
    for e in engines:
        ray.kill(e)
