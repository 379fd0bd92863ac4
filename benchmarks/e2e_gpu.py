"""End to end on a GPU (written for the H200): time to first token with prefixes from L2 and L3
against recomputing them, with a model's layers computing while the cache loads.

    python benchmarks/e2e_gpu.py --models llama,nsa --out OUT_DIR [--smoke] [--trace FILE]

Two models on the loop of ``tiered_kv.ops.bench.e2e`` (L1PrefixCache over the model's paged pool, the
metadata and transfer halves, per-layer load waits):

- ``llama``: a Llama-3-8B-shaped transformers model (bf16, random weights made on the GPU, sdpa
  attention) whose decoder layers read and write the paged L1 pool;
- ``nsa``: DeepSeek-V3.2's NSA cache (61 layers, page 64, fp8 latent + indexer keys) with the
  per-layer stand-in of ``NSAStandIn``: the FLOPs of ``DeepSeekV32Flops`` for one GPU of an
  8-GPU deployment, as bf16 GEMMs whose rate per token count is measured in the same run.

For each model, with one L1 size: four tier setups (L1 only; L1 + L2; L1 + L2 + file L3 on the
local disk; L1 + L2 + Mooncake L3 with its segment held by a second process, TCP loopback), each
over the synthetic multi-turn chat (contexts up to about 30k tokens, more conversations than L1
holds) and a slice of the real conversation trace; a probe per context length that places a
prefix on one tier and times the request that reuses it; an overlap probe (load alone, compute
alone, both). In the same run: GEMM rates, a 1 GiB pinned host -> device copy, and the disk's
raw O_DIRECT read bandwidth. Every loaded page is checked against the page oracle.

Writes ``e2e_gpu_<model>.json`` (and a log) under ``--out``; prints a short table last.
Never imported by the library or the tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from tiered_kv.hierarchy import ControllerLimits
from tiered_kv.ops.bench.e2e import Stack, TierSetup, overlap_probe, serve, summarize, tier_probe
from tiered_kv.ops.bench.e2e_models import HFCausalLM, NSAStandIn, build_hf_llama, gemm_rates, llama3_8b_config
from tiered_kv.ops.bench.e2e_oracle import PageOracle
from tiered_kv.ops.plan import slot_bytes
from tiered_kv.ops.replay.workload import ChatWorkload, read_trace, synthetic_chat

SIZES = {
    # l1 / l2 in tokens (the same for both models); chat: clients x rounds; contexts of the probes.
    # chat_l3: clients x rounds of a chat whose conversations outgrow L1 + L2, so that L3 serves hits.
    "full": dict(l1_tokens=40_960, l2_tokens=65_536, clients=4, rounds=4, system=4096, turn=2560, answer=5120,
                 chat_l3=(12, 3), trace_requests=10, contexts=(4096, 8192, 16384, 32768), overlap=(8192, 8192)),
    "smoke": dict(l1_tokens=8192, l2_tokens=12_288, clients=2, rounds=2, system=1024, turn=512, answer=1024,
                  chat_l3=(10, 3), trace_requests=3, contexts=(2048, 4096), overlap=(2048, 2048)),
}
SUFFIX_TOKENS = 100  # a probe's new tokens: one page and a partial one
MAX_PROMPT = 32_768


def log(*parts: object) -> None:
    print(*parts, flush=True)


# --- measurements of the machine ----------------------------------------------------------------
def h2d_gbps(nbytes: int = 1 << 30) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(2):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 5
    del host, dev
    return nbytes / seconds / 1e9


def big_matmul_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 / ((time.perf_counter() - start) / 10) / 1e12


def disk_raw(root: Path, page_bytes: int) -> dict:
    from tiered_kv.ops.bench.raw_ceilings import file_ceiling

    return file_ceiling(f"file://{root}?workers=8", page_bytes=page_bytes, pages=max(64, (2 << 30) // page_bytes))


# --- Mooncake in a second process ----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mooncake:
    """A master on loopback and a segment holder process; ``url`` is a pure client's."""

    def __init__(self, segment: str) -> None:
        import mooncake

        from tiered_kv.backends.mooncake import MooncakeOptions
        from tiered_kv.ops.bench.segment_holder import SegmentHolder

        os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
        binary = Path(mooncake.__file__).with_name("mooncake_master")
        self.rpc, self.http, self.metrics = _free_port(), _free_port(), _free_port()
        self.log = open(tempfile.mktemp(prefix="mooncake-master-", suffix=".log"), "wb")
        self.master = subprocess.Popen(
            [str(binary), "--enable_http_metadata_server=true", "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc}",
             "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={self.http}",
             "--metrics_host=127.0.0.1", f"--metrics_port={self.metrics}"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (_answers(self.rpc) and _answers(self.http)):
            if self.master.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"mooncake_master did not start (exit {self.master.poll()})")
            time.sleep(0.05)
        base = (f"mooncake://127.0.0.1:{self.rpc}?metadata_server=http://127.0.0.1:{self.http}/metadata"
                f"&protocol=tcp&local_hostname=127.0.0.1&timeout_s=60")
        self.holder = SegmentHolder(MooncakeOptions.from_url(f"{base}&global_segment_bytes={segment}")).start()
        self.url = f"{base}&contribute_segment=false"

    def close(self) -> None:
        holder = getattr(self, "holder", None)
        if holder is not None:
            holder.stop()
        if self.master.poll() is None:
            self.master.terminate()
            try:
                self.master.wait(10)
            except subprocess.TimeoutExpired:
                self.master.kill()
        self.log.close()


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


# --- workloads -----------------------------------------------------------------------------------
def chat_prompts(size: dict, clients: int | None = None, rounds: int | None = None) -> list[np.ndarray]:
    work = ChatWorkload(clients=clients or size["clients"], rounds=rounds or size["rounds"], system_tokens=size["system"],
                        turn_tokens=size["turn"], answer_tokens=size["answer"], rate=1.0, seed=42)
    return [r.tokens() for r in synthetic_chat(work)]


def trace_prompts(path: str, count: int) -> list[np.ndarray]:
    requests = [r for r in read_trace(path, limit=20 * count) if r.input_length <= MAX_PROMPT]
    return [r.tokens() for r in requests[:count]]


def random_tokens(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 120_000, count, dtype=np.uint32)


# --- one model -----------------------------------------------------------------------------------
def build_model(name: str, smoke: bool, device: str):
    """The model; on a CPU (a dry run of this script) a narrow one of the same kind."""
    from tiered_kv.ops.bench.e2e_models import DeepSeekV32Flops

    narrow = device == "cpu"
    if name == "llama":
        layers = 4 if smoke else 32
        config = llama3_8b_config(num_hidden_layers=layers, **(dict(hidden_size=128, intermediate_size=256,
                                                                      num_attention_heads=4, num_key_value_heads=2,
                                                                      head_dim=32, vocab_size=1000) if narrow else {}))
        model = build_hf_llama(config, device, torch.float32 if narrow else torch.bfloat16)
        return HFCausalLM(model, page_size=64), f"llama-3-8b-shaped ({layers} layers, bf16, sdpa)"
    flops = DeepSeekV32Flops(hidden=128, heads=2, index_heads=2, q_lora=64, expert_ffn=64) if narrow else DeepSeekV32Flops()
    return NSAStandIn(device, num_layers=8 if smoke else 61, flops=flops), "deepseek-v3.2 NSA + stand-in (per GPU of 8)"


def tier_setups(l2_pages: int, l3_dir: Path, l3_bytes: int, mooncake: Mooncake | None) -> list[TierSetup]:
    setups = [TierSetup("l1", 0), TierSetup("l1+l2", l2_pages),
              TierSetup("l1+l2+l3-file", l2_pages, f"file://{l3_dir}?capacity_bytes={l3_bytes}&workers=16&fsync=false")]
    if mooncake is not None:
        setups.append(TierSetup("l1+l2+l3-mooncake", l2_pages, mooncake.url))
    return setups


def reset_l3(setup: TierSetup, l3_dir: Path) -> None:
    if setup.l3_url and setup.l3_url.startswith("file://"):
        shutil.rmtree(l3_dir, ignore_errors=True)
        l3_dir.mkdir(parents=True)


def run_model(name: str, args, size: dict, calibration: dict, mooncake: Mooncake | None, out: dict) -> None:
    device = args.device
    model, label = build_model(name, args.smoke, device)
    spec = model.spec
    page = spec.page_size
    l1_pages, l2_pages = size["l1_tokens"] // page, size["l2_tokens"] // page
    record_per_token = slot_bytes(spec) / page
    oracle = PageOracle(spec, device)
    from tiered_kv import HostPool

    t0 = time.perf_counter()
    host = HostPool(spec, l2_pages, "page_first")
    result: dict = {"label": label, "spec": spec.describe(), "bytes_per_token": spec.bytes_per_token,
                    "stored_bytes_per_token": record_per_token, "l1_tokens": l1_pages * page,
                    "l2_tokens": l2_pages * page, "host_pool_s": time.perf_counter() - t0}
    out["models"][name] = result
    l3_dir = Path(args.l3_dir) / name
    l3_bytes = int(args.l3_gib * 2 ** 30)
    setups = tier_setups(l2_pages, l3_dir, l3_bytes, mooncake)
    # L3 -> L2 reads in flight: read_workers batches of batch_pages pages.
    limits = ControllerLimits(read_workers=args.l3_read_workers, write_workers=4, batch_pages=8)
    try:
        # Warm up: kernels compiled, cuBLAS handles made, Triton copy kernels built.
        warm = Stack(model, setups[1], l1_pages=l1_pages, device=device, oracle=oracle, host_pool=host, limits=limits,
                     model_name=f"warm-{name}")
        tier_probe(warm, "l2", random_tokens(900, 2048), (random_tokens(901, 64), random_tokens(902, 64)))
        warm.close()
        # Probes: a prefix on each tier against recomputing it.
        probes: dict = {"contexts": list(size["contexts"]), "ttft_s": {}, "records": {}}
        for setup in (setups if "probes" in args.sections else ()):
            if args.probe_setups and setup.name not in args.probe_setups.split(","):
                continue
            reset_l3(setup, l3_dir)
            tier = {"l1": "none", "l1+l2": "l2"}.get(setup.name, "l3")
            stack = Stack(model, setup, l1_pages=l1_pages, device=device, oracle=oracle, host_pool=host, limits=limits,
                          model_name=f"probe-{name}-{setup.name}")
            try:
                for i, context in enumerate(size["contexts"]):
                    prefix = random_tokens(1000 + i, context - SUFFIX_TOKENS)
                    first, second, _ = tier_probe(stack, tier, prefix, (random_tokens(2000 + i, SUFFIX_TOKENS),
                                                                         random_tokens(3000 + i, SUFFIX_TOKENS)))
                    label_tier = "recompute" if tier == "none" else setup.name
                    probes["ttft_s"].setdefault(label_tier, []).append(second.ttft_s)
                    probes["records"].setdefault(label_tier, []).append({"first": asdict(first), "second": asdict(second)})
                    log(f"[{name}] probe {label_tier:<18} {context:>6} tokens: ttft {second.ttft_s * 1e3:8.1f} ms "
                        f"(first {first.ttft_s * 1e3:8.1f} ms) hits l1/l2/l3 {second.l1_pages}/{second.l2_pages}/"
                        f"{second.l3_pages} wait {second.wait_ms:.1f} ms load {second.load_ms:.1f} ms "
                        f"l3 {second.l3_read_bytes / max(second.l3_read_s, 1e-9) / 1e9:.2f} GB/s wrong {second.wrong_pages}")
            finally:
                stack.close()
        result["probes"] = probes
        # Overlap: the load beside the model's compute, for a shape whose compute per layer exceeds the load's.
        stack = Stack(model, setups[1], l1_pages=l1_pages, device=device, oracle=oracle, host_pool=host, limits=limits,
                      model_name=f"overlap-{name}")
        try:
            prefix_tokens, suffix_tokens = size["overlap"]
            # The first round meets every shape once; the second is kept.
            for round_ in range(2 if "overlap" in args.sections else 0):
                result["overlap"] = overlap_probe(stack, random_tokens(5000 + 10 * round_, prefix_tokens),
                                                  [random_tokens(5001 + 10 * round_ + i, suffix_tokens) for i in range(4)],
                                                  index=10 * round_)
            o = result.get("overlap")
            if o:
                log(f"[{name}] overlap: load {o['load_ms']:.1f} ms, compute {o['compute_ms']:.1f} ms, both {o['both_ms']:.1f} ms "
                    f"-> hidden {o['hidden_share']}; per layer load {o['load_per_layer_ms']:.3f} compute "
                    f"{o['compute_per_layer_ms']:.3f}")
        finally:
            stack.close()
        # Workloads through each setup, the same L1.
        workloads = {"chat": chat_prompts(size), "chat-l3": chat_prompts(size, *size["chat_l3"])}
        if args.trace:
            workloads["trace"] = trace_prompts(args.trace, size["trace_requests"])
        workloads = {k: v for k, v in workloads.items() if k in args.workloads.split(",")} if "workloads" in args.sections else {}
        result["workloads"] = {}
        for wname, prompts in workloads.items():
            result["workloads"][wname] = {"prompts": len(prompts), "max_tokens": max(map(len, prompts)), "setups": {}}
            for setup in setups:
                reset_l3(setup, l3_dir)
                stack = Stack(model, setup, l1_pages=l1_pages, device=device, oracle=oracle, host_pool=host, limits=limits,
                              model_name=f"{wname}-{name}-{setup.name}")
                start = time.perf_counter()
                try:
                    records = serve(stack, prompts)
                finally:
                    stack.close()
                summary = summarize(records, page)
                summary["wall_s"] = time.perf_counter() - start
                summary["per_request"] = [{"tokens": r.tokens, "ttft_s": r.ttft_s, "l1": r.l1_pages, "l2": r.l2_pages,
                                           "l3": r.l3_pages, "computed": r.computed_pages, "wait_ms": r.wait_ms,
                                           "forward_ms": r.forward_ms, "load_ms": r.load_ms} for r in records]
                result["workloads"][wname]["setups"][setup.name] = summary
                log(f"[{name}] {wname:<5} {setup.name:<18} ttft p50 {summary['ttft_p50_s'] * 1e3:8.1f} ms p90 "
                    f"{summary['ttft_p90_s'] * 1e3:8.1f} ms rps {summary['requests_per_s']:.2f} hits {summary['hit_tokens']} "
                    f"wrong {summary['pages_wrong']} / {summary['pages_verified']} wall {summary['wall_s']:.1f} s")
        result["targets"] = targets(result, calibration, record_per_token)
    finally:
        host.close()
        shutil.rmtree(l3_dir, ignore_errors=True)
        del model
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def targets(result: dict, calibration: dict, record_per_token: float) -> dict:
    """The issue's targets for one model, from this run's numbers."""
    probes = result["probes"]
    contexts = probes["contexts"]
    ttft = probes["ttft_s"]
    out: dict = {}
    recompute = ttft.get("recompute", [])
    if recompute and "l1+l2" in ttft:
        out["l2_over_recompute"] = [l2 / rc for l2, rc in zip(ttft["l1+l2"], recompute)]
        out["l2_over_recompute_at_longest"] = out["l2_over_recompute"][-1]
    # Crossover: the read bandwidth at which loading a prefix takes as long as recomputing it.
    out["crossover_gbps"] = [c * record_per_token / rc / 1e9 for c, rc in zip(contexts, recompute)]
    raw = calibration.get("disk", {}).get("raw_get_gbps")
    file_records = probes["records"].get("l1+l2+l3-file", [])
    reads = [(r["second"]["l3_read_bytes"], r["second"]["l3_read_s"]) for r in file_records if r["second"]["l3_read_bytes"]]
    if reads:
        got = [b / s / 1e9 for b, s in reads]
        out["l3_file_read_gbps"] = got
        if raw:
            out["l3_file_over_raw_disk"] = [g / raw for g in got]
            out["l3_file_over_raw_disk_at_longest"] = got[-1] / raw
    overlap = result.get("overlap", {})
    if overlap:
        out["overlap_hidden_share"] = overlap["hidden_share"]
        out["overlap_load_shorter_than_compute_per_layer"] = overlap["load_per_layer_ms"] < overlap["compute_per_layer_ms"]
    wrong = sum(s["pages_wrong"] for w in result.get("workloads", {}).values() for s in w["setups"].values())
    verified = sum(s["pages_verified"] for w in result.get("workloads", {}).values() for s in w["setups"].values())
    for recs in probes["records"].values():
        for r in recs:
            wrong += r["second"]["wrong_pages"] + r["first"]["wrong_pages"]
            verified += r["second"]["verified_pages"] + r["first"]["verified_pages"]
    wrong += overlap.get("wrong_pages", 0)
    verified += overlap.get("verified_pages", 0)
    out["pages_verified"], out["pages_wrong"] = verified, wrong
    return out


# --- the report: merged JSON, a plot, a markdown table --------------------------------------------
def report(in_dir: Path, json_out: Path, plot_out: Path) -> str:
    """Merge ``e2e_gpu_<model>.json`` files into one, draw TTFT by context length per tier, and
    return the markdown tables."""
    merged: dict = {}
    for path in sorted(in_dir.glob("e2e_gpu_*.json")):
        part = json.loads(path.read_text())
        models = part.pop("models")
        if not merged:
            merged = {**part, "models": {}}
        merged["models"].update(models)
    json_out.write_text(json.dumps(merged, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, m in merged["models"].items() if "probes" in m]
    fig, axes = plt.subplots(1, len(names), figsize=(6.2 * len(names), 4.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        model = merged["models"][name]
        probes = model["probes"]
        for tier, values in probes["ttft_s"].items():
            ax.plot(probes["contexts"], [v * 1e3 for v in values], marker="o", label=tier)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens (prefix reused + 100 new)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_title(model["label"], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"TTFT by context length, prefix on each tier ({merged['hardware']['gpu']}, {merged['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(plot_out, dpi=110)
    lines = []
    for name, model in merged["models"].items():
        if "workloads" not in model:
            lines.append(f"{name}: {model.get('error', 'no result')}")
            continue
        lines.append(f"\n{model['label']}: L1 {model['l1_tokens']:,} tokens, L2 {model['l2_tokens']:,} tokens\n")
        lines.append("| workload | tiers | TTFT p50 | TTFT p90 | req/s | hit tokens L1 / L2 / L3 | computed "
                     "| wait / compute (GPU s) | pages verified / wrong |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for wname, work in model["workloads"].items():
            for sname, s in work["setups"].items():
                hits = s["hit_tokens"]
                lines.append(f"| {wname} ({work['prompts']}) | {sname} | {s['ttft_p50_s'] * 1e3:,.0f} ms | "
                             f"{s['ttft_p90_s'] * 1e3:,.0f} ms | {s['requests_per_s']:.2f} | {hits['l1']:,} / {hits['l2']:,} / "
                             f"{hits['l3']:,} | {s['computed_tokens']:,} | {s['wait_ms'] / 1e3:.2f} / "
                             f"{s['compute_ms'] / 1e3:.2f} | {s['pages_verified']:,} / {s['pages_wrong']} |")
        probes = model["probes"]
        lines.append("\n| prompt tokens | " + " | ".join(probes["ttft_s"]) + " |")
        lines.append("|---|" + "---|" * len(probes["ttft_s"]))
        for i, c in enumerate(probes["contexts"]):
            lines.append(f"| {c:,} | " + " | ".join(f"{v[i] * 1e3:,.1f} ms" for v in probes["ttft_s"].values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,nsa")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="small sizes: checks that everything runs")
    parser.add_argument("--trace", default=None, help="Mooncake-format trace (JSONL) for the trace workload")
    parser.add_argument("--l3-dir", default=str(Path.cwd() / ".e2e-l3"), help="file L3's directory (local disk)")
    parser.add_argument("--l3-gib", type=float, default=24.0, help="file L3's capacity per model")
    parser.add_argument("--mooncake-segment", default="32GiB", help="the segment holder's memory ('' : no Mooncake)")
    parser.add_argument("--sections", default="probes,overlap,workloads", help="which parts run (comma-separated)")
    parser.add_argument("--probe-setups", default="", help="which tier setups the probes run (default: all)")
    parser.add_argument("--l3-read-workers", type=int, default=8, help="the L3 controller's batches of reads in flight")
    parser.add_argument("--workloads", default="chat,chat-l3,trace", help="which workloads run (comma-separated)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the whole script with narrow models")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="no run: merge DIR/e2e_gpu_*.json into --out (a JSON file), plot beside it, print tables")
    args = parser.parse_args(argv)
    if args.report:
        json_out = Path(args.out)
        print(report(Path(args.report), json_out, json_out.with_name(json_out.stem + "_ttft.png")))
        return 0
    size = SIZES["smoke" if args.smoke else "full"]
    if args.device == "cuda":
        # cuDNN attention builds a graph per sequence length: each new prompt length cost hundreds of
        # ms in its first call (H200, 2026-12-05 smoke run); flash / memory-efficient attention do not.
        torch.backends.cuda.enable_cudnn_sdp(False)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    gpu = torch.cuda.get_device_properties(0) if args.device == "cuda" else None

    started = datetime.now(timezone.utc)
    calibration: dict = {}
    Path(args.l3_dir).mkdir(parents=True, exist_ok=True)
    calibration["disk"] = disk_raw(Path(args.l3_dir), 8 << 20)
    if gpu is not None:
        calibration["h2d_gbps"] = h2d_gbps()
        calibration["matmul_8192_tflops"] = big_matmul_tflops()
        calibration["gemm_7168_tflops"] = {str(k): v for k, v in gemm_rates("cuda", (64, 256, 1024, 4096, 8192, 32768)).items()}
    log("calibration:", json.dumps(calibration))
    mooncake = None
    mooncake_note = "not asked for"
    if args.mooncake_segment:
        from tiered_kv.errors import TieredKVError

        try:
            mooncake = Mooncake(args.mooncake_segment)
            mooncake_note = "master + segment holder process on loopback (TCP)"
        except (ImportError, OSError, RuntimeError, TieredKVError) as exc:  # the report says so; the rest runs
            mooncake_note = f"not run: {type(exc).__name__}: {exc}"
            log("mooncake", mooncake_note)
    for name in args.models.split(","):
        out = {"date": started.strftime("%Y-%m-%d %H:%M UTC"),
               "hardware": {"gpu": gpu.name if gpu else "none (cpu dry run)",
                            "gpu_memory_gib": gpu.total_memory / 2 ** 30 if gpu else 0, "cpus": os.cpu_count(),
                            "torch": torch.__version__, "transformers": transformers.__version__,
                            "python": platform.python_version()},
               "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
               "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in size.items()},
               "calibration": calibration, "mooncake": mooncake_note, "models": {}}
        try:
            run_model(name, args, size, calibration, mooncake, out)
        except Exception:  # one model's failure goes into its JSON, and the next model still runs
            out["error"] = traceback.format_exc()
            log(out["error"])
        (out_dir / f"e2e_gpu_{name}.json").write_text(json.dumps(out, indent=1))
        log(f"[{name}] targets:", json.dumps(out["models"].get(name, {}).get("targets")))
    if mooncake is not None:
        mooncake.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
