"""What draft_schedule writes is what vLLM 0.32 reads: its own schedule validator and dense lookup, and its
SpeculativeConfig refusing `disable_by_batch_size`, run in vLLM's venv (no server: about 7 CPU-seconds)."""

from __future__ import annotations

import json
import subprocess

from tests.support.perturbed import vllm_python
from vllm_watchdog.actions.runtimes.speculative import FLAG, SCHEDULE_KEY, read_config, with_schedule
from vllm_watchdog.sources.specranges import schedule_from_text

CHECK = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
from vllm.config.speculative import SpeculativeConfig
config = json.loads(sys.argv[1])
out = {"lookup": build_dynamic_sd_schedule_lookup(config["num_speculative_tokens_per_batch_size"], 70, 4)}
for bad in ([[2, 7, 4]], [[1, 7, 4], [5, 9, 0]]):
    try:
        build_dynamic_sd_schedule_lookup(bad, 70, 4)
    except ValueError as exc:
        out.setdefault("refused", []).append(str(exc))
try:
    SpeculativeConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_max=4, disable_by_batch_size=8)
except Exception as exc:
    out["removed"] = type(exc).__name__ + ": " + str(exc)
print(json.dumps(out))
"""


def test_vllm_reads_the_schedule_as_written_and_refuses_the_removed_key() -> None:
    schedule = schedule_from_text("1-7:4,8-15:1,16-65536:0")
    args, _ = with_schedule(
        ["--model", "/m", FLAG, '{"method":"ngram","num_speculative_tokens":4}'], schedule
    )
    value = json.dumps(read_config(args))
    done = subprocess.run(
        [vllm_python(), "-c", CHECK, value], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["lookup"] == [0] + [4] * 7 + [1] * 8 + [0] * 55  # batch size -> k, as the scheduler steps
    assert (
        len(out["refused"]) == 2 and "must start at 1" in out["refused"][0]
    )  # what schedule_from_text refuses
    assert "disable_by_batch_size" in out["removed"] and "Unexpected keyword" in out["removed"]
    assert SCHEDULE_KEY in value
