"""Micro-benchmark: prometheus_client's text parser vs. vllm_watchdog.sources.exposition.

Usage: python bench/parse.py [PAYLOAD] [-n RUNS]

PAYLOAD defaults to tests/fixtures/vllm-0.32.0-metrics.txt, or to a synthetic vLLM-like payload
(rendered by prometheus_client) when that file is absent. Prints the median time per payload of
(a) the library parser, (b) our full `parse` and (c) the scraper's hot path: `iter_samples` plus
a dict lookup of the raw series text in a warm cache, with the ratios to the library.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_watchdog.sources.exposition import iter_samples, parse, parse_series

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"

_SECONDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
_SECONDS += [7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_TOKENS: list[float] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]
_HISTOGRAMS: dict[str, list[float]] = {
    "time_to_first_token_seconds": _SECONDS,
    "inter_token_latency_seconds": _SECONDS[2:],
    "time_per_output_token_seconds": _SECONDS[2:],
    "e2e_request_latency_seconds": _SECONDS[7:],
    "request_queue_time_seconds": _SECONDS[7:],
    "request_inference_time_seconds": _SECONDS[7:],
    "request_prefill_time_seconds": _SECONDS[7:],
    "request_decode_time_seconds": _SECONDS[7:],
    "request_prompt_tokens": _TOKENS,
    "request_generation_tokens": _TOKENS,
    "request_max_num_generation_tokens": _TOKENS,
    "request_params_max_tokens": _TOKENS,
    "request_params_n": [1, 2, 5, 10, 20],
    "iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
}


def synthetic_payload(model: str = "meta-llama/Llama-3.1-8B-Instruct") -> str:
    """Render a payload shaped like vLLM's /metrics (same names, labels and buckets)."""
    reg = CollectorRegistry()
    base = {"engine": "0", "model_name": model}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        Gauge(f"vllm:{name}", f"vLLM {name}.", list(base), registry=reg).labels(**base).set(0.25)
    info = {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True"}
    info |= {"gpu_memory_utilization": "0.9", "num_gpu_blocks": "27185", "swap_space": "4"}
    Gauge("vllm:cache_config_info", "Cache config.", list(info), registry=reg).labels(**info).set(1)
    for name in ("num_preemptions", "prompt_tokens", "generation_tokens", "prefix_cache_queries"):
        Counter(f"vllm:{name}", f"vLLM {name}.", list(base), registry=reg).labels(**base).inc(7)
    success = Counter("vllm:request_success", "Finished.", [*base, "finished_reason"], registry=reg)
    for reason in ("abort", "length", "stop"):
        success.labels(**base, finished_reason=reason).inc(3)
    for i, (name, buckets) in enumerate(_HISTOGRAMS.items()):
        hist = Histogram(f"vllm:{name}", f"vLLM {name}.", list(base), buckets=buckets, registry=reg)
        for k in range(40):
            hist.labels(**base).observe(buckets[(i + k) % len(buckets)] * 0.9)
    for name in ("python_gc_objects_collected", "python_gc_collections"):
        gc = Counter(name, "Python GC.", ["generation"], registry=reg)
        for gen in ("0", "1", "2"):
            gc.labels(gen).inc(1234)
    py = {"implementation": "CPython", "major": "3", "minor": "12", "version": "3.12.3"}
    Gauge("python_info", "Python platform information.", list(py), registry=reg).labels(**py).set(1)
    for name in ("virtual_memory_bytes", "resident_memory_bytes", "start_time_seconds"):
        Gauge(f"process_{name}", f"Process {name}.", registry=reg).set(1.7634e9)
    return generate_latest(reg).decode()


def median_seconds(fn: Callable[[], object], runs: int) -> float:
    """Median wall time of fn() over runs runs."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("payload", nargs="?", type=Path, default=None)
    ap.add_argument("-n", "--runs", type=int, default=51)
    args = ap.parse_args()
    path: Path | None = args.payload or (FIXTURE if FIXTURE.exists() else None)
    text = path.read_text() if path else synthetic_payload()
    source = str(path) if path else "synthetic vLLM-like payload (fixture absent)"

    cache: dict[str, tuple[str, dict[str, str]]] = {}

    def hot() -> object:
        out = []
        for raw, value, ts in iter_samples(text):
            entry = cache.get(raw)
            if entry is None:
                entry = cache[raw] = parse_series(raw)
            out.append((entry, value, ts))
        return out

    def library() -> object:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    nsamples = len(parse(text))
    hot()  # warm the cache
    lib = median_seconds(library, args.runs)
    full = median_seconds(lambda: parse(text), args.runs)
    hot_t = median_seconds(hot, args.runs)
    print(f"payload: {source}: {len(text.encode()) / 1000:.1f} kB, {nsamples} samples")
    print(f"median of {args.runs} runs, per payload:")
    for label, t in (("(a) prometheus_client", lib), ("(b) parse, cold", full)):
        print(f"  {label:<28}{t * 1e3:9.3f} ms  {t / lib:6.3f}x")
    print(f"  {'(c) iter_samples + cache':<28}{hot_t * 1e3:9.3f} ms  {hot_t / lib:6.3f}x")


if __name__ == "__main__":
    main()
