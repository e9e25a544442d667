"""`--version`, `check` and `test-rules` start fast: they import neither the daemon, the gateway nor their stacks.

CI runs `test-rules` once per rule test file, so what these commands import is paid on every run. Each case
runs the command in a fresh interpreter (through `cli.main`, as the console script does) and reads back
which modules it imported. The daemon and the gateway process, started at every `run` (and by many tests),
import only their own stacks: the daemon no gateway server and no Docker SDK, the gateway no daemon. No
timing is asserted; bench/startup.py measures the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULE_TEST = ROOT / "rules" / "tests" / "gateway.rules.test.yml"

# Runs `vllm-watchdog ARGS...` in this interpreter and prints its exit code, output and sys.modules as JSON.
_RUN = """
import contextlib, io, json, sys
from vllm_watchdog.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:  # --version exits from argparse
        rc = exc.code
print(json.dumps({"rc": rc, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""

# None of these is needed to validate a config or run rule unit tests: the daemon and what it wires, the
# gateway's server, the HTTP stacks (server and client), the scheduler, Docker and plotting.
NEVER = (
    "vllm_watchdog.service.daemon",
    "vllm_watchdog.gateway.dataplane.server",
    "vllm_watchdog.gateway.control.process",
    "vllm_watchdog.api.app",
    "vllm_watchdog.service.actionplane",
    "vllm_watchdog.sources.monitor",
    "vllm_watchdog.promql.remote",
    "uvicorn",
    "starlette",
    "aiohttp",
    "uvloop",
    "httpx",
    "requests",
    "prometheus_client",
    "prometheus_api_client",
    "vllm_watchdog.service.schedule",
    "docker",
    "matplotlib",
)
# `--version` prints a constant: it parses neither YAML nor PromQL.
NOT_FOR_VERSION = ("vllm_watchdog.config.model", "vllm_watchdog.ruler.files", "yaml", "promql_parser", "re2")


# The daemon speaks to the gateway process over its control channel and never serves traffic itself; it
# imports the Docker SDK only for a container target, and the remote PromQL client only with a `rule_backend`.
DAEMON_NEVER = (
    "vllm_watchdog.gateway.dataplane",  # the gateway process: its server, proxy and commands
    "vllm_watchdog.actions.runtimes.docker",
    "vllm_watchdog.promql.remote",
    "aiohttp",
    "docker",
    "requests",
    "prometheus_api_client",
)
# The gateway process forwards with aiohttp and takes its spec as JSON: nothing of the daemon, its HTTP
# client, YAML or the metrics library.
GATEWAY_NEVER = (
    "vllm_watchdog.gateway.control",  # the daemon's side of the gateway
    "vllm_watchdog.service",
    "vllm_watchdog.actions",
    "vllm_watchdog.ruler",
    "vllm_watchdog.config.model",
    "httpx",
    "yaml",
    "prometheus_client",
    "docker",
)


def imported_by(module: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `module`."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def run_cli(*args: str) -> tuple[int, str, set[str]]:
    """Exit code, stdout and the imported modules of `vllm-watchdog ARGS` in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    return result["rc"], result["out"], set(result["modules"])


def heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The names (packages count with their submodules) that were imported."""
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


def test_version_imports_no_parser_and_no_service() -> None:
    rc, out, modules = run_cli("--version")
    assert (rc, out.startswith("vllm-watchdog ")) == (0, True)
    assert heavy(modules, NEVER + NOT_FOR_VERSION) == []


def test_check_imports_no_service() -> None:
    rc, out, modules = run_cli("check")
    assert rc == 0 and "rule groups" in out, out
    assert heavy(modules, NEVER) == []


def test_failing_check_imports_no_service(tmp_path: Path) -> None:
    bad = tmp_path / "watchdog.yml"
    bad.write_text("targets: nope\n")
    rc, _, modules = run_cli("check", "--config", str(bad))
    assert rc == 3
    assert heavy(modules, NEVER) == []


def test_test_rules_imports_no_service() -> None:
    rc, out, modules = run_cli("test-rules", str(RULE_TEST))
    assert rc == 0 and "SUCCESS" in out, out
    assert heavy(modules, NEVER) == []


def test_a_command_that_needs_more_is_seen_importing_it(tmp_path: Path) -> None:
    """`query` imports the remote PromQL client before it reads the config: the checks above can fail."""
    bad = tmp_path / "watchdog.yml"
    bad.write_text("targets: nope\n")
    rc, _, modules = run_cli("query", "--config", str(bad), "up")
    assert rc == 3
    assert "vllm_watchdog.promql.remote" in heavy(modules, NEVER)


def test_the_daemon_imports_no_gateway_server_and_no_docker() -> None:
    modules = imported_by("vllm_watchdog.service.daemon")
    # It starts the gateway: the check sees the gateway.
    assert "vllm_watchdog.gateway.control.process" in modules
    assert heavy(modules, DAEMON_NEVER) == []


def test_the_gateway_process_imports_no_daemon() -> None:
    # What `python -m vllm_watchdog.gateway` runs.
    modules = imported_by("vllm_watchdog.gateway.dataplane.main")
    assert "aiohttp" in modules
    assert heavy(modules, GATEWAY_NEVER) == []
