"""vLLM's `--speculative-config` on a command line: read it (the JSON value and any dotted sub-keys), set its
batch-size schedule, and refuse the keys vLLM no longer has.

vLLM 0.32's `SpeculativeConfig` is a pydantic dataclass that forbids unknown fields: a launch whose
`--speculative-config` carries a removed key does not start. `num_speculative_tokens_per_batch_size` is a list
of `[first batch size, last batch size, k]` (inclusive ranges, in order, the first starting at 1, k >= 0; k
above `num_speculative_tokens` is cut to it; vllm/v1/spec_decode/dynamic/utils.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from . import args as vllm_args

FLAG = "--speculative-config"
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
REMOVED_KEYS = {
    "disable_by_batch_size": (
        "vLLM removed it (0.32 refuses to start with it): speculation by batch size is "
        f"{SCHEDULE_KEY} now (the draft_schedule action sets it)"
    ),
}
"""Keys of --speculative-config that vLLM no longer accepts, and why."""

Schedule = list[tuple[int, int, int]]


def _value(text: str | None) -> object:
    """A sub-key's value as vLLM reads it: JSON where it parses, else the string."""
    if text is None:
        return True
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_config(args: Sequence[str]) -> dict[str, object] | None:
    """The speculative config the command sets (the whole JSON value, then its dotted sub-keys, in order);
    None if it sets none; ValueError if the value is not a JSON object."""
    config: dict[str, object] | None = None
    for item in vllm_args.parse(args):
        if item.flag is None or item.flag.key != FLAG:
            continue
        if config is None:
            config = {}
        if item.flag.sub:
            config[item.flag.sub] = _value(item.value)
            continue
        try:
            whole = json.loads(item.value or "")
        except ValueError:
            raise ValueError(f"{FLAG} is not JSON: {item.value!r}") from None
        if not isinstance(whole, dict):
            raise ValueError(f"{FLAG} is not a JSON object: {item.value!r}")
        config = dict(whole)
    return config


def removed_keys(args: Sequence[str]) -> list[str]:
    """The removed keys the command's speculative config carries."""
    config = read_config(args) or {}
    return [key for key in REMOVED_KEYS if key in config]


def refuse_removed(args: Sequence[str]) -> None:
    """ValueError naming each removed key a launch would carry into vLLM, and why."""
    found = removed_keys(args)
    if found:
        reasons = "; ".join(f"{key}: {REMOVED_KEYS[key]}" for key in found)
        raise ValueError(f"{FLAG} carries a key vLLM no longer has ({reasons})")


def schedule_of(config: dict[str, object]) -> Schedule | None:
    """The schedule a speculative config sets, as (first, last, k) tuples; None if none (or not a list)."""
    raw = config.get(SCHEDULE_KEY)
    if not isinstance(raw, list):
        return None
    try:
        return [(int(lo), int(hi), int(k)) for lo, hi, k in raw]
    except (TypeError, ValueError):
        return None


def with_schedule(args: Sequence[str], schedule: Schedule) -> tuple[list[str], list[str]]:
    """The command with its speculative config's schedule set (and its removed keys dropped, returned second);
    the config is written back as one JSON value in place of the old one and its sub-keys. ValueError if the
    command sets no speculative config."""
    config = read_config(args)
    if config is None:
        raise ValueError(f"it runs without {FLAG}: there is no speculation to schedule")
    dropped = [key for key in REMOVED_KEYS if key in config]
    for key in dropped:
        del config[key]
    config[SCHEDULE_KEY] = [list(entry) for entry in schedule]
    value = json.dumps(config, separators=(",", ":"))
    return vllm_args.set_args(args, {FLAG: value}), dropped
