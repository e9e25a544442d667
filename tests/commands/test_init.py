"""`vllm-watchdog init`: finds a (fake) vLLM listening on this host through /proc/net/tcp and a probe, writes
a config that `check` passes, monitoring only, and never overwrites a file."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from pathlib import Path

import pytest

from tests.support.faultserver import FaultServer
from tests.support.vllm_server import ROOT
from vllm_watchdog.cli import main
from vllm_watchdog.commands.discover import Discovery, docker_ports, listening
from vllm_watchdog.commands.init import parse_ports, render
from vllm_watchdog.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

METRICS = (ROOT / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt").read_text()

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0A00000A:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:1F42 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4 1
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000001000000:1F43 00000000000000000000000000000000:0000 0A 00000000:00000000
   1: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000
   2: 000080FE00000000FF005452E3A2C1FE:1F44 00000000000000000000000000000000:0000 0A 00000000:00000000
"""


def test_listening_sockets_on_loopback_or_every_address_are_candidates() -> None:
    # 8000 on 127.0.0.1 (and on :: too: asked on 127.0.0.1), 8080 on 0.0.0.0, 8003 on ::1; not 8001 on
    # 10.0.0.10, not 8002 (an established connection), not 8004 on a link-local address
    assert listening([("4", TCP), ("6", TCP6)]) == {8000: "127.0.0.1", 8080: "127.0.0.1", 8003: "[::1]"}


def test_init_finds_a_fake_vllm_and_check_passes_on_what_it_wrote(
    tmp_path: Path, fault: FaultServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fault.vllm_like(METRICS, model="tiny-llama")
    out = tmp_path / "watchdog.yml"
    # --ports: only the fake is asked, not the servers other tests run on this host meanwhile
    assert main(["init", "-o", str(out), "--ports", f"{fault.port},1-3"]) == EXIT_OK
    text = out.read_text()
    assert f"url: http://127.0.0.1:{fault.port}" in text and "# serves tiny-llama" in text
    assert "Found 1 vLLM server listening" in text
    assert "\nactions:" not in text and "\nroutes:" not in text and "\ninclude:" not in text  # watch only
    assert "# routes:" in text and "# include:" in text  # the examples, commented
    assert f"found vLLM at http://127.0.0.1:{fault.port}" in capsys.readouterr().err
    assert main(["check", str(out)]) == EXIT_OK
    assert f"{out}: OK: 1 targets" in capsys.readouterr().out

    out.write_text("mine\n")
    assert main(["init", "-o", str(out), "--ports", str(fault.port)]) == EXIT_FAILED
    assert out.read_text() == "mine\n" and "not overwritten" in capsys.readouterr().err


def test_a_server_that_is_not_vllm_is_left_out(
    tmp_path: Path, fault: FaultServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fault.set("/metrics", "# TYPE http_requests_total counter\nhttp_requests_total 3\n")
    fault.set("/v1/models", {"object": "list", "data": [{"id": "other", "owned_by": "llamacpp"}]})
    assert main(["init", "--ports", str(fault.port)]) == EXIT_OK
    text = capsys.readouterr().out
    assert "No vLLM answered" in text and "url: http://127.0.0.1:8000" in text
    out = tmp_path / "c.yml"
    out.write_text(text)
    assert main(["check", str(out)]) == EXIT_OK


def test_port_lists() -> None:
    assert parse_ports("8000,8080-8082") == {8000, 8080, 8081, 8082}
    with pytest.raises(ValueError, match="not a port"):
        parse_ports("0-5")
    assert main(["init", "--ports", "eighty"]) == EXIT_USAGE


class _Engine(http.server.BaseHTTPRequestHandler):
    """A Docker engine's GET /containers/json, as much of it as init reads."""

    def do_GET(self) -> None:
        body = json.dumps(
            [
                {"Names": ["/vllm"], "Ports": [{"PrivatePort": 8000, "PublicPort": 18000, "Type": "tcp"}]},
                {"Names": ["/vllm-host"], "Ports": [], "Command": "python -m vllm.entrypoints --port 18001"},
                {"Names": ["/db"], "Ports": [{"PrivatePort": 5432, "Type": "tcp"}]},  # not published
            ]
        ).encode()
        self.send_response(200 if self.path == "/containers/json" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def address_string(self) -> str:
        """A unix socket's peer has no host."""
        return "unix"


def test_docker_containers_name_their_ports_and_no_engine_is_no_error(tmp_path: Path) -> None:
    path = str(tmp_path / "docker.sock")
    server = socketserver.ThreadingUnixStreamServer(path, _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert docker_ports(path) == {18000: "vllm", 18001: "vllm-host"}
    finally:
        server.shutdown()
        server.server_close()
    assert docker_ports(str(tmp_path / "none.sock")) == {}  # Docker is optional: quietly nothing


def test_the_listen_address_is_free_or_chosen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """9460 unless something listens there already (another watchdog): then the next free port, said so;
    `--listen` writes the operator's; what is written passes `check`."""
    assert "\nlisten: 127.0.0.1:9460 " in render(Discovery(), "c.yml", "h", "now")
    busy = render(Discovery(taken=frozenset({9460, 9461})), "c.yml", "h", "now")
    assert "\nlisten: 127.0.0.1:9462 " in busy and "(127.0.0.1:9460 is taken on this host)" in busy
    out = tmp_path / "c.yml"
    assert main(["init", "-o", str(out), "--ports", "1", "--listen", "127.0.0.1:9555"]) == EXIT_OK
    assert "\nlisten: 127.0.0.1:9555 " in out.read_text()
    assert main(["check", str(out)]) == EXIT_OK
    assert main(["init", "--ports", "1", "--listen", "9555"]) == EXIT_USAGE
    assert "--listen: expected HOST:PORT" in capsys.readouterr().err
