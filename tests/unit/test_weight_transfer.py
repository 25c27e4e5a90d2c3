"""The gloo weight transfer's protocol (``pr_rlhf.models.weight_transfer``), a sender and two receivers in threads of
this process (no Ray, no vLLM): the receivers end with the sender's weights; a sync that fails midway -- on the
sender (a tensor unlike the plan in the second bucket) or on one receiver (a shape it cannot load) -- leaves every
receiver with its previous weights, names the tensor and the member on every side, and the group still works."""
import threading

import pytest
import torch

from pr_rlhf.models import weight_transfer as wt
from workers.learner.ranks import free_port

BUCKET = 8 << 10   # several buckets for the model below (its matrices are 8 KiB each)


def model(rows: int = 64) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(rows, 32), torch.nn.Linear(32, 64), torch.nn.Linear(64, 32),
                               torch.nn.LayerNorm(32))


def plan_of(module: torch.nn.Module) -> wt.TransferPlan:
    return wt.TransferPlan.of((n, p.dtype, p.shape) for n, p in module.named_parameters())


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Group:
    """A sender and receivers joined in threads."""

    def __init__(self, receivers: list[torch.nn.Module]) -> None:
        port, n = free_port(), 1 + len(receivers)
        groups: list = [None] * n

        def join(rank: int) -> None:
            groups[rank] = wt.GlooGroup("127.0.0.1", port, rank, n, timeout_s=20)

        threads = [threading.Thread(target=join, args=(r,)) for r in range(n)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        self.sender = groups[0]
        self.receivers = []
        for module, group in zip(receivers, groups[1:]):
            receiver = wt.ModuleReceiver(module)
            receiver.group, receiver.bucket_bytes = group, BUCKET
            self.receivers.append(receiver)

    def sync(self, source: torch.nn.Module, fault: str | None = None) -> Exception | None:
        """One sync of ``source``'s parameters (``fault``: that tensor is sent with an extra row); returns the
        sender's error. Receivers end their session as the trainer engine has them do (finish either way)."""
        plan, error = plan_of(source), None

        def tensors():
            for name, p in source.named_parameters():
                yield name, (torch.cat([p, p[:1]]) if name == fault else p).detach()

        def receive(receiver: wt.ModuleReceiver) -> None:
            receiver.start()
            receiver.update(plan.as_dict())
            receiver.finish()

        threads = [threading.Thread(target=receive, args=(r,)) for r in self.receivers]
        [t.start() for t in threads]
        try:
            wt.send(self.sender, plan, tensors(), BUCKET)
        except wt.WeightTransferError as exc:
            error = exc
        [t.join() for t in threads]
        return error


def test_plan_buckets_keep_order_split_by_size_and_dtype_and_cross_as_plain_lists():
    plan = wt.TransferPlan(["a", "b", "c", "d", "e"], ["float32", "float32", "float32", "bfloat16", "bfloat16"],
                           [[4, 4], [4, 4], [100, 100], [2], [2]])
    assert plan.buckets(128) == [range(0, 2), range(2, 3), range(3, 5)]   # 64 + 64 B; c alone; a dtype change
    assert wt.TransferPlan.from_dict(plan.as_dict()) == plan
    assert all(type(v) is list for v in plan.as_dict().values())
    with pytest.raises(ValueError, match="2 names, 1 dtypes"):
        wt.TransferPlan(["a", "b"], ["float32"], [[1], [1]])


def test_receivers_end_with_the_senders_weights():
    torch.manual_seed(0)
    source, receivers = model(), [model(), model()]
    group = Group(receivers)
    assert len(plan_of(source).buckets(BUCKET)) >= 3
    assert group.sync(source) is None
    assert all(same(state(source), state(r)) for r in receivers)
    assert all(r.error is None for r in group.receivers)


def test_a_sender_failure_in_the_second_bucket_keeps_every_receivers_weights_and_the_group_works():
    torch.manual_seed(1)
    source, receivers = model(), [model(), model()]
    group = Group(receivers)
    before = [state(r) for r in receivers]
    faulty = plan_of(source).names[plan_of(source).buckets(BUCKET)[1].start]
    error = group.sync(source, fault=faulty)
    assert error is not None and f"member 0: bucket 2: {faulty}: the plan says" in str(error)
    assert all(same(b, state(r)) for b, r in zip(before, receivers))   # the first bucket had landed: rolled back
    assert all("the sender aborted at bucket 2" in r.error for r in group.receivers)
    assert group.sync(source) is None   # the next sync over the same group works
    assert all(same(state(source), state(r)) for r in receivers)


def test_a_receiver_that_cannot_load_a_tensor_fails_the_sync_for_everyone_and_is_named():
    torch.manual_seed(2)
    source = model()
    odd = model()
    odd[2] = torch.nn.Linear(64, 31)   # the second linear layer: another shape on receiver 2 only
    receivers = [model(), odd]
    group = Group(receivers)
    before = [state(r) for r in receivers]
    error = group.sync(source)
    assert error is not None and "member 2: loading 2.weight (32, 64)" in str(error)
    assert "member 1" not in str(error)
    assert all(same(b, state(r)) for b, r in zip(before, receivers))   # receiver 1 had loaded all: rolled back
    assert group.receivers[0].error is not None and "member 2" in group.receivers[0].error


def test_a_rank_takes_the_gpu_ray_gave_it_when_every_gpu_stays_visible():
    """RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES keeps every GPU visible in every actor: the rank must pick Ray's
    id for it (else every learner rank lands on cuda:0); without it Ray narrows the visible set to the actor's."""
    from workers.learner.ranks import cuda_index_for

    assert cuda_index_for({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, ["3"]) == 3
    assert cuda_index_for({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, [5, 6]) == 5
    assert cuda_index_for({}, ["3"]) is None   # Ray set CUDA_VISIBLE_DEVICES: the current device is the one
    assert cuda_index_for({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "0"}, ["3"]) is None
    assert cuda_index_for({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, []) is None   # outside Ray


def test_an_engine_of_dtype_auto_sends_its_resolved_dtype():
    """`dtype: auto` is what the model's config says: the engines report the dtype they hold, so the sync's wire
    dtype is a real one."""
    from pr_rlhf.models.hf_engine import HFEngine
    from pr_rlhf.models.sources import resolve_model

    engine = HFEngine(resolve_model("tiny"), dtype="auto", max_model_len=64)
    try:
        receivers, dtype, backend = engine.weight_receivers()
        assert (receivers, backend) == (1, "gloo") and dtype == str(engine.model.dtype).removeprefix("torch.")
        assert dtype in ("float32", "bfloat16", "float16")
        wt.TransferPlan.of([("w", dtype, (2, 2))]).buckets(1 << 20)   # a dtype torch knows
    finally:
        engine.close()
