"""resolve_model: the tiny model builds offline, is cached and deterministic; smollm2 converts from its GGUF."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pr_rlhf.models.sources import ModelSourceError, resolve_model


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PR_RLHF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_tiny_builds_reloads_and_renders_chat(cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(resolve_model("tiny"))
    assert path.parent == cache / "models" and path.name.startswith("tiny-")
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 5_000_000
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hello there"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text).input_ids
    assert tok.decode(ids) == text  # byte-level BPE round-trips, special tokens are single ids
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
    # cached: a second call returns the same directory without rebuilding
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert Path(resolve_model("tiny")) == path and (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in (cache / "models").iterdir() if p.name.startswith(".tmp")]


def test_tiny_is_deterministic_across_caches(tmp_path, monkeypatch):
    paths = []
    for name in ("a", "b"):
        monkeypatch.setenv("PR_RLHF_CACHE", str(tmp_path / name))
        paths.append(Path(resolve_model("tiny")))
    assert paths[0].name == paths[1].name
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (paths[0] / f).read_bytes() == (paths[1] / f).read_bytes(), f


def test_tiny_overrides_and_parallel_builds(cache):
    spec = 'tiny:{"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128}'
    # Two processes race to build the same model: both get the same complete directory.
    code = "import sys; from pr_rlhf.models.sources import resolve_model; print(resolve_model(sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, spec], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] == resolve_model(spec)
    config = json.loads((Path(outs[0]) / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 64
    assert Path(outs[0]).name.startswith("tiny-custom-")
    assert not [p for p in (cache / "models").iterdir() if p.name.startswith(".tmp")]


RANK1_BUILD = """
import os, sys, torch.distributed as dist
from pathlib import Path
from transformers import AutoModelForCausalLM
from pr_rlhf.models.sources import resolve_model
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
if rank == 1:   # a learner rank other than 0 builds the cache first, as on a fresh machine
    path = Path(resolve_model('tiny:{"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128}'))
    AutoModelForCausalLM.from_pretrained(path)
    print(sorted(p.name for p in path.iterdir()))
dist.barrier()
"""


def test_a_rank_other_than_0_builds_a_whole_model(cache, tmp_path):
    """transformers' save_pretrained writes no weights on ranks other than 0 once torch.distributed is up: the
    cache's builder must not depend on it (a learner's rank 1 on a fresh machine cached a weightless folder)."""
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-c", RANK1_BUILD, str(rank), init], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    files = eval(outs[1][0].strip().splitlines()[-1])
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(files), files


def test_local_directory_and_refusals(tmp_path, monkeypatch):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    monkeypatch.delenv("PR_RLHF_ALLOW_HUB", raising=False)
    with pytest.raises(ModelSourceError, match="not reachable offline") as err:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert "'tiny'" in str(err.value) and "'smollm2'" in str(err.value)
    with pytest.raises(ModelSourceError, match="JSON object"):
        resolve_model("tiny:{bad json")
    monkeypatch.setenv("PR_RLHF_ALLOW_HUB", "1")
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_smollm2_converts_once_and_answers(cache, capfd):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(resolve_model("smollm2"))
    assert (path / "model.safetensors").is_file()
    # the dequantization's progress bar goes to the build log, not to the terminal (an actor's stderr is forwarded)
    assert "de-quantizing" in path.with_name(f"{path.name}.build.log").read_text()
    assert "de-quantizing" not in capfd.readouterr().err
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    assert getattr(model.config, "quantization_config", None) is None
    batch = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                    add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    assert "Paris" in tok.decode(out[0, batch["input_ids"].shape[1]:])
    assert resolve_model("smollm2") == str(path)


def test_tiny_genrm_corpus_is_registered_by_pgenrm():
    """The model sources cannot import P-GenRM: importing it registers tiny-genrm's chain corpus, and without it
    resolving tiny-genrm is a clear error naming the package to import (fresh processes: nothing imported yet)."""
    from pr_rlhf.models import sources

    resolve = "from pr_rlhf.models.sources import resolve_model; resolve_model('tiny-genrm')"
    alone = subprocess.run([sys.executable, "-c", resolve], capture_output=True, text=True, timeout=120)
    assert alone.returncode != 0
    assert "'tiny-genrm': its tokenizer corpus is not registered; import pr_rlhf.pgenrm" in alone.stderr
    probe = ("import pr_rlhf.pgenrm; from pr_rlhf.models import sources; "
             "print(sources._TOKENIZER_CORPORA['tiny-genrm'].__module__)")
    registered = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert registered.stdout.strip() == "pr_rlhf.pgenrm.tokenizer_corpus", registered.stderr
    with pytest.raises(ValueError, match="takes no registered tokenizer corpus"):
        sources.register_tokenizer_corpus("tiny", list)
    assert sources.registered_corpus("tiny") == []
