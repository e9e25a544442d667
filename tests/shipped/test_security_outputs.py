"""What a real watchdog writes and serves, grepped after a gateway run in front of the shared real vLLM: no
prompt or completion text, no client API key, and none of the configured secrets (token, notifier header,
canary key, URL password, a relaunched command line's --api-key, a secret env value, a notifier's basic_auth
password), at debug log level. The relaunch's incident bundle is unpacked and grepped with the rest, and
served by GET /api/v1/incidents: it too holds none of them.
Session names are expected to show (they are labels by design): they prove the grep reaches the data."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.configs import target, write_config
from tests.support.procs import command_lines
from tests.support.vllm_server import VllmServer, free_port
from tests.support.watchdogproc import poll
from vllm_watchdog import logs
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.redact import MASK, Redactor, config_secrets, is_secret_name

RUN = uuid.uuid4().hex[:10]
SECRETS = {
    "api_token": f"tok-{RUN}-api-token-secret",
    "notifier header": f"hdr-{RUN}-notifier-secret",
    "canary api_key": f"can-{RUN}-canary-secret",
    "URL password": f"pw-{RUN}-url-secret",
    "--api-key on a command line": f"arg-{RUN}-argv-secret",
    "secret env value": f"env-{RUN}-env-secret",
    "notifier basic_auth password": f"bas-{RUN}-basic-auth-secret",
}
CLIENT_KEY = f"sk-client-{RUN}-key"  # a client's own API key, sent through the gateway
SESSION = f"sess-visible-{RUN}"
TRIGGER = f"sess-trigger-{RUN}"
# A stand-in for a process-mode vLLM: answers every GET; its argv carries a secret flag.
FAKE_SERVER = """
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""
RULES = f"""
groups:
  - name: sessions
    rules:
      - alert: SessionSeen
        expr: vllm_watchdog_gateway_session_requests_total{{session="{TRIGGER}"}} > 0
        labels: {{severity: info}}
"""
READS = (
    "/metrics",
    "/healthz",
    "/api/v1/targets",
    "/api/v1/alerts",
    "/api/v1/rules",
    "/api/v1/actions",
    "/api/v1/silences",
    "/api/v1/gateway",
    "/api/v1/samples?match=" + '{__name__=~"vllm_watchdog_gateway.*"}',
    "/api/v1/samples?match=" + '{__name__=~"vllm:.*"}',
    "/api/v1/samples?match=" + '{__name__=~"vllm_watchdog_(canary|health|target).*"}',
    "/api/v1/query?query=" + '{__name__=~"vllm_watchdog_gateway.*|vllm:.*"}',
    "/api/v1/series?match[]=" + '{__name__=~"vllm_watchdog_gateway.*|vllm:.*"}',
    "/api/v1/label/session/values",
    "/api/v1/incidents",
)


def _config(tmp_path: Path, vllm: VllmServer, port: int, gport: int, fport: int) -> Path:
    (tmp_path / "sessions.rules.yml").write_text(RULES)
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)  # a file, not `-c`: args of `-c` cannot be edited
    dead = free_port()  # nothing listens here: notifications stay queued on disk
    fake = [sys.executable, str(tmp_path / "fake_server.py"), "--port", str(fport)]
    return write_config(
        tmp_path,
        target(vllm.url, canary={"interval": "2s", "timeout": "30s", "api_key": SECRETS["canary api_key"]}),
        target(
            f"http://watchdog:{SECRETS['URL password']}@127.0.0.1:{fport}",
            name="fake",
            command=[*fake, "--api-key", SECRETS["--api-key on a command line"], "--flavour", "a"],
            env={"HF_TOKEN": SECRETS["secret env value"]},
        ),
        port=port,
        # Not the shared TOKEN: a value of this run's own, which the test searches every output for.
        token=SECRETS["api_token"],
        rest=f"""
rule_files: [sessions.rules.yml]
routes:
  - {{match: {{alertname: SessionSeen}}, actions: [breaker]}}
actions:
  breaker: {{type: throttle_session, duration: 1m}}
  flavour: {{type: reconfigure, set: {{--flavour: b}}, cooldown: 0s, startup_grace: 0s, drain_timeout: 1s,
            stop_timeout: 5s, ready_timeout: 3s}}
notifiers:
  - type: webhook
    url: "http://127.0.0.1:{dead}/hook"
    headers: {{Authorization: "Bearer {SECRETS["notifier header"]}", X-Team: infra}}
  - type: alertmanager
    url: "http://127.0.0.1:{dead}"
    basic_auth: {{username: watchdog, password: "{SECRETS["notifier basic_auth password"]}"}}
gateway: {{listen: "127.0.0.1:{gport}", target: vllm-0}}
""",
    )


def _kill_fake(fport: int) -> None:
    needle = SECRETS["--api-key on a command line"].encode()
    for pid, argv in command_lines():
        raw = b"\0".join(argv)
        if needle in raw and str(fport).encode() in raw:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _traffic(gateway: str) -> list[str]:
    """Completions and chats with marked prompts through the gateway; the markers and the texts vLLM wrote."""
    sent: list[str] = []
    written: list[str] = []
    with httpx.Client(timeout=120, trust_env=False) as c:
        for i in range(3):
            marker = f"zqx-prompt-{RUN}-{i}"
            sent.append(marker)
            body = {"model": "tiny-llama", "prompt": f"{marker} tell me", "max_tokens": 16, "temperature": 0}
            r = c.post(gateway + "/v1/completions", json=body, headers={"X-Session-ID": SESSION})
            assert r.status_code == 200, r.text
            written.append(r.json()["choices"][0]["text"])
        marker = f"zqx-chat-{RUN}"
        sent.append(marker)
        chat = {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": f"{marker} and more words"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        r = c.post(gateway + "/v1/chat/completions", json=chat, headers={"X-Session-ID": SESSION})
        assert r.status_code == 200, r.text
        written.append(r.json()["choices"][0]["message"]["content"])
        marker = f"zqx-stream-{RUN}"
        sent.append(marker)
        stream = {"model": "tiny-llama", "prompt": marker, "max_tokens": 8, "stream": True}
        with c.stream(
            "POST", gateway + "/v1/completions", json=stream, headers={"X-Session-ID": SESSION}
        ) as s:
            assert s.status_code == 200 and marker not in s.read().decode()
        marker = f"zqx-keyed-{RUN}"  # no session header: the session is a hash of the client's API key
        sent.append(marker)
        r = c.post(
            gateway + "/v1/completions",
            json={"model": "tiny-llama", "prompt": marker, "max_tokens": 4},
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
        assert r.status_code == 200, r.text
        r = c.post(
            gateway + "/v1/completions",
            json={"model": "tiny-llama", "prompt": f"zqx-trigger-{RUN}", "max_tokens": 2},
            headers={"X-Session-ID": TRIGGER},
        )
        sent.append(f"zqx-trigger-{RUN}")
        assert r.status_code == 200, r.text
    texts = [t.strip() for t in written if len(t.strip()) >= 8]
    assert texts, written  # something long enough to grep for
    return sent + texts


def _state_files(state: Path) -> dict[str, bytes]:
    """Every file of the state_dir, and every file of each incident bundle unpacked (as `incident/<id>/<name>`:
    what the bundles hold is shown to people, and is grepped as the API's answers are)."""
    out = {f"state_dir/{p.name}": p.read_bytes() for p in sorted(state.rglob("*")) if p.is_file()}
    for bundle in sorted(state.glob("incidents/*.tar.gz")):
        with tarfile.open(bundle) as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member) if member.isfile() else None
                if data is not None:
                    out[f"incident/{member.name}"] = data.read()
    return out


def _reads(api: str) -> dict[str, bytes]:
    out = {}
    for path in READS:
        r = httpx.get(api + path, timeout=30)
        assert r.status_code == 200, (path, r.text[:300])
        out[path] = r.content
    for incident in json.loads(out["/api/v1/incidents"])["data"]["incidents"]:
        path = f"/api/v1/incidents/{incident['id']}"
        out[path] = httpx.get(api + path, timeout=30).content
    return out


def _found(outputs: dict[str, bytes], needles: list[str]) -> list[tuple[str, str]]:
    return [(n, where) for n in needles for where, data in outputs.items() if n.encode() in data]


@pytest.mark.vllm
def test_no_prompt_completion_or_secret_in_logs_metrics_api_audit_or_queue(
    tmp_path: Path, vllm_server: VllmServer, cleanup: list[Callable[[], None]]
) -> None:
    port, gport, fport = free_port(), free_port(), free_port()
    cfg = _config(tmp_path, vllm_server, port, gport, fport)
    api = f"http://127.0.0.1:{port}"
    log = tmp_path / "watchdog.log"
    cleanup.append(lambda: _kill_fake(fport))
    with log.open("ab") as out:
        wd = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg), "--log-level", "debug"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    cleanup.append(lambda: (wd.kill(), wd.wait(20)))
    poll(
        api + "/api/v1/targets",
        lambda j: all(t["health"]["up"] for t in targets(j)) and targets(j)[0]["up"],
        120,
        "vLLM scraped and the fake server healthy",
        log,
    )
    needles = _traffic(f"http://127.0.0.1:{gport}")
    # A relaunch records the new command line (audit step `replace`, log line `action step`).
    auth = {"Authorization": f"Bearer {SECRETS['api_token']}"}
    run = httpx.post(
        api + "/api/v1/actions/flavour/run", json={"target": "fake", "wait": True}, headers=auth, timeout=120
    )
    assert run.status_code == 200 and run.json()["result"]["outcome"] in ("failed", "rolled_back"), run.text
    poll(
        api + "/api/v1/actions",
        lambda j: any(h["action"] == "breaker" and h["outcome"] == "succeeded" for h in j["data"]["history"]),
        60,
        "the session breaker for the trigger session",
        log,
    )
    state = tmp_path / "state"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _found(_state_files(state), [TRIGGER]):
        time.sleep(0.5)  # the alert's notification is queued (its receiver never answers)
    reads = _reads(api)
    actions: Any = httpx.get(api + "/api/v1/actions", timeout=10).json()["data"]["history"]
    scraped: Any = targets(httpx.get(api + "/api/v1/targets", timeout=10).json())
    wd.send_signal(signal.SIGTERM)
    assert wd.wait(30) == 0
    outputs = {"watchdog log": log.read_bytes(), **reads, **_state_files(state)}
    assert b'"level": "debug"' in outputs["watchdog log"]  # debug lines were written, and grepped

    # No prompt, no completion text, no client key: anywhere (log, metrics, API, audit, queue, state).
    assert _found(outputs, [*needles, CLIENT_KEY]) == []
    # The grep reaches the data: session names are labels by design, and so is the hashed key session.
    shown = {where for _, where in _found(outputs, [SESSION, TRIGGER, 'session="key-'])}
    assert {"/metrics", "/api/v1/gateway", "/api/v1/actions"} <= shown, shown
    assert any(where.startswith("state_dir/notifications") for where in shown), shown
    assert any(where.startswith("state_dir/actions") for where in shown), shown
    # The relaunch left an incident with its evidence: the fake server's stacks, its (masked) command line.
    bundled = {k.rsplit("/", 1)[1] for k in outputs if k.startswith("incident/")}
    assert {"manifest.json", "processes.json", "stacks.json"} <= bundled, sorted(outputs)
    assert any(k.startswith("/api/v1/incidents/") for k in outputs), sorted(outputs)

    # Secrets: not in the log nor in anything the API serves (the state directory keeps the launch spec, by
    # design: docs/security.md).
    served = {k: v for k, v in outputs.items() if not k.startswith("state_dir/")}
    assert _found(served, list(SECRETS.values())) == []
    # ... because they were masked where they would have shown:
    replace = next(
        s["details"]["argv"]
        for h in actions
        if h["action"] == "flavour"
        for s in h["steps"]
        if s["step"] == "replace"
    )
    assert replace[replace.index("--api-key") + 1] == MASK and "b" in replace
    fake = next(t for t in scraped if t["name"] == "fake")
    assert fake["url"] == f"http://watchdog:{MASK}@127.0.0.1:{fport}"
    assert '"argv": [' in outputs["watchdog log"].decode() and MASK in outputs["watchdog log"].decode()


# -- the redactor itself (no vLLM) ------------------------------------------------------------------------


def test_secret_names_are_words_not_substrings() -> None:
    secret = ["--api-key", "--hf-token", "HF_TOKEN", "VLLM_API_KEY", "x-api-key", "Authorization", "cookie",
              "proxy-authorization", "api_token", "password", "db_pass_word_secret"]  # fmt: skip
    plain = [
        "--tokenizer",
        "max_tokens",
        "--max-num-batched-tokens",
        "spec_key",
        "session",
        "keyword",
        "--port",
    ]
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []


def test_shapes_are_masked_whatever_the_value() -> None:
    r = Redactor()
    cases = {
        "relaunch vllm-0 with --api-key sk-1 --port 8000": f"relaunch vllm-0 with --api-key {MASK} --port 8000",
        "--tokenizer t --hf-token=hf_1 --enable-x": f"--tokenizer t --hf-token={MASK} --enable-x",
        "HF_TOKEN=hf_1 max_tokens=16": f"HF_TOKEN={MASK} max_tokens=16",
        "http://u:pw@h:1/x?token=t1&b=2": f"http://u:{MASK}@h:1/x?token={MASK}&b=2",
        "https://ghp_abc@github.com/x": f"https://{MASK}@github.com/x",
        "Authorization: Bearer abcdefgh123": f"Authorization: Bearer {MASK}",
        '{"password": "hunter22"}': f'{{"password": "{MASK}"}}',
        "missing bearer token": "missing bearer token",
        'Bearer realm="vllm-watchdog"': 'Bearer realm="vllm-watchdog"',
        "error: 12:30 at https://host:8000/metrics": "error: 12:30 at https://host:8000/metrics",
    }
    assert {k: r.text(k) for k in cases} == cases
    data = {
        "argv": ["vllm", "serve", "--api-key", "sk-1", "--port", "1"],
        "headers": {"Authorization": "Bearer x", "X-Team": "infra"},
        "n": 3,
    }
    assert r.value(data) == {
        "argv": ["vllm", "serve", "--api-key", MASK, "--port", "1"],
        "headers": {"Authorization": MASK, "X-Team": "infra"},
        "n": 3,
    }


def test_every_secret_of_the_config_is_known_by_value() -> None:
    cfg = parse_config(
        f"""
api_token: {SECRETS["api_token"]}
targets:
  - name: a
    url: "http://u:{SECRETS["URL password"]}@127.0.0.1:8000"
    canary: {{api_key: "{SECRETS["canary api_key"]}"}}
    command: [vllm, serve, "--api-key={SECRETS["--api-key on a command line"]}"]
    env: {{HF_TOKEN: "{SECRETS["secret env value"]}", HF_HUB_OFFLINE: "1"}}
notifiers:
  - {{type: webhook, url: "http://127.0.0.1:1/", headers: {{Authorization: "Bearer {SECRETS["notifier header"]}"}}}}
  - type: alertmanager
    url: "https://127.0.0.1:2/"
    basic_auth: {{username: watchdog, password: "{SECRETS["notifier basic_auth password"]}"}}
gateway: {{priority: {{api_keys: {{{CLIENT_KEY}: batch}}}}}}
""",
        "c.yml",
        env={},
    )
    known = config_secrets(cfg)
    assert set(SECRETS.values()) | {CLIENT_KEY} <= set(known)
    assert "1" not in known and "u" not in known
    r = Redactor.of(known)
    text = " ".join(SECRETS.values()) + " " + CLIENT_KEY
    assert r.text(text) == " ".join([MASK] * (len(SECRETS) + 1))
    assert Redactor.of(["short"]).text("short") == "short"  # too short to mask by value: only by shape
    assert r.bytes(f'x{{session="{CLIENT_KEY}"}} 1'.encode()) == f'x{{session="{MASK}"}} 1'.encode()


def test_log_lines_are_masked_in_message_fields_and_tracebacks() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("debug", stream=stream, fmt="json")
        logs.use_secrets([SECRETS["api_token"]])
        log = logging.getLogger("test.redact")
        log.info("action step", extra={"argv": ["vllm", "--api-key", "sk-9"], "url": "http://u:pw@h/"})
        log.debug("token %s seen", SECRETS["api_token"])
        try:
            raise ValueError(f"bad {SECRETS['api_token']}")
        except ValueError:
            log.exception("failed")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["argv"] == ["vllm", "--api-key", MASK] and lines[0]["url"] == f"http://u:{MASK}@h/"
    assert lines[1]["msg"] == f"token {MASK} seen"
    assert lines[2]["exc"].endswith(f"ValueError: bad {MASK}")
    assert SECRETS["api_token"] not in stream.getvalue()
