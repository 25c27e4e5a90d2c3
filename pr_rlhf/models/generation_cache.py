"""An on-disk cache of generations, so that a rerun or a resumed run never pays for a request twice (the P-GenRM
teacher's chains and the PR judge's grades: each costs a call to a served model).

A generation is keyed by sha256 of (engine identity, prompt, sampling parameters: n, temperature, top-p,
max tokens, stop, seed). The identity names the model and where it is served, never the key or timeouts
(:func:`engine_identity`): a model retrained in place under the same path or name is not noticed, so give the new
one a new name or delete the cache. The file is JSON lines, appended after every chunk of requests (a killed run
keeps every chunk it finished); failed requests are never cached. A line that does not decode (a run killed
mid-write) is skipped and counted.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pr_rlhf.decoding import decode, find_bad_text
from pr_rlhf.models.base import Engine, Generation, Prompt, Sample, SamplingParams

IDENTITY_FIELDS = ("backend", "model", "base_url", "dtype")


def engine_identity(cfg: Any) -> dict:
    """What makes two engine configs give the same answers: backend, model, served URL, dtype."""
    return {k: getattr(cfg, k) for k in IDENTITY_FIELDS if getattr(cfg, k, None) is not None}


def generation_key(identity: dict, prompt: Prompt, params: SamplingParams) -> str:
    sampling = {k: v for k, v in asdict(params).items() if k != "logprobs"}
    blob = json.dumps([identity, prompt, sampling], sort_keys=True, ensure_ascii=False, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0                # prompts answered from the cache
    requests: int = 0            # prompts sent to the engine
    failed: int = 0              # of those, failed (not cached)
    prompt_tokens: int = 0       # of the sent prompts: the server's usage count, else the returned token ids
    completion_tokens: int = 0
    unreadable_lines: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class CachedEngine:
    """``engine`` behind a :class:`GenerationCache` file: cached prompts are answered from it, the rest are sent
    in chunks of ``chunk`` prompts and appended after each chunk."""

    def __init__(self, engine: Engine, path: str | Path, identity: dict, chunk: int = 64):
        self.engine = engine
        self.name = f"cached:{getattr(engine, 'name', 'engine')}"
        self.path = Path(path)
        self.identity = identity
        self.chunk = max(int(chunk), 1)
        self.stats = CacheStats()
        self._entries: dict[str, dict] = {}
        self.unreadable: list[str] = []   # "line N: why" of each cached line not used (its prompt is sent again)
        if self.path.is_file():
            self._read(self.path.read_bytes())

    def _read(self, data: bytes) -> None:
        """Every readable line; one that is not (torn by a crash, undecodable bytes, bad text) is counted and named,
        never repaired: its prompt is simply generated again."""
        start = 0
        for number, raw in enumerate(data.split(b"\n"), 1):
            line_start, start = start, start + len(raw) + 1
            if not raw.strip():
                continue
            text, _ = decode(raw)
            why = None
            try:
                entry = json.loads(text)
                found = find_bad_text(entry, text, line_start, unit=None)
                if found is not None:
                    why = f"field {found[0]!r}: {found[1]}"
                else:
                    self._entries[entry["key"]] = entry
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                why = f"not a cache entry ({type(exc).__name__})"
            if why is not None:
                self.stats.unreadable_lines += 1
                self.unreadable.append(f"{self.path}: line {number}: {why}")

    def __len__(self) -> int:
        return len(self._entries)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        keys = [generation_key(self.identity, p, params) for p in prompts]
        out: list[Generation | None] = [None] * len(prompts)
        missing: list[int] = []
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in self._entries:
                out[i] = _generation(self._entries[key])
                self.stats.hits += 1
            elif key not in first:
                first[key] = i
                missing.append(i)
        for chunk in _chunks(missing, self.chunk):
            billed = dict(getattr(self.engine, "usage", None) or {})
            gens = self.engine.generate([prompts[i] for i in chunk], params)
            usage = getattr(self.engine, "usage", None) or {}
            new = []
            counted = {"prompt_tokens": 0, "completion_tokens": 0}
            for i, gen in zip(chunk, gens):
                out[i] = gen
                self.stats.requests += 1
                if gen.error is not None:
                    self.stats.failed += 1
                    continue
                counted["prompt_tokens"] += len(gen.prompt_token_ids or ())
                counted["completion_tokens"] += sum(len(s.token_ids) for s in gen.samples)
                entry = {"key": keys[i], "prompt_token_ids": gen.prompt_token_ids,
                         "samples": [{"text": s.text, "token_ids": list(s.token_ids),
                                      "finish_reason": s.finish_reason} for s in gen.samples]}
                self._entries[keys[i]] = entry
                new.append(entry)
            for key, value in counted.items():   # the server's own count (usage) where it gives one
                reported = usage.get(key, 0) - billed.get(key, 0)
                setattr(self.stats, key, getattr(self.stats, key) + (reported if reported > 0 else value))
            if new:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in new))
        for i, key in enumerate(keys):   # a prompt given twice in one call: the answer of its first copy
            if out[i] is None:
                out[i] = out[first[key]]
        return out  # type: ignore[return-value]

    def score_continuations(self, prefix: Prompt, continuations: list[str]) -> list[float]:
        return self.engine.score_continuations(prefix, continuations)

    def close(self) -> None:
        self.engine.close()


def _generation(entry: dict) -> Generation:
    return Generation(samples=[Sample(s["text"], list(s.get("token_ids") or ()), None, s.get("finish_reason", "stop"))
                               for s in entry["samples"]], prompt_token_ids=entry.get("prompt_token_ids"))


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
