"""deploy/dcgm-counters.csv: dcgm-exporter's counters file holds every DCGM field the bundled rules and
dashboards read, and deploy/compose.yaml hands it to dcgm-exporter."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COUNTERS = ROOT / "deploy" / "dcgm-counters.csv"
MOUNTED_AT = "/etc/dcgm-exporter/vllm-watchdog-counters.csv"
FIELD = re.compile(r"\bDCGM_FI_[A-Z0-9_]+\b")
TYPES = {"gauge", "counter", "label"}
# Pre-DCGM-3.3 names the dashboards also read, so that an old exporter still fills the panel: name -> current.
LEGACY = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}


def counters(text: str) -> dict[str, str]:
    """Field -> Prometheus type, as dcgm-exporter reads the file: `field, type, help`, '#' starts a comment."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        field, kind, help_text = (part.strip() for part in line.split(",", 2))
        assert FIELD.fullmatch(field), f"line {n}: {field!r}"
        assert kind in TYPES and help_text, f"line {n}: {line!r}"
        assert field not in out, f"line {n}: {field} twice"
        out[field] = kind
    return out


def used_fields() -> dict[str, set[str]]:
    """Every DCGM_FI_ name in the bundled rule files and dashboards -> the files that read it."""
    files = sorted((ROOT / "rules").glob("*.rules.yml")) + sorted(
        (ROOT / "grafana" / "dashboards").glob("*.json")
    )
    out: dict[str, set[str]] = {}
    for path in files:
        for name in FIELD.findall(path.read_text()):
            out.setdefault(name, set()).add(path.name)
    return out


def test_counters_file_has_every_field_the_rules_and_dashboards_read() -> None:
    have = counters(COUNTERS.read_text())
    used = used_fields()
    assert {
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_XID_ERRORS",
    } <= set(used)
    missing = {name: sorted(where) for name, where in used.items() if name not in have and name not in LEGACY}
    assert not missing, f"add to {COUNTERS.name}: {missing}"
    for old, new in LEGACY.items():
        assert old not in have and new in have, (old, new)  # one field, exported under its current name


def test_counters_file_parser_rejects_a_malformed_line() -> None:
    bad = "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\nDCGM_FI_DEV_SM_CLOCK, histogram, SM clock\n"
    try:
        counters(bad)
    except AssertionError as e:
        assert "line 2" in str(e)
    else:
        raise AssertionError("a type dcgm-exporter does not know was accepted")


def test_compose_passes_the_counters_file_to_dcgm_exporter() -> None:
    service = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]["dcgm-exporter"]
    mounts = {target: source for source, target, *_ in (v.split(":") for v in service["volumes"])}
    assert (ROOT / "deploy" / mounts[MOUNTED_AT]).resolve() == COUNTERS
    command, env = service["command"], service.get("environment", {})
    by_flag = command[command.index("-f") + 1] if "-f" in command else None
    assert MOUNTED_AT in (by_flag, env.get("DCGM_EXPORTER_COLLECTORS")), command
