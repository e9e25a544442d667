"""`vllm-watchdog init`: a commented starting config for the vLLM servers found on this host, monitoring only,
with the actions it could take written out as comments."""

from __future__ import annotations

import os
import socket
import time
from typing import TextIO

from ..exitcodes import EXIT_FAILED, EXIT_OK
from .discover import DOCKER_SOCKET, Discovery, Found, discover, proc_tables

HEADER = """\
# vllm-watchdog config written by `vllm-watchdog init` on {host} at {when}.
# {found}
# Check it with `vllm-watchdog check {path}`, run it with `vllm-watchdog run --config {path}`.
# Every key and its default: docs/configuration.md.
#
# Monitoring only: the bundled rules are evaluated and their alerts shown (`vllm-watchdog top`,
# /api/v1/alerts), but nothing is restarted, throttled or relaunched until actions and routes are added
# (commented examples at the end).

global:
  scrape_interval: 1s          # scrape and /health probe of every target
  evaluation_interval: 1s

listen: {listen}{listen_pad}# own API and /metrics; keep it on loopback{listen_note}
# The control API (reload, pause, silences: every POST and DELETE) needs VLLM_WATCHDOG_TOKEN set.
api_token: ${{VLLM_WATCHDOG_TOKEN:-}}
# Alert state and the action log survive restarts here.
state_dir: ${{STATE_DIRECTORY:-~/.local/state/vllm-watchdog}}

targets:
"""

FOOTER = """
rule_files:
  - bundled:vllm.rules.yml     # engine hung or down, queue, KV cache, latency, errors, GPUs (docs/rules.md)

# To act on alerts (docs/actions.md), uncomment what fits. The bundled routes and actions pair with the
# bundled rules: throttle admission on a full queue, restart a hung or dead engine, drop a useless draft.
# Restarts need a mode on the target: `container:` (docker), `command:` (the watchdog runs vLLM) or `unit:`.
#
# include: ["bundled:watchdog.yml"]
#
# Or your own, first match wins:
# actions:
#   restart:
#     type: restart
#     cooldown: 15m
#     max_per_window: {{count: 3, window: 6h}}
# routes:
#   - match: {{alertname: VLLMEngineHung}}
#     actions: [restart]
# dry_run: true                # log "would do" and touch nothing, to watch it decide first
#
# Alerts to Alertmanager or a webhook (docs/notifiers.md):
# notifiers:
#   - type: alertmanager
#     url: http://127.0.0.1:9093
"""


def _target(f: Found) -> str:
    serves = f"             # serves {', '.join(f.models)}" if f.models else ""
    lines = [f"  - name: vllm-{f.port}{serves}", f"    url: {f.url}"]
    if f.container:
        lines.append(f"    # container: {f.container}   # docker mode: lets restart actions touch it")
    else:
        lines.append(
            "    # container: NAME, command: [...] or unit: NAME: how restarts reach it (docs/actions.md)"
        )
    return "\n".join(lines)


DEFAULT_LISTEN = "127.0.0.1:9460"


def default_listen(taken: frozenset[int]) -> str:
    """127.0.0.1:9460, or the first of 9461-9479 where 9460 is taken (another watchdog, say)."""
    port = next((p for p in range(9460, 9480) if p not in taken), 9460)
    return f"127.0.0.1:{port}"


def render(found: Discovery, path: str, host: str, when: str, listen: str | None = None) -> str:
    """The config text for what `discover` found (the default address when nothing answered); `listen`
    (default: `default_listen`) is the watchdog's own API address."""
    if found.found:
        n = len(found.found)
        summary = f"Found {n} vLLM server{'s' if n > 1 else ''} listening on this host."
        body = "\n".join(_target(f) for f in found.found)
    else:
        summary = "No vLLM answered on this host: the target below is vLLM's default address."
        body = "  - name: vllm-0\n    url: http://127.0.0.1:8000"
    for dup, same in found.duplicates:
        body += f"\n  # {dup.url} answers as {same.url} does (a proxy, the gateway?): not added"
    if found.skipped:
        body += f"\n  # {found.skipped} more listening ports were not asked (--ports to choose)"
    listen = listen or default_listen(found.taken)
    note = (
        ""
        if listen != default_listen(found.taken) or listen == DEFAULT_LISTEN
        else f"\n# ({DEFAULT_LISTEN} is taken on this host)"
    )
    pad = " " * max(1, 23 - len(listen))
    head = HEADER.format(
        host=host, when=when, found=summary, path=path, listen=listen, listen_pad=pad, listen_note=note
    )
    return head + body + "\n" + FOOTER.format()


def parse_ports(spec: str) -> set[int]:
    """`8000,8080-8089` -> those ports; ValueError on anything else."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        low, _, high = part.partition("-")
        lo, hi = int(low), int(high or low)
        if not 0 < lo <= hi < 65536:
            raise ValueError(f"not a port or range: {part!r}")
        out.update(range(lo, hi + 1))
    return out


def run_init(
    output: str | None,
    out: TextIO,
    err: TextIO,
    *,
    ports: set[int] | None = None,
    proc: str = "/proc/net",
    listen: str | None = None,
) -> int:
    """Write the config to `output` (refusing to overwrite) or `out`; the exit status (exitcodes)."""
    if output is not None and os.path.lexists(output):
        print(f"vllm-watchdog init: {output} exists; not overwritten", file=err)
        return EXIT_FAILED
    docker = os.environ.get("DOCKER_HOST", "").removeprefix("unix://") or DOCKER_SOCKET
    found = discover(proc_tables(proc), ports, docker_socket=docker)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = render(found, output or "config.yml", socket.gethostname(), when, listen)
    if output is None:
        out.write(text)
    else:
        try:
            with open(output, "x", encoding="utf-8") as f:  # "x": never overwrite, even in a race
                f.write(text)
        except OSError as exc:
            print(f"vllm-watchdog init: {exc}", file=err)
            return EXIT_FAILED
    for server in found.found:
        models = f" ({', '.join(server.models)})" if server.models else ""
        print(f"found vLLM at {server.url}{models}", file=err)
    if not found.found:
        print(f"no vLLM answered on the {found.probed} listening local ports", file=err)
    return EXIT_OK
