"""Where the daemon's CPU goes, for bench/scrape.py --profile: py-spy samples grouped by activity.

py-spy records the daemon (on-CPU samples only) in raw collapsed form: one line per stack, frames
outermost first, "func (path:line);...;func (path:line) count". Rule evaluation, the self feed and the API
claim every stack with one of their frames (the store reads a rule makes are rule evaluation); any other
stack goes to the first INNER rule that one of its frames matches, so the scrape splits into parse, store
append, HTTP client and the rest of ingest. Samples waiting in epoll are idle and left out.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

PYSPY = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "py-spy"
RATE = 100  # samples a second
OWNERS = (  # (activity, path fragment): a frame anywhere in the stack gives the whole stack this activity
    ("rules: evaluation (promql)", "watchdog/promql/"),
    ("rules: ruler (alert state, labels, templates)", "watchdog/ruler/"),
    ("self feed (own metrics into the store)", "watchdog/sources/selffeed"),
    ("self feed (own metrics into the store)", "watchdog/service/selfmetrics"),
    ("API (/metrics etc.)", "watchdog/api/"),
)
INNER = (  # (activity, path fragment): the innermost matching frame decides
    ("scrape: parse exposition", "watchdog/sources/exposition.py"),
    ("scrape: store append", "watchdog/store.py"),
    ("scrape: HTTP client (httpx, h11, sockets)", "(httpx/"),
    ("scrape: HTTP client (httpx, h11, sockets)", "(httpcore/"),
    ("scrape: HTTP client (httpx, h11, sockets)", "(h11/"),
    ("scrape: HTTP client (httpx, h11, sockets)", "(anyio/"),
    ("scrape: HTTP client (httpx, h11, sockets)", "watchdog/sources/httpget.py"),
    ("scrape: ingest (series cache, limits, labels)", "watchdog/sources/"),
    ("scheduling (asyncio loop, timers)", "(asyncio/"),
    ("scheduling (asyncio loop, timers)", "watchdog/service/"),
)


def start(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """Record `pid` for `seconds` into `out` (raw collapsed stacks); None if py-spy is missing."""
    if not PYSPY.exists():
        print(f"no {PYSPY}: no profile", flush=True)
        return None
    argv = [str(PYSPY), "record", "--pid", str(pid), "--duration", f"{max(1, round(seconds))}"]
    argv += ["--rate", str(RATE), "--format", "raw", "--nonblocking", "-o", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def activity(stack: list[str]) -> str:
    """The activity one stack (frames outermost first) is charged to."""
    for name, frag in OWNERS:
        if any(frag in f for f in stack):
            return name
    for name, frag in INNER:
        if any(frag in f for f in stack):
            return name
    return "other (gc, logging, startup)"


def breakdown(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """(samples per activity, samples per innermost watchdog function, total samples) of one recording."""
    acts: Counter[str] = Counter()
    funcs: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        stack, n = stack_text.split(";"), int(count)
        if "(selectors.py" in stack[-1]:
            continue  # waiting in epoll: idle, not CPU
        total += n
        acts[activity(stack)] += n
        ours = [f for f in stack if "watchdog/" in f]
        if ours:
            func, _, where = ours[-1].partition(" (")
            funcs[f"{func} ({where.rsplit('/', 1)[-1].split(':')[0]})"] += n
    return acts, funcs, total


def report(path: Path, cpu_pct: float) -> dict[str, float]:
    """Print the breakdown as shares of the samples and as % of one core (the share of the daemon's CPU
    measured from /proc: on a loaded machine py-spy also samples a runnable thread waiting for a core, so
    its sample count overstates CPU, while the shares hold); return % of a core by activity."""
    if not path.exists():
        print(f"profile: {path} was not written")
        return {}
    acts, funcs, total = breakdown(path)
    print(f"\nprofile ({path.name}, py-spy {RATE} Hz, {total} samples; daemon CPU {cpu_pct:.1f}% of a core):")
    for name, n in acts.most_common():
        share = n / max(total, 1)
        print(f"  {name:<50}{100 * share:5.1f}%  {share * cpu_pct:6.2f}% of a core")
    print("  hottest innermost watchdog functions:")
    for name, n in funcs.most_common(12):
        print(f"    {name:<70}{100 * n / max(total, 1):5.1f}%")
    return {name: n / max(total, 1) * cpu_pct for name, n in acts.items()}
