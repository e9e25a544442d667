"""The demo's screen: the `vllm-watchdog top` table redrawn under way, with the agent's phase lines.

On a terminal the table is redrawn every 2 s with the latest phase lines under it; when piped, the lines are
printed as they come and the table once after each phase (what docs/demo.md shows).
"""

from __future__ import annotations

import sys
import threading
import time

import httpx

from vllm_watchdog.commands.top import CLEAR, TopError, fetch, render


class Screen:
    """Phase lines under a live table (on a terminal), or lines and a table per phase (when piped)."""

    def __init__(self, api: str, live: bool) -> None:
        self.api = api
        self.live = live
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        """One phase line (timestamped)."""
        text = f"{time.strftime('%H:%M:%S')}  {line}"
        with self._lock:
            self.lines.append(text)
        if not self.live:
            print(text, flush=True)

    def frame(self, color: bool) -> str:
        """The top table now, or why it cannot be read."""
        try:
            with httpx.Client(timeout=5.0, trust_env=False) as client:
                frame: str = render(fetch(client, self.api, actions=6), time.time(), actions=6, color=color)
                return frame
        except TopError as exc:
            return f"(watchdog API not readable: {exc})\n"

    def snapshot(self) -> None:
        """Print the table once (piped output: after each phase)."""
        if not self.live:
            print("\n" + self.frame(color=False), flush=True)

    def start(self) -> None:
        """Redraw the table and the phase lines every 2 s (terminal only)."""
        if not self.live:
            return

        def loop() -> None:
            while not self._stop.is_set():
                frame = self.frame(color=True)
                with self._lock:
                    tail = self.lines[-14:]
                sys.stdout.write(CLEAR + frame + "\nDEMO\n" + "\n".join(f"  {ln}" for ln in tail) + "\n")
                sys.stdout.flush()
                self._stop.wait(2.0)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop redrawing and print every phase line once more, below the last frame."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            print("\n".join(self.lines), flush=True)
