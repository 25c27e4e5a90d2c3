"""Config pieces shared by several sections of a recipe (engines, sampling, the scalar RM) and the strict base.

Pydantic only. Kept apart from :mod:`pr_rlhf.configs.recipe` so the section modules (``pr_rlhf.configs.reward``,
``pr_rlhf.rl``) can build on them while ``pr_rlhf.configs.recipe`` assembles the root recipe from all sections.

An engine is one of three members, chosen by ``backend`` (absent: ``hf``): :class:`HFEngineConfig`,
:class:`VLLMEngineConfig`, :class:`OpenAIEngineConfig`. Fields are typed :data:`EngineConfig` (the union);
code builds one with :func:`engine_config`, which chooses the member exactly as a recipe does.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, model_validator


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo in a recipe must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # What a section takes from the nearest enclosing section that declares it, when it leaves the field unset
    # (pr_rlhf.configs.inherit), and what it declares to the sections inside it (field -> whether their explicit
    # values must agree with its own).
    INHERITED: ClassVar[tuple[str, ...]] = ()
    DECLARES: ClassVar[Mapping[str, bool]] = {}

    def inherited_fields(self) -> tuple[str, ...]:
        """The fields this section inherits; a union member may narrow them by its values."""
        return self.INHERITED


@dataclass(frozen=True, eq=False)
class UnionKey:
    """What a :func:`tagged_union` is keyed by, kept in its annotation (pydantic ignores it) for code that walks the
    schema: the field ``key`` naming the member, the ``default`` member of a mapping without it, the ``members``."""

    key: str
    default: str
    members: Mapping[str, type[BaseModel]]

    def member(self, value: Any) -> type[BaseModel] | None:
        """The member a mapping selects (None: it names no member)."""
        name = value.get(self.key, self.default) if isinstance(value, Mapping) else self.default
        return self.members.get(name) if isinstance(name, str) else None


def tagged_union(members: Mapping[str, type[BaseModel]], key: str, default: str, what: str) -> Any:
    """The annotated union of ``members`` keyed by the field ``key``; a mapping without ``key`` is the ``default``
    member (old recipes omit it), a model instance is its own member."""

    def tag(value: Any) -> str | None:
        if isinstance(value, Mapping):
            return value.get(key, default)
        return getattr(value, key, None)

    choices = tuple(Annotated[cls, Tag(name)] for name, cls in members.items())
    return Annotated[Union[choices], Discriminator(   # a union of a runtime tuple of members
        tag, custom_error_type=f"invalid_{key}",
        custom_error_message=f"unknown {what} {key}: expected one of {', '.join(map(repr, members))}"),
        UnionKey(key, default, dict(members))]


def parser(union: Any) -> Callable[..., Any]:
    """``parse(**fields)``: the member of ``union`` that the fields select, validated."""
    adapter = TypeAdapter(union)

    def parse(**fields: Any) -> Any:
        return adapter.validate_python(fields)

    return parse


class EngineBase(StrictModel):
    """Which model answers, and through which backend: what every backend reads."""

    INHERITED: ClassVar[tuple[str, ...]] = ("seed",)

    backend: str
    model: str = Field("tiny", description="'tiny' (built from a config, tokenizer trained locally), 'smollm2' "
                                           "(shipped SmolLM2-135M-Instruct), a local directory, or (openai / "
                                           "networked machines only) a served or hub model name")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    max_model_len: int = Field(2048, ge=16)
    seed: int = 0


class HFEngineConfig(EngineBase):
    """transformers in this process."""

    backend: Literal["hf"] = "hf"
    device: str = "cpu"


def vllm_eager(device: str, enforce_eager: bool | None) -> bool:
    """Whether vLLM runs without CUDA graphs: as asked, else eager on CPU (no graphs there) and graphs on GPU."""
    return (not device.startswith("cuda")) if enforce_eager is None else enforce_eager


def vllm_weight_transfer(device: str, weight_transfer: str) -> str:
    """The weight-transfer backend a vLLM engine is built with: as asked, else nccl on GPU and gloo on CPU."""
    return weight_transfer if weight_transfer != "auto" else ("nccl" if device.startswith("cuda") else "gloo")


class VLLMEngineConfig(EngineBase):
    """Offline ``vllm.LLM`` in this process."""

    backend: Literal["vllm"] = "vllm"
    device: str = "cpu"
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = Field(
        False, description="GPU: build the engine with vLLM's sleep mode, so that it can free its KV cache and "
                           "offload its weights while a colocated learner updates (train.layout colocated sets "
                           "it); vLLM's CPU worker treats sleep as a no-op, so on CPU the engine is built without")
    enforce_eager: bool | None = Field(None, description="None: CUDA graphs on a GPU (faster decoding), eager on "
                                                         "CPU; True: no graphs (quicker start, less GPU memory)")
    weight_transfer: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="how a rollout engine receives the learner's weights (vLLM's weight-transfer API): "
                            "'auto' = nccl on GPU, gloo on CPU; 'gloo' on GPU stages each bucket through host "
                            "memory, for an engine sharing the learner's GPU (NCCL refuses two ranks on one device)")
    distributed_executor_backend: Literal["mp", "ray", "uni"] | None = Field(
        None, description="how vLLM runs its tensor-parallel workers. None: 'mp' when tensor_parallel_size > 1 "
                          "(worker processes on the GPUs of the process that builds the engine: a rollout or reward "
                          "actor holds all of them, on one node), else vLLM's own choice. 'ray' makes vLLM reserve "
                          "its GPUs from Ray itself: inside an actor (or placement group) that already holds them it "
                          "waits forever")

    @model_validator(mode="after")
    def _executor_fits_tp(self) -> VLLMEngineConfig:
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size > 1:
            raise ValueError(f"distributed_executor_backend 'uni' runs one GPU worker: tensor_parallel_size is "
                             f"{self.tensor_parallel_size} (use 'mp', or leave it unset)")
        return self

    def executor_backend(self) -> str | None:
        """The ``distributed_executor_backend`` to build ``vllm.LLM`` with (None: vLLM's default). Set explicitly
        for tensor parallelism: vLLM's default picks its Ray executor whenever Ray is initialized in the process,
        which in our actors means asking Ray for GPUs the actor already holds."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "mp" if self.tensor_parallel_size > 1 else None


class OpenAIEngineConfig(EngineBase):
    """An OpenAI-compatible HTTP server."""

    backend: Literal["openai"] = "openai"
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = Field("OPENAI_API_KEY", description="name of the environment variable holding the key "
                                                            "(the key itself never appears in a recipe or log)")
    concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    backoff_s: float = Field(0.5, ge=0)


ENGINE_MEMBERS: dict[str, type[EngineBase]] = {"hf": HFEngineConfig, "vllm": VLLMEngineConfig,
                                               "openai": OpenAIEngineConfig}
EngineConfig = tagged_union(ENGINE_MEMBERS, "backend", "hf", "engine")
engine_config: Callable[..., HFEngineConfig | VLLMEngineConfig | OpenAIEngineConfig] = parser(EngineConfig)


class GenerationConfig(StrictModel):
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1)


class ScalarRMConfig(StrictModel):
    model: str = Field("tiny", description="'tiny' or a local sequence-classification checkpoint directory")
    max_length: int = Field(8192, ge=16, description="inputs are truncated to this many tokens (PRB: 8192)")
    batch_size: int = Field(8, ge=1)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    label: int | None = Field(None, ge=0, description="a head with several outputs: the one that is the reward "
                                                      "(a one-output head needs none)")
    trust_remote_code: bool = Field(False, description="run modelling code the checkpoint ships (config.json "
                                                       "auto_map); off: such a checkpoint is refused")


def check_benchmark_accuracy(given: Mapping[str, float | str], names: Mapping[str, object], where: str) -> None:
    """A sweep's ``benchmark_accuracy``: numbers in [0, 1] or result files, naming only reward models of ``where``."""
    for name, value in given.items():
        if isinstance(value, float) and not 0.0 <= value <= 1.0:
            raise ValueError(f"benchmark_accuracy.{name}: {value} is not an accuracy in [0, 1]")
        if isinstance(value, str) and not (value.endswith(".json") or value.rpartition(":")[0].endswith(".json")):
            raise ValueError(f"benchmark_accuracy.{name}: {value!r} is neither a number nor "
                             "'path/result.json[:group]'")
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"benchmark_accuracy names {where} not in {where}: {unknown}")
