"""The prompts a known-answer check sends: the bundled ones, then the operator's own."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..config.files import read_text
from ..config.yamlnodes import Problems
from ..errors import ConfigError
from .config import MAX_PROMPTS_FILE_BYTES, IntegrityConfig, KnownPrompt, parse_prompts

BUNDLED_FILE = Path(__file__).resolve().parent.parent / "defaults" / "known-answers.yml"


def bundled_prompts() -> tuple[KnownPrompt, ...]:
    """The bundled prompts (watchdog/defaults/known-answers.yml); ConfigError if the file is broken."""
    problems = Problems(str(BUNDLED_FILE))
    prompts = parse_prompts(read_text(BUNDLED_FILE, MAX_PROMPTS_FILE_BYTES), problems)
    if problems.items:
        raise ConfigError(problems.items)
    return prompts


def prompt_set(config: IntegrityConfig) -> tuple[KnownPrompt, ...]:
    """The prompts of every check: the bundled ones, then the operator's (an operator's prompt of a bundled
    name replaces it)."""
    own = {p.name for p in config.prompts}
    return (*(p for p in bundled_prompts() if p.name not in own), *config.prompts)


def prompt_digest(prompt: KnownPrompt) -> str:
    """What a baseline records of a prompt: a digest of its text, reference and max_tokens, never the text."""
    text = f"{prompt.prompt}\x00{prompt.reference}\x00{prompt.max_tokens}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cost_estimate(prompt: KnownPrompt) -> int:
    """Tokens one probe of a prompt costs before it was ever measured: about 4 characters a token."""
    return (len(prompt.prompt) + len(prompt.reference)) // 4 + 1 + prompt.max_tokens
