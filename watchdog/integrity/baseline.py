"""A target's known answers: learnt and persisted under state_dir/integrity/<identity key>.json (0600, written
atomically), or pinned by the operator in a file committed with the config (never relearned)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.files import UnreadableFileError, read_text
from .config import KnownPrompt
from .identity import ModelIdentity
from .prompts import prompt_digest
from .scoring import PromptScore

FORMAT = 1
MAX_BASELINE_BYTES = 4 << 20
SUBDIR = "integrity"


class BaselineError(ValueError):
    """A baseline file that cannot be used: the message says why in one line."""


@dataclass(frozen=True)
class Baseline:
    """The answers a model gave when it was known to be right, and the noise measured around them."""

    identity: ModelIdentity
    scores: tuple[PromptScore, ...]
    digests: Mapping[str, str]  # prompt name -> digest of its text (the text itself is never stored)
    noise: float  # nats, measured while learning
    tolerance: float  # nats, the tolerance the checks use
    learnt_at: float
    pinned: bool = field(default=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The baseline as a JSON object."""
        return {
            "format": FORMAT,
            "key": self.identity.key,
            "identity": self.identity.to_json(),
            "learnt_at": self.learnt_at,
            "noise": self.noise,
            "tolerance": self.tolerance,
            "prompts": [
                {
                    "name": s.name,
                    "digest": self.digests.get(s.name, ""),
                    "logprobs": list(s.logprobs),
                    "greedy": list(s.greedy),
                    "margins": [m if math.isfinite(m) else None for m in s.margins],
                    "tokens": s.tokens,
                }
                for s in self.scores
            ],
        }

    def stale_prompts(self, prompts: Sequence[KnownPrompt]) -> list[str]:
        """The prompts whose text is not the one this baseline was learnt from (or that it lacks)."""
        return [p.name for p in prompts if self.digests.get(p.name) != prompt_digest(p)]


def _float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BaselineError(f"{what} is not a number")
    return float(value)


def _score(item: Any, i: int) -> tuple[PromptScore, str]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise BaselineError(f"prompts[{i}] has no name")
    name = item["name"]
    lps, greedy, margins = item.get("logprobs"), item.get("greedy"), item.get("margins")
    if not isinstance(lps, list) or not isinstance(greedy, list) or not isinstance(margins, list):
        raise BaselineError(f"prompts[{i}] ({name}) lacks logprobs, greedy or margins")
    if not all(isinstance(t, str) for t in greedy) or len(margins) != len(greedy):
        raise BaselineError(f"prompts[{i}] ({name}): greedy and margins do not match")
    score = PromptScore(
        name=name,
        logprobs=tuple(_float(v, f"prompts[{i}].logprobs") for v in lps),
        greedy=tuple(greedy),
        margins=tuple(math.inf if m is None else _float(m, f"prompts[{i}].margins") for m in margins),
        tokens=tokens if isinstance(tokens := item.get("tokens"), int) else 0,
    )
    return score, str(item.get("digest", ""))


def from_json(data: Any, pinned: bool = False) -> Baseline:
    """A baseline from its JSON object; BaselineError naming the first thing wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(f"not a known-answer baseline (format {FORMAT})")
    ident = data.get("identity")
    if not isinstance(ident, dict) or not isinstance(ident.get("served_name"), str):
        raise BaselineError("identity is missing")
    try:
        identity = ModelIdentity(**ident)
    except TypeError:
        raise BaselineError("identity has unknown fields") from None
    items = data.get("prompts")
    if not isinstance(items, list) or not items:
        raise BaselineError("prompts are missing")
    pairs = [_score(item, i) for i, item in enumerate(items)]
    tolerance = _float(data.get("tolerance"), "tolerance")
    if not 0 < tolerance < 100:
        raise BaselineError("tolerance must be in (0, 100) nats")
    return Baseline(
        identity=identity,
        scores=tuple(s for s, _ in pairs),
        digests={s.name: d for s, d in pairs},
        noise=_float(data.get("noise", 0.0), "noise"),
        tolerance=tolerance,
        learnt_at=_float(data.get("learnt_at", 0.0), "learnt_at"),
        pinned=pinned,
    )


def read_baseline(path: str | os.PathLike[str], pinned: bool = False) -> Baseline:
    """A baseline file (bounded size); BaselineError if unreadable or invalid."""
    try:
        text = read_text(path, MAX_BASELINE_BYTES)
    except UnreadableFileError as exc:
        raise BaselineError(f"cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise BaselineError("not JSON") from None
    return from_json(data, pinned)


def check_pinned(path: str, prompts: Sequence[KnownPrompt]) -> Baseline:
    """A pinned baseline file that covers these prompts as they are now; BaselineError otherwise."""
    baseline = read_baseline(path, pinned=True)
    stale = baseline.stale_prompts(prompts)
    if stale:
        raise BaselineError(f"learnt from other prompts than {', '.join(stale)} now are: learn it again")
    return baseline


def baseline_path(state_dir: str, key: str) -> Path:
    """Where the baseline of a model identity is kept."""
    return Path(state_dir) / SUBDIR / f"{key}.json"


def load_learnt(state_dir: str | None, key: str) -> Baseline | None:
    """The learnt baseline of an identity, if one was saved; None if none or unusable."""
    if state_dir is None or not baseline_path(state_dir, key).is_file():
        return None
    try:
        return read_baseline(baseline_path(state_dir, key))
    except BaselineError:
        return None


def save(state_dir: str, baseline: Baseline) -> Path:
    """Write a learnt baseline atomically (a 0600 temporary file, then os.replace); OSError on failure."""
    path = baseline_path(state_dir, baseline.identity.key)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(baseline.to_json(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
