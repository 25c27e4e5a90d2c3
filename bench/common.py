"""What every benchmark script shares: an offline environment, the repository on ``sys.path``, the inputs a clean
clone has (the shipped P-GenRM, the pipeline recipe's world, a bench-owned output folder), a description of the
machine, and the machine-readable last line.

A benchmark's stdout always ends with one line

    BENCH <name> <key>=<value> ... config=<what was measured> baseline=<label: value> ours=<label: value> ratio=<x>

where a value holding spaces is quoted the shell's way (``shlex``) and ``ratio`` compares ours with the baseline
(higher is better). An optional part that fails is a ``<part>=failed:<reason>`` field of that line (its traceback
goes to stderr); a benchmark that fails as a whole still ends with its line (``failed=<reason> ratio=nan``) and
exits non-zero. ``bench/suite.py`` collects these lines into docs/results/bench.{json,md}.
"""
from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"                       # git-ignored: what the benchmarks build (shards, prototypes)
SHIPPED_GENRM = ROOT / "models" / "pgenrm_tiny"    # the trained P-GenRM a clean clone has
PGENRM_RECIPE = ROOT / "recipes" / "pgenrm_pipeline.yaml"   # the world and chain it was trained on
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled"}

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

T = TypeVar("T")
# CPU flags that decide which kernels torch and vLLM pick (reported next to every figure)
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "neon", "asimd")


@dataclass
class Result:
    """What one benchmark measured: the table row (``config``, ``baseline``, ``ours``, ``ratio``) and its own
    machine-readable ``fields`` (numbers first, then ``<part>=failed:<reason>`` of a failed optional part)."""

    name: str
    config: str
    baseline: str
    ours: str
    ratio: float
    fields: dict[str, object] = field(default_factory=dict)
    exit_code: int = 0

    def line(self) -> str:
        parts = {**self.fields, "config": self.config, "baseline": self.baseline, "ours": self.ours,
                 "ratio": fmt(self.ratio, ".2f")}
        return " ".join(["BENCH", self.name, *(f"{k}={shlex.quote(fmt(v))}" for k, v in parts.items())])


def fmt(value: object, spec: str = ".4g") -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, spec)
    return str(value)


def parse_line(line: str) -> dict | None:
    """A ``BENCH`` line as ``{"name", "fields"}`` (every value a string), else None."""
    if not line.startswith("BENCH "):
        return None
    try:
        tokens = shlex.split(line)
    except ValueError:
        return None
    if len(tokens) < 2:
        return None
    return {"name": tokens[1], "fields": dict(t.split("=", 1) for t in tokens[2:] if "=" in t)}


def last_bench_line(stdout: str) -> dict | None:
    """The parsed last non-empty line of a benchmark's stdout when it is its ``BENCH`` line, else None."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    return parse_line(lines[-1].strip()) if lines else None


def reason(exc: BaseException) -> str:
    """An exception in one short line (for a ``failed:<reason>`` field)."""
    text = " ".join(str(exc).split()) or "no message"
    return f"{type(exc).__name__}: {text}"[:200]


def optional_part(fields: dict[str, object], key: str, fn: Callable[[], T]) -> T | None:
    """``fn()``; when it raises: its traceback on stderr, ``fields[key] = "failed:<reason>"`` and None."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - an optional part's failure is reported in the BENCH line
        traceback.print_exc()
        fields[key] = f"failed:{reason(exc)}"
        print(f"{key} failed: {reason(exc)}", flush=True)
        return None


def by_size(fields: dict[str, object], sizes: list[str], measure: Callable[[str], T]) -> dict[str, T]:
    """``measure(size)`` for each size: the first is the benchmark's core (its failure fails the benchmark), the
    others optional parts (``size_<size>`` in ``fields`` when one fails, left out of the result)."""
    results = {sizes[0]: measure(sizes[0])}
    for size in sizes[1:]:
        measured = optional_part(fields, f"size_{size}", lambda s=size: measure(s))
        if measured is not None:
            results[size] = measured
    return results


def run(name: str, measure: Callable[[], Result]) -> None:
    """Run ``measure`` and end stdout with its ``BENCH`` line, also when it raises (then the traceback goes to
    stderr, the line says ``failed=<reason> ratio=nan`` and the process exits 1)."""
    try:
        result = measure()
    except Exception as exc:  # noqa: BLE001 - the BENCH line says what failed; stderr has the traceback
        traceback.print_exc()
        result = Result(name, config="", baseline="", ours="", ratio=float("nan"), fields={"failed": reason(exc)},
                        exit_code=1)
    sys.stderr.flush()
    print(result.line(), flush=True)
    sys.exit(result.exit_code)


def genrm_label(model_dir: str | Path) -> str:
    """A GenRM directory as the header and the table name it: its path, and for a shipped checkpoint the stage
    and recipe its MANIFEST.json records."""
    path = Path(model_dir)
    shown = str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)
    manifest = path / "MANIFEST.json"
    if manifest.is_file():
        meta = json.loads(manifest.read_text())
        return f"{shown} (shipped P-GenRM: {meta.get('stage')} stage of {meta.get('recipe')})"
    return shown


def machine() -> dict[str, object]:
    """The CPU model (with its x86 family/model numbers: a virtual machine's name may be generic), the flags that
    pick kernels, the cores this process may use, and whether it runs under a hypervisor."""
    info: dict[str, str] = {}
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text(errors="replace").splitlines() if cpuinfo.is_file() else []:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("flags", "Features"):
            flags = flags or set(value.split())
        elif value and key not in info:
            info[key] = value
    cpu = info.get("model name") or info.get("Model") or platform.processor() or platform.machine()
    if "cpu family" in info and "model" in info:
        cpu = f"{cpu} (family {info['cpu family']}, model {info['model']})"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "flags": [f for f in CPU_FLAGS if f in flags], "cores": cores, "arch": platform.machine(),
            "virtual": "hypervisor" in flags}


def machine_label(info: Mapping[str, object] | None = None) -> str:
    info = info or machine()
    flags = ", ".join(info.get("flags") or []) or "no AVX"
    return f"{info.get('cpu')}; {flags}; {info.get('cores')} cores{', VM' if info.get('virtual') else ''}"


def header(**parts: object) -> None:
    """The first lines of a benchmark's output: what it measures (model, data, sizes) and on which machine."""
    for key, value in parts.items():
        print(f"{key.replace('_', ' ')}: {value}", flush=True)
    print(f"machine: {machine_label()}; load average {os.getloadavg()[0]:.1f}", flush=True)
