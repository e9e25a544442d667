"""The watchdog's YAML as tests write it: one header (fast intervals, a loopback API with the test token, the
state directory, the targets), then each test's own keys."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

TOKEN = "test-token"
AUTH: Mapping[str, str] = MappingProxyType({"Authorization": f"Bearer {TOKEN}"})
FAST: Mapping[str, object] = MappingProxyType({"scrape_interval": "1s", "evaluation_interval": "1s"})


def target(
    url: str, name: str = "vllm-0", canary: bool | Mapping[str, object] = False, **keys: object
) -> dict[str, object]:
    """One entry of `targets:`. The canary is off unless a test asks for it: it sends completions."""
    return {"name": name, "url": url, "canary": canary, **keys}


def watchdog_yaml(
    *targets: Mapping[str, object],
    port: int | None = None,
    token: str | None = TOKEN,
    state_dir: Path | str | None = None,
    global_settings: Mapping[str, object] | None = FAST,
    rest: str = "",
    integrity: bool = False,
) -> str:
    """The header, each part left out where its argument is None (or no targets), then `rest` as it is. The
    known-answer check is off unless a test asks for it (or sets `integrity:` in `rest`): like the canary it
    sends completions, which would join what a test counts on the shared one-sequence vLLM."""
    lines = []
    if not integrity and not any(line.startswith("integrity:") for line in rest.splitlines()):
        lines.append("integrity: {enabled: false}")
    if global_settings is not None:
        lines.append(f"global: {_flow(global_settings)}")
    if port is not None:
        lines.append(f"listen: 127.0.0.1:{port}")
    if token is not None:
        lines.append(f"api_token: {token}")
    if state_dir is not None:
        lines.append(f"state_dir: {state_dir}")
    if targets:
        lines += ["targets:", *(f"  - {_flow(t)}" for t in targets)]
    return "\n".join(lines) + "\n" + rest


def write_config(
    directory: Path,
    *targets: Mapping[str, object],
    port: int,
    token: str | None = TOKEN,
    global_settings: Mapping[str, object] | None = FAST,
    rest: str = "",
    integrity: bool = False,
) -> Path:
    """watchdog_yaml() as `directory`/watchdog.yml, with its state directory `directory`/state."""
    path = directory / "watchdog.yml"
    text = watchdog_yaml(
        *targets,
        port=port,
        token=token,
        state_dir=directory / "state",
        global_settings=global_settings,
        rest=rest,
        integrity=integrity,
    )
    path.write_text(text)
    return path


def _flow(value: Mapping[str, object]) -> str:
    """A YAML flow mapping (YAML reads JSON), so values need no quoting by hand."""
    return json.dumps(dict(value))
