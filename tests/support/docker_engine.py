"""The Docker engine for tests (a pytest plugin): a client, the empty host-runtime image, vLLM containers.

When no engine answers, the session starts `dockerd` itself (no bridge, no iptables: every test
container uses the host network) and stops it at the end; on xdist workers the first worker to need it starts
it, the others use it, and the run's starter stops it once all are done (tests/support/runshare.py). Every container a test creates carries
this session's label, and the session removes them all at its end, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from docker.errors import APIError, DockerException, NotFound

from tests.support import runshare
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.runtimes.docker import BACKUP_SUFFIX

ROOT = Path(__file__).resolve().parents[2]
ENGINE_TIMEOUT = 60.0
VLLM_READY_TIMEOUT = 600.0  # bounds a hang, not a speed: starts beside 5 others on 2 cores took 283 s
SESSION_LABEL = "vllm-watchdog.test-session"
SESSION = uuid.uuid4().hex[:12]
HOST_RUNTIME = ("/usr", "/lib", "/lib64", "/bin")  # enough for the host's /usr/bin/python3
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def _answering_client() -> Any:
    """A client on the engine that DOCKER_HOST (or the default socket) names, or None if none answers."""
    try:
        client = docker.from_env(timeout=120)  # asks the engine for its API version
    except DockerException:
        return None
    try:
        if client.ping():
            return client
    except (DockerException, OSError):
        pass
    client.close()
    return None


class Engine:
    """A connection to the Docker engine; starts dockerd when none answers, and stops only its own."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.client = self._connect()

    def _connect(self) -> Any:
        with runshare.exclusive("dockerd"):  # one worker starts it; the others find it answering
            return self._connect_or_start()

    def _connect_or_start(self) -> Any:
        client = _answering_client()
        if client is not None:
            return client
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        self.log_path = Path(tempfile.mkstemp(prefix="dockerd-test-", suffix=".log")[1])
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [dockerd, "--bridge=none", "--iptables=false", "--ip-masq=false"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if runshare.under_xdist():  # other workers will use it too: the run's starter stops it at the end
            runshare.record("dockerd", self.proc.pid)
        deadline = time.monotonic() + ENGINE_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                self.proc = None  # exited: maybe another session's dockerd won the race; keep waiting for it
            client = _answering_client()
            if client is not None:
                return client
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"no Docker engine after {ENGINE_TIMEOUT}s; dockerd log: {self.log_tail()}")

    def remove_session_containers(self) -> None:
        """Remove every container this session created (running or not)."""
        for found in self.client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={SESSION}"}):
            remove_container(self.client, found.id)

    def stop(self) -> None:
        """Stop dockerd if this session started it (on an xdist worker, the run's starter stops it)."""
        if self.proc is None or self.proc.poll() is not None or runshare.under_xdist():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log_tail(self, n: int = 3000) -> str:
        """The end of dockerd's log (empty when this session did not start it)."""
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker.DockerClient on a running engine; removes this session's containers at the end."""
    engine = Engine()
    try:
        yield engine.client
    finally:
        try:
            engine.remove_session_containers()
        finally:
            engine.client.close()
            engine.stop()


@pytest.fixture(scope="session")
def hostroot_image(docker_client: Any) -> str:
    """The empty image that containers fill with read-only bind mounts of the host (scripts/vllm-image.sh)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-image.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return out.stdout.strip().splitlines()[-1]


# A tiny server that answers every GET with the arguments it was started with (and $MODE).
ARGS_SERVER = """
import http.server, json, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
port = int(sys.argv[sys.argv.index("--port") + 1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"args": sys.argv[1:], "mode": os.environ.get("MODE")}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


class ServerContainers:
    """Cheap containers running ARGS_SERVER with the host's python; close() removes them and their backups."""

    def __init__(self, client: Any, image: str) -> None:
        self.client = client
        self.image = image
        self.names: list[str] = []

    def run(self, **options: Any) -> tuple[str, int]:
        """Start one (options go to `containers.run`) and wait until it answers; its name and port."""
        name, port = unique_name("server"), free_port()
        kwargs: dict[str, Any] = {
            "name": name,
            "entrypoint": ["/usr/bin/python3", "-c", ARGS_SERVER],
            "command": ["--port", str(port), "--flavour", "a"],
            "environment": {"MODE": "plain"},
            "volumes": host_binds(),
            "network_mode": "host",
            "labels": session_labels(),
            "detach": True,
            **options,
        }
        self.client.containers.run(self.image, **kwargs)
        self.names += [name, name + BACKUP_SUFFIX]
        wait_http(self.client, name, f"http://127.0.0.1:{port}/", timeout=60)
        return name, port

    def inspect(self, name: str) -> dict[str, Any]:
        """`docker inspect` of a container."""
        return dict(self.client.containers.get(name).attrs)

    def close(self) -> None:
        """Remove every container this helper created, whatever state they are in."""
        for name in self.names:
            remove_container(self.client, name)


@pytest.fixture
def server_containers(docker_client: Any, hostroot_image: str) -> Iterator[ServerContainers]:
    """Cheap server containers for one test, removed at its end."""
    helper = ServerContainers(docker_client, hostroot_image)
    yield helper
    helper.close()


def remove_container(client: Any, ref: str, attempts: int = 10) -> None:
    """Force-remove a container, retrying (bounded) while the engine cannot kill it yet.

    A vLLM whose main process has exited while its engine process is still dying is a zombie for a
    moment, and `docker rm -f` refuses it until the kernel has reaped the rest."""
    for attempt in range(attempts):
        try:
            client.containers.get(ref).remove(force=True)
            return
        except NotFound:
            return
        except APIError:
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def session_labels(**more: str) -> dict[str, str]:
    """Labels every test container carries, so that the session can remove them all."""
    return {SESSION_LABEL: SESSION, **more}


def unique_name(prefix: str) -> str:
    """A container name no other test or session uses."""
    return f"{prefix}-{SESSION}-{uuid.uuid4().hex[:6]}"


def host_binds(paths: Sequence[str] = HOST_RUNTIME) -> list[str]:
    """Read-only bind mounts of host paths at the same place (symlinks such as /bin resolve on the host)."""
    return [f"{p}:{p}:ro" for p in paths if os.path.exists(p)]


@dataclass(frozen=True)
class VllmRuntime:
    """The host's vllm-cpu install and model, as a container sees them through bind mounts."""

    python: str  # the venv's python
    mounts: tuple[str, ...]  # host paths to bind read-only
    model: str
    modelinfos: str  # the host's vLLM model-info cache, bound writable at the same path

    @classmethod
    def from_setup(cls) -> VllmRuntime:
        """Install (or find cached) vllm-cpu and the model with the project's setup scripts."""
        python = _last_line(["bash", str(ROOT / "scripts" / "setup-vllm.sh")])
        model = _last_line(["bash", str(ROOT / "scripts" / "setup-model.sh")])
        venv = Path(python).parent.parent
        home = _pyvenv_home(venv / "pyvenv.cfg")
        # The venv's python is a symlink into the base install (pyenv: <root>/versions/X.Y.Z/bin).
        base = str(Path(home).parent)
        mounts = [*HOST_RUNTIME, "/etc", str(venv), model]
        if not base.startswith("/usr/"):
            mounts.append(base)
        modelinfos = _vllm_cache_root() / "modelinfos"
        modelinfos.mkdir(parents=True, exist_ok=True)
        return cls(python=python, mounts=tuple(mounts), model=model, modelinfos=str(modelinfos))

    def create_kwargs(self, image: str, name: str, port: int, extra_args: Sequence[str]) -> dict[str, Any]:
        """Arguments for `client.containers.create` that run vLLM like scripts/serve-vllm.sh does."""
        args = [
            "--model", self.model, "--served-model-name", "tiny-llama", "--host", "127.0.0.1",
            "--port", str(port), "--max-model-len", "2048", "--enforce-eager", *extra_args,
        ]  # fmt: skip
        return {
            "image": image,
            "name": name,
            "entrypoint": [self.python, "-m", "vllm.entrypoints.openai.api_server"],
            "command": args,
            # Without its model-info cache vLLM inspects the model class in a subprocess that imports torch
            # and vLLM once more (15 CPU-s here, of a start's 45); the host's vLLM fills the same cache.
            "environment": {**VLLM_ENV, "VLLM_CACHE_ROOT": str(Path(self.modelinfos).parent)},
            "volumes": [*host_binds(self.mounts), f"{self.modelinfos}:{self.modelinfos}:rw"],
            "network_mode": "host",
            "ipc_mode": "host",
            "init": True,  # reaps vLLM's engine-core child, so a stopped container leaves no zombie
            "labels": session_labels(),
            "detach": True,
        }


def _vllm_cache_root() -> Path:
    """Where the host's vLLM keeps its caches (vllm/envs.py: VLLM_CACHE_ROOT, else the XDG cache's vllm/)."""
    if root := os.environ.get("VLLM_CACHE_ROOT"):
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vllm"


def _last_line(cmd: list[str]) -> str:
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def _pyvenv_home(cfg: Path) -> str:
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return value.strip()
    raise RuntimeError(f"{cfg} names no base interpreter (home = ...)")


@pytest.fixture(scope="session")
def vllm_runtime() -> VllmRuntime:
    """The vllm-cpu venv, its base interpreter and the model, ready to bind-mount into a container."""
    return VllmRuntime.from_setup()


def wait_http(client: Any, name: str, url: str, timeout: float) -> float:
    """Poll `url` until it answers 200; fails early, with the container's log, if the container exits.

    Returns the seconds it took."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        found = client.containers.get(name)
        if not found.attrs["State"]["Running"]:
            raise RuntimeError(f"container {name} exited: {container_log(found)}")
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout}s: {container_log(client.containers.get(name))}")


def wait_exited(client: Any, name: str, timeout: float) -> dict[str, Any]:
    """Wait (bounded) until the container named `name` has stopped; its State, with `ExitCode` the code this
    exit ended with. A restart policy may already have started the container again by the time State is
    read, and a running container's State says ExitCode 0: the code comes from Docker's answer to the wait."""
    found = client.containers.get(name)
    code = found.wait(timeout=timeout)["StatusCode"]
    found.reload()
    return {**found.attrs["State"], "ExitCode": code}


def container_log(found: Any, n: int = 3000) -> str:
    """The end of a container's output."""
    try:
        return str(found.logs(stdout=True, stderr=True)[-n:].decode(errors="replace"))
    except DockerException as exc:
        return f"(no log: {exc})"
