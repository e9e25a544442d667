"""Which requests the gateway admits, refuses or passes, decided on the path the upstream will receive.

vLLM (uvicorn and Starlette) routes on the percent-decoded path, and the upstream client may collapse `//`, so
the raw path a client sends is not what it reaches. `normalise_path` turns it into the path the upstream
routes on (RFC 3986 6.2.2: unreserved escapes decoded, dot segments resolved; and empty segments collapsed);
the gateway forwards exactly that and classifies it with `route_of`. Paths that would decode into another
path (`%2F`, `%5C`, `%00`, a backslash) are refused rather than guessed at.

The route lists come from vLLM 0.32's routers (`vllm/entrypoints/**/api_router.py`, the SageMaker standard's
`/adapters`). Every POST is admitted (but for the few in `UNGATED_POSTS` and cancelling a response), so that
a route these lists do not know cannot bypass admission (vLLM serves inference on POST only); the development
and admin endpoints are refused unless `gateway.allow_admin_paths` names them (then they pass unadmitted).
"""

from __future__ import annotations

import enum
from collections.abc import Collection

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_FORBIDDEN = {
    0x2F: "an encoded slash (%2F)",
    0x5C: "an encoded backslash (%5C)",
    0x00: "an encoded NUL (%00)",
}

# vLLM 0.32's inference routes, all POST. Not needed to admit them (every POST is); documentation and tests.
INFERENCE = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/v2/embed",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/invocations",
        "/cohere/v2/chat",
        "/generative_scoring",
        "/v1/systemone",
        "/inference/v1/generate",
    }
)
# Development and admin endpoints: they pause, reset, reload or reconfigure the engine, or show its setup.
ADMIN = frozenset(
    {
        "/pause",
        "/resume",
        "/is_paused",
        "/abort_requests",
        "/inference/v1/abort_requests",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/release_kv_cache_memory",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/server_info",
        "/start_profile",
        "/stop_profile",
        "/init_weight_transfer_engine",
        "/shutdown_weight_transfer_engine",
        "/start_weight_update",
        "/start_draft_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/update_weight_version",
        "/weight_info",
        "/weight_checker",
        "/get_world_size",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",  # SageMaker's LoRA registration, and /adapters/{name}
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/fault_tolerance",  # /fault_tolerance/apply and /status
    }
)
# POSTs that do no engine work: vLLM's API process tokenizes or renders a template and answers. The gate
# budgets the engine, so these pass (bounded by max_body and the connection cap), as does the health check.
UNGATED_POSTS = frozenset(
    {
        "/ping",  # SageMaker's health check, GET or POST
        "/tokenize",
        "/detokenize",
        "/v1/messages/count_tokens",
        "/v1/completions/render",
        "/v1/chat/completions/render",
        "/v1/messages/render",
        "/v1/responses/render",
        "/v1/completions/derender",
        "/v1/chat/completions/derender",
    }
)


class Route(enum.Enum):
    """What the gateway does with a request."""

    ADMIT = "admit"  # through admission, then forwarded
    PASS = "pass"  # forwarded without admission
    ADMIN = "admin"  # refused (403) unless allowed by config


class BadPath(ValueError):
    """A path the gateway will not forward: it would reach the upstream as a different path."""


def normalise_path(raw: bytes) -> bytes:
    """The path the upstream routes on: unreserved escapes decoded, dot segments resolved, `//` collapsed.

    Other escapes and bytes are kept as they are. BadPath for an encoded slash, backslash or NUL, a raw
    backslash, or a path that does not start with `/`.
    """
    if not raw.startswith(b"/"):
        raise BadPath("the path must start with /")
    if b"\\" in raw:
        raise BadPath("the path contains a backslash")
    if b"%" not in raw and b"//" not in raw and b"/." not in raw:
        return raw  # the common case: nothing to do
    out = bytearray()
    i = 0
    while (j := raw.find(b"%", i)) >= 0:
        out += raw[i:j]
        pair = raw[j + 1 : j + 3]
        if len(pair) == 2 and pair[0] in _HEX and pair[1] in _HEX:
            byte = int(pair, 16)
            if byte in _FORBIDDEN:
                raise BadPath(f"the path contains {_FORBIDDEN[byte]}")
            if byte in _UNRESERVED:
                out.append(byte)
            else:
                out += raw[j : j + 3]
            i = j + 3
        else:  # a lone % stays: the upstream leaves it undecoded too
            out.append(0x25)
            i = j + 1
    out += raw[i:]
    segments: list[bytes] = []
    parts = bytes(out).split(b"/")
    for part in parts[1:]:
        if part == b"..":
            if segments:
                segments.pop()
        elif part not in (b"", b"."):
            segments.append(part)
    path = b"/" + b"/".join(segments)
    if segments and parts[-1] in (b"", b".", b".."):
        path += b"/"  # a trailing slash is kept: the upstream answers it differently (a redirect)
    return path


def route_of(method: str, path: str, allow_admin: Collection[str] = ()) -> Route:
    """The route of a request whose path was normalised; `allow_admin` lists admin paths let through."""
    bare = path[:-1] if len(path) > 1 and path.endswith("/") else path
    head = admin_root(bare)
    if head is not None:
        # An allowed admin call passes without admission: a /resume must not wait behind a drain.
        return Route.PASS if head in allow_admin or bare in allow_admin else Route.ADMIN
    if method != "POST" or bare in UNGATED_POSTS:
        return Route.PASS
    parts = bare.split("/")
    if len(parts) == 5 and parts[1:3] == ["v1", "responses"] and parts[4] == "cancel" and parts[3]:
        return Route.PASS  # cancelling frees capacity: it must not wait behind the queue it would shorten
    return Route.ADMIT


def admin_root(path: str) -> str | None:
    """The ADMIN entry `path` is or lies under, if any."""
    if path in ADMIN:
        return path
    for root in ("/adapters", "/fault_tolerance"):
        if path.startswith(root + "/"):
            return root
    return None
