"""The `integrity:` section: the known-answer probe's schedule, budget, prompts, baseline and tolerance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config.durations import parse_duration
from ..config.files import UnreadableFileError, read_text
from ..config.yamlnodes import Node, Problems, compose

MAX_PROMPTS = 16  # of an operator's prompts file
MAX_PROMPT_CHARS = 4096
MAX_REFERENCE_CHARS = 2048
MAX_PROBE_TOKENS = 64  # greedy tokens per prompt
MAX_PROMPTS_FILE_BYTES = 256 * 1024
_KEYS = {"enabled", "interval", "max_tokens_per_minute", "timeout", "prompts_file", "baseline_file"} | {
    "tolerance",
    "tolerance_floor",
    "learn_probes",
    "confirm",
}
_PROMPT_KEYS = {"name", "prompt", "reference", "max_tokens"}


@dataclass(frozen=True)
class KnownPrompt:
    """One fixed prompt, its fixed reference continuation (scored by teacher forcing) and greedy tokens."""

    name: str
    prompt: str
    reference: str
    max_tokens: int = 8


@dataclass(frozen=True)
class IntegrityConfig:
    """How the known-answer probe runs on every target whose canary is enabled."""

    enabled: bool = True
    interval: float = 60.0  # between checks of a target
    max_tokens_per_minute: int = 600  # a hard budget per target; a check that would pass it is skipped
    timeout: float = 30.0  # per check
    prompts_file: str | None = None  # the operator's prompts, beside the bundled ones
    prompts: tuple[KnownPrompt, ...] = ()  # the operator's prompts, read from prompts_file at load
    baseline_file: str | None = None  # a pinned baseline: never relearned
    tolerance: float | None = None  # nats; None: auto, max(tolerance_floor, 4 x the noise measured)
    tolerance_floor: float = 0.01
    learn_probes: int = 3  # agreeing probes before a baseline is trusted
    confirm: bool = True  # a divergence is probed again at once before it is reported


def _path(node: Node, base: Path) -> str | None:
    text = node.string()
    if text is None:
        return None
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else base / path)


def _tolerance(node: Node) -> float | None:
    text = node.scalar()
    if text is None or text == "auto":
        return None
    value = node.number()
    if value is not None and not (0 < value < 100):
        node.error(f"must be auto or a number of nats in (0, 100), got {value:g}")
        return None
    return value


def parse_integrity(node: Node, base: Path) -> IntegrityConfig:
    """The `integrity:` mapping; `prompts_file` (relative to the config file) is read and checked now."""
    d = IntegrityConfig()
    m = node.mapping(_KEYS)
    if m is None:
        return d
    enabled = m["enabled"].boolean() if "enabled" in m else None
    interval = m["interval"].parsed(parse_duration) if "interval" in m else None
    timeout = m["timeout"].parsed(parse_duration) if "timeout" in m else None
    for key, value in (("interval", interval), ("timeout", timeout)):
        if value is not None and value <= 0:
            m[key].error("must be greater than 0")
    budget = m["max_tokens_per_minute"].integer(minimum=1) if "max_tokens_per_minute" in m else None
    floor = m["tolerance_floor"].number() if "tolerance_floor" in m else None
    if floor is not None and not (0 < floor < 100):
        m["tolerance_floor"].error(f"must be a number of nats in (0, 100), got {floor:g}")
        floor = None
    learn = m["learn_probes"].integer(minimum=2) if "learn_probes" in m else None
    if learn is not None and learn > 10:
        m["learn_probes"].error(f"must be <= 10, got {learn}")
        learn = None
    prompts_file = _path(m["prompts_file"], base) if "prompts_file" in m else None
    prompts: tuple[KnownPrompt, ...] = ()
    if prompts_file is not None:
        prompts = load_prompts_file(prompts_file, m["prompts_file"])
    confirm = m["confirm"].boolean() if "confirm" in m else None
    return IntegrityConfig(
        enabled=d.enabled if enabled is None else enabled,
        interval=interval if interval and interval > 0 else d.interval,
        max_tokens_per_minute=budget or d.max_tokens_per_minute,
        timeout=timeout if timeout and timeout > 0 else d.timeout,
        prompts_file=prompts_file,
        prompts=prompts,
        baseline_file=_path(m["baseline_file"], base) if "baseline_file" in m else None,
        tolerance=_tolerance(m["tolerance"]) if "tolerance" in m else None,
        tolerance_floor=floor or d.tolerance_floor,
        learn_probes=learn or d.learn_probes,
        confirm=d.confirm if confirm is None else confirm,
    )


def load_prompts_file(path: str, where: Node) -> tuple[KnownPrompt, ...]:
    """An operator's prompts file; its problems (with its own file:line) join those of `where`'s file."""
    try:
        text = read_text(path, MAX_PROMPTS_FILE_BYTES)
    except UnreadableFileError as exc:
        where.error(f"cannot read {path}: {exc}")
        return ()
    problems = Problems(path)
    prompts = parse_prompts(text, problems)
    where.problems.items.extend(problems.items)
    return prompts


def parse_prompts(text: str, problems: Problems) -> tuple[KnownPrompt, ...]:
    """A known-answers YAML file: `prompts:`, a list of {name, prompt, reference, max_tokens}."""
    root = compose(text, problems, aliases=False)
    if root is None:
        if not problems.items:
            problems.add(None, "(root)", "file is empty")
        return ()
    top = Node(root, "", problems, env={}, substitute=False).mapping({"prompts"})
    if top is None or "prompts" not in top:
        if top is not None:
            problems.add(root, "prompts", "is required")
        return ()
    items = top["prompts"].sequence() or []
    if len(items) > MAX_PROMPTS:
        top["prompts"].error(f"at most {MAX_PROMPTS} prompts, got {len(items)}")
        items = items[:MAX_PROMPTS]
    out: list[KnownPrompt] = []
    for item in items:
        prompt = _prompt(item)
        if prompt is not None and any(p.name == prompt.name for p in out):
            item.error(f"duplicate prompt name {prompt.name!r}", field=f"{item.path}.name")
        elif prompt is not None:
            out.append(prompt)
    return tuple(out)


def _bounded_text(m: dict[str, Node], key: str, limit: int) -> str | None:
    text = m[key].string()
    if text is not None and len(text) > limit:
        m[key].error(f"at most {limit} characters, got {len(text)}")
        return None
    return text


def _prompt(node: Node) -> KnownPrompt | None:
    m = node.mapping(_PROMPT_KEYS)
    if m is None:
        return None
    for required in ("name", "prompt", "reference"):
        if required not in m:
            node.error("is required", field=f"{node.path}.{required}")
    name = m["name"].string() if "name" in m else None
    prompt = _bounded_text(m, "prompt", MAX_PROMPT_CHARS) if "prompt" in m else None
    reference = _bounded_text(m, "reference", MAX_REFERENCE_CHARS) if "reference" in m else None
    max_tokens = m["max_tokens"].integer(minimum=1) if "max_tokens" in m else 8
    if max_tokens is not None and max_tokens > MAX_PROBE_TOKENS:
        m["max_tokens"].error(f"must be <= {MAX_PROBE_TOKENS}, got {max_tokens}")
        max_tokens = None
    if not name or not prompt or not reference or max_tokens is None:
        return None
    return KnownPrompt(name, prompt, reference, max_tokens)
