"""Secret redaction for what the watchdog shows: its log lines and its own API's answers.

Two kinds of secret are masked. Known values: the ones the config holds, gathered by `config_secrets` from the
fields each config section declares secret (`secret(...)` in a dataclass field's metadata, or a section's
`secret_fields()`: `api_token`, canary API keys, secret notifier and rule-backend headers, URL passwords,
secret-named `env` values and command-line flags, gateway API keys, ...). And shapes that are secret
whatever their value: the value of a secret-named flag (`--api-key VALUE`, `--hf-token=VALUE`), variable or
field (`HF_TOKEN=...`, `"password": ...`), the password in a URL (`https://user:PASSWORD@host`) and a
`Bearer`/`Basic` credential.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

MASK = "<redacted>"
# Known values shorter than this are not masked by value (a 3-letter token would mask every "tok" in the
# output); their shapes still are.
MIN_SECRET_LENGTH = 8
# A name is secret when one of its dash/underscore-separated words is one of these (`--api-key`, `HF_TOKEN`,
# `x-api-key`, `proxy-authorization`), and not for near misses (`--tokenizer`, `max_tokens`, `spec_key`).
_SECRET_NAME = re.compile(
    r"(?:^|-)(?:token|secret|password|passwd|pwd|credentials?|api-?key|access-?key|private-?key|auth"
    r"|authorization|cookie|set-cookie)(?:$|-)"
)
_MAY_HAVE_SHAPE = re.compile(r"[\s=:@]")  # every shape below needs one of these
_CREDENTIAL = re.compile(r"\b(Bearer|Basic)(\s+)([A-Za-z0-9._~+/-]{8,}=*)")  # as HTTP spells them
_VALUE = re.compile(r"""[^\s&"',;}]+""")
# A value follows (and is not a flag); it is read whole only when it is masked, so that each is read once.
_VALUE_AHEAD = r"""(?=[^\s&"',;}-])"""
# Both shapes below start with a name (a URL scheme; a flag or field name) that must run to the end of a run
# of name characters, because what follows it (`://`; a separator) cannot begin with one. So every start
# inside one run meets the same end: each run is found once and its end examined once, and then only its
# first valid start is looked for. A single regex tries every start again up to the run's end, which is
# quadratic: a 50 kB `a.a.a…=` label value took 37 s.
_SCHEME_RUN = re.compile(r"(?<![a-zA-Z0-9+.-])[a-zA-Z0-9+.-]++(?=://)")
_SCHEME_START = re.compile(r"\b[a-zA-Z]")
_USERINFO = re.compile(r"://([^/?#@\s:\"']*)(?::([^/?#@\s\"']*))?@")
# `--name value` and `--name=value` (flags), `name=value` and `name: value` (assignments): the name decides.
# Only the name and separator are consumed (the value is looked ahead), so a name inside another's value, such
# as `token=` in `http://u:x@h/?token=...`, is still found.
_NAME_RUN = re.compile(r"(?<![\w.-])[\w.-]++")
_FLAG_START = re.compile(r"(?<![\w-])--?[A-Za-z]")
_FIELD_START = re.compile(r"(?<![\w-])[A-Za-z_]")
_EITHER_START = re.compile(r"(?<![\w-])(?:--?[A-Za-z]|[A-Za-z_])")
_FLAG_SEPARATOR = re.compile(rf"(?:\s+|=){_VALUE_AHEAD}")
_FIELD_SEPARATOR = re.compile(rf"""["']?\s*(?:=|:(?!//))\s*["']?{_VALUE_AHEAD}""")


@functools.lru_cache(maxsize=4096)  # field and flag names repeat in every row
def is_secret_name(name: str) -> bool:
    """Whether a flag, variable, header or field of this name holds a secret."""
    return _SECRET_NAME.search(name.lower().lstrip("-").replace("_", "-")) is not None


def _mask_urls(text: str) -> str:
    """`scheme://user:PASSWORD@` and `scheme://TOKEN@` masked, in linear time."""
    out, done, pos = [], 0, 0
    while (run := _SCHEME_RUN.search(text, pos)) is not None:
        colon = run.end()
        start = _SCHEME_START.search(text, run.start(), colon)
        tail = _USERINFO.match(text, colon) if start is not None else None
        pos = colon if tail is None else tail.end()
        if start is None or tail is None:
            continue
        scheme, user, password = text[start.start() : colon] + "://", tail.group(1), tail.group(2)
        if password is not None:
            masked = f"{scheme}{user}:{MASK}@"
        elif user:  # a lone user part is often a token (https://TOKEN@host)
            masked = f"{scheme}{MASK}@"
        else:
            continue
        out += [text[done : start.start()], masked]
        done = tail.end()
    return "".join(out) + text[done:] if out else text


def _assignments(text: str) -> Iterator[tuple[int, str, int]]:
    """(start, name, end of the separator) of each flag and assignment, left to right; a value follows."""
    pos = 0
    while (run := _NAME_RUN.search(text, pos)) is not None:
        end = run.end()
        flag, field = _FLAG_SEPARATOR.match(text, end), _FIELD_SEPARATOR.match(text, end)
        starts = _EITHER_START if flag and field else _FLAG_START if flag else _FIELD_START if field else None
        start = None if starts is None else starts.search(text, run.start(), end)
        separator = None if start is None else flag if text[start.start()] == "-" else field
        if start is None or separator is None:
            pos = end
            continue
        yield start.start(), text[start.start() : end], separator.end()
        pos = separator.end()


def _mask_assignments(text: str) -> str:
    out, done = [], 0
    for start, name, end in _assignments(text):
        if start < done or not is_secret_name(name):
            continue
        found = _VALUE.match(text, end)  # read only now, and once: values can be long
        value = found.group() if found else ""
        if value == MASK:
            continue
        if value in ("Bearer", "Basic"):  # `Authorization: Bearer X`: the credential rule masks X
            continue
        out += [text[done:end], MASK]
        done = end + len(value)
    return "".join(out) + text[done:] if out else text


@dataclass(frozen=True)
class Redactor:
    """Masks known secret values and secret shapes in text and in JSON-like data."""

    secrets: tuple[str, ...] = ()  # longest first, so that a secret containing another is masked whole

    @classmethod
    def of(cls, values: Iterable[str]) -> Redactor:
        """A redactor for these known values (short ones are left to the shape rules)."""
        kept = {v for v in values if len(v) >= MIN_SECRET_LENGTH}
        return cls(tuple(sorted(kept, key=lambda v: (-len(v), v))))

    def text(self, text: str) -> str:
        """`text` with every known secret and every secret shape masked."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        if not _MAY_HAVE_SHAPE.search(text):
            return text
        if "@" in text:
            text = _mask_urls(text)
        text = _CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
        return _mask_assignments(text)

    def argv(self, args: Sequence[str]) -> list[str]:
        """A command line with the value of every secret-named flag masked (`--api-key X`, `--api-key=X`)."""
        out: list[str] = []
        hide_next = False
        for arg in args:
            if hide_next and not arg.startswith("-"):
                out.append(MASK)
                hide_next = False
                continue
            hide_next = False
            name, eq, _ = arg.partition("=")
            if arg.startswith("-") and is_secret_name(name):
                if eq:
                    out.append(f"{name}={MASK}")
                    continue
                hide_next = True
            out.append(self.text(arg))
        return out

    def value(self, data: Any) -> Any:
        """JSON-like data with secrets masked: secret-named fields whole, strings and command lines within."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, Mapping):
            out: dict[Any, Any] = {}
            for key, item in data.items():
                name = self.text(key) if isinstance(key, str) else key
                secret = isinstance(key, str) and is_secret_name(key)
                out[name] = MASK if secret and isinstance(item, str) and item else self.value(item)
            return out
        if isinstance(data, (list, tuple)):
            if data and all(isinstance(a, str) for a in data):
                return self.argv(data)
            return [self.value(item) for item in data]
        return data

    def bytes(self, body: bytes) -> bytes:
        """A text body (such as /metrics) with the known secrets masked."""
        for secret in self.secrets:
            raw = secret.encode()
            if raw in body:
                body = body.replace(raw, MASK.encode())
        return body


def _url_password(url: str | None) -> list[str]:
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [p for p in (parts.password, parts.username if parts.password is None else None) if p]
    return [*found, *(unquote(p) for p in found)]


def _header_values(headers: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    for name, value in headers.items():
        if is_secret_name(name):
            out.append(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.lower() in ("bearer", "basic", "token"):
                out.append(credential.strip())
    return out


def _argv_values(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(args[i + 1])
    return out


Extract = Callable[[Any], Iterable[str]]
SECRET = "vllm_watchdog.secret"  # the field metadata key of a declaration


def secret(extract: Extract | None = None) -> dict[str, Extract]:
    """Field metadata declaring a config field secret: `extract` gives its secret values (default: whole)."""
    return {SECRET: extract or whole}


def whole(value: Any) -> list[str]:
    """All of it: a string, or each string of a collection."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, (tuple, list, frozenset)) else []


def url_password(value: Any) -> list[str]:
    """The password (or lone user part: a token) of a URL, or of each URL of a collection."""
    return [p for url in whole(value) for p in _url_password(url)]


def secret_headers(value: Mapping[str, str]) -> list[str]:
    """The values of secret-named headers, and the credential of an `Authorization: Bearer X`."""
    return _header_values(value)


def secret_named(value: Mapping[str, str]) -> list[str]:
    """The values of secret-named keys (`HF_TOKEN` of an environment)."""
    return [v for k, v in value.items() if is_secret_name(k)]


def secret_flags(value: Sequence[str]) -> list[str]:
    """The values of secret-named flags of a command line (`--api-key X`, `--api-key=X`)."""
    return _argv_values(value)


def secret_keys(value: Mapping[str, Any]) -> list[str]:
    """The keys of a mapping (API key -> class)."""
    return [k for k in value if isinstance(k, str)]


def declared_secrets(section: object) -> list[str]:
    """The secret values a config section holds, as its fields declare them, through nested sections.

    A field declares itself with `secret(...)` metadata; a section whose declarations depend on its own
    values (a notifier: on its type) gives them, by field name, from a `secret_fields()` method."""
    if is_dataclass(section) and not isinstance(section, type):
        own = getattr(section, "secret_fields", None)
        declared: Mapping[str, Extract] = own() if callable(own) else {}
        out: list[str] = []
        for f in fields(section):
            value = getattr(section, f.name)
            extract = declared.get(f.name, f.metadata.get(SECRET))
            out += extract(value) if extract is not None else declared_secrets(value)
        return out
    if isinstance(section, Mapping):
        section = list(section.values())
    if isinstance(section, (tuple, list, frozenset)):
        return [v for item in section if not isinstance(item, str) for v in declared_secrets(item)]
    return []


def config_secrets(config: object) -> tuple[str, ...]:
    """Every secret value the config holds, as its sections declare them, for `Redactor.of`."""
    return tuple(v for v in declared_secrets(config) if v)


class ConfigRedactors:
    """The redactor of the live config, rebuilt only when a reload brings a new config object."""

    def __init__(self) -> None:
        self._config: object = None
        self._redactor = Redactor()

    def get(self, config: object) -> Redactor:
        """The redactor for `config`."""
        if config is not self._config:
            self._config, self._redactor = config, Redactor.of(config_secrets(config))
        return self._redactor
