"""The cost of the daemon's once-a-second `tick` to the gateway process over its control socket.

Usage: .venv/bin/python bench/control_tick.py [--ticks N]

Starts a gateway process as the daemon does (in front of a closed port: no traffic), sends N ticks back to
back and prints the round trip, the daemon's CPU and the gateway's CPU per tick. At one tick a second, the
CPU figures are also the share of one core in thousandths.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import time

from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.control.process import GatewayProcess
from vllm_watchdog.gateway.protocol.spec import spec_for


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(ticks: int) -> None:
    """Start, warm up, measure, stop."""
    config = GatewayConfig(target="bench", upstream="http://127.0.0.1:9", listen_port=free_port())
    gateway = GatewayProcess(spec_for(config, tempfile.mkdtemp(prefix="bench-tick-")))
    await gateway.attach()
    assert gateway.pid is not None
    try:
        for _ in range(50):
            await gateway.request("tick", {"signals": {}})
        g0, c0, t0 = cpu_seconds(gateway.pid), time.process_time(), time.perf_counter()
        for _ in range(ticks):
            await gateway.request("tick", {"signals": {"queue_time": 0.1}})
        wall, daemon = time.perf_counter() - t0, time.process_time() - c0
        gw = cpu_seconds(gateway.pid) - g0
        print(
            f"{ticks} ticks: round trip {wall / ticks * 1e3:.3f} ms, "
            f"daemon CPU {daemon / ticks * 1e3:.3f} ms, gateway CPU {gw / ticks * 1e3:.3f} ms per tick"
        )
    finally:
        await gateway.stop(1.0)


def main() -> None:
    """Parse arguments and measure."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=2000)
    asyncio.run(measure(ap.parse_args().ticks))


if __name__ == "__main__":
    main()
