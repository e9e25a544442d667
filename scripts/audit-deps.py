"""Audit the packages installed in the watchdog's venv for known vulnerabilities; tolerant of no network.

Usage: .venv/bin/python scripts/audit-deps.py [--offline] [--python .venv/bin/python] [--installed FILE]

Online, with pip-audit installed (in the venv, on PATH, or --pip-audit) and PyPI answering within --timeout
seconds, pip-audit checks the installed set against PyPI's advisory data. Otherwise, and always in addition,
the set is checked against the committed snapshot security/advisories.toml. The output's first line says
which was used and why. Advisories in security/audit-ignore.txt (with a reason each) are reported, not failed.

Exit status: 0 nothing known, 1 a known vulnerability is installed, 2 the audit itself could not run.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
OWN = "vllm-watchdog"  # the project itself: not on PyPI under this name, and audited by its own tests
PROBE_URL = "https://pypi.org/pypi/pip/json"
LIST_INSTALLED = (
    "import importlib.metadata as m, json;"
    "print(json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions()"
    " if d.metadata['Name']})))"
)


class AuditError(Exception):
    """The audit could not run (unreadable snapshot or ignore list, no interpreter)."""


@dataclass(frozen=True)
class Finding:
    """A known vulnerability of an installed package."""

    package: str
    version: str
    id: str
    summary: str
    source: str  # "snapshot" or "pip-audit"


def canonical(name: str) -> str:
    """A package name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_from_python(python: str) -> dict[str, str]:
    """{name: version} of every distribution the interpreter `python` sees."""
    try:
        out = subprocess.run(
            [python, "-c", LIST_INSTALLED], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise AuditError(f"cannot list the packages of {python}: {exc}") from None
    return {canonical(n): v for n, v in json.loads(out)}


def installed_from_file(path: Path) -> dict[str, str]:
    """{name: version} from `name==version` lines (comments and blank lines skipped)."""
    out = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise AuditError(f"{path}:{n}: want name==version, got {line!r}")
        out[canonical(name.strip())] = version.strip()
    return out


def load_ignores(path: Path) -> dict[tuple[str, str], str]:
    """{(advisory id, package): reason} from `ID package reason...` lines."""
    out: dict[tuple[str, str], str] = {}
    if not path.exists():
        return out
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise AuditError(f"{path}:{n}: want `ID package reason`, and the reason is required: {line!r}")
        out[(parts[0], canonical(parts[1]))] = parts[2]
    return out


def snapshot_findings(installed: dict[str, str], path: Path) -> tuple[list[Finding], str]:
    """The snapshot's advisories that match an installed version, and the snapshot's date."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AuditError(f"cannot read the advisory snapshot {path}: {exc}") from None
    found = []
    for i, adv in enumerate(doc.get("advisory", [])):
        try:
            name, ident, affected = canonical(adv["package"]), adv["id"], adv["affected"]
            ranges = [SpecifierSet(r.strip()) for r in affected.split("||")]
        except (KeyError, InvalidSpecifier) as exc:
            raise AuditError(f"{path}: advisory {i + 1}: {exc!r}") from None
        version = installed.get(name)
        if version is None:
            continue
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        if any(r.contains(parsed, prereleases=True) for r in ranges):
            found.append(Finding(name, version, ident, str(adv.get("summary", "")), "snapshot"))
    return found, str(doc.get("updated", "unknown"))


def find_pip_audit(given: str | None, python: str | None) -> str | None:
    """pip-audit: as given, next to the audited interpreter, or on PATH."""
    if given:
        return given
    if python:
        beside = Path(python).parent / "pip-audit"
        if beside.exists():
            return str(beside)
    return shutil.which("pip-audit")


def pypi_answers(timeout: float) -> str | None:
    """None if PyPI answers within `timeout` seconds, else why not."""
    try:
        with urllib.request.urlopen(PROBE_URL, timeout=timeout) as resp:
            resp.read(1)
    except OSError as exc:
        return str(getattr(exc, "reason", exc))
    return None


def pip_audit_findings(
    tool: str, installed: dict[str, str], ignores: dict[tuple[str, str], str], timeout: float
) -> tuple[list[Finding], list[str], str | None]:
    """pip-audit's findings on exactly the installed set; the packages it could not audit; an error."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as reqs:
        reqs.write("".join(f"{n}=={v}\n" for n, v in sorted(installed.items())))
        reqs.flush()
        cmd = [tool, "--disable-pip", "--no-deps", "-r", reqs.name, "--vulnerability-service", "pypi"]
        cmd += ["--format", "json", "--progress-spinner", "off", "--timeout", str(int(max(timeout, 1)))]
        cmd += [arg for ident, _ in ignores for arg in ("--ignore-vuln", ident)]
        try:
            done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [], [], f"pip-audit did not run: {exc}"
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return [], [], f"pip-audit failed (status {done.returncode}): {done.stderr.strip()[-500:]}"
    found, skipped = [], []
    for dep in doc.get("dependencies", []):
        if dep.get("skip_reason"):
            skipped.append(f"{dep.get('name')}: {dep['skip_reason']}")
            continue
        for vuln in dep.get("vulns", []):
            ident = vuln.get("id", "?")
            aliases = [ident, *vuln.get("aliases", [])]
            ids = " ".join(aliases)
            summary = (vuln.get("description") or "").strip().splitlines()[0:1]
            found.append(
                Finding(
                    canonical(dep["name"]), dep.get("version", "?"), ids, "".join(summary)[:120], "pip-audit"
                )
            )
    return found, skipped, None


def main(argv: list[str] | None = None) -> int:
    """Run the audit; print what was used and what was found."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"), help="the venv to audit")
    p.add_argument("--installed", type=Path, help="audit these name==version lines instead of a venv")
    p.add_argument("--offline", action="store_true", help="do not ask PyPI: the snapshot only")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds PyPI has to answer")
    p.add_argument("--snapshot", type=Path, default=ROOT / "security" / "advisories.toml")
    p.add_argument("--ignore", type=Path, default=ROOT / "security" / "audit-ignore.txt")
    p.add_argument("--pip-audit", help="the pip-audit executable")
    args = p.parse_args(argv)
    try:
        installed = (
            installed_from_file(args.installed) if args.installed else installed_from_python(args.python)
        )
        installed.pop(OWN, None)
        ignores = load_ignores(args.ignore)
        findings, updated = snapshot_findings(installed, args.snapshot)
    except AuditError as exc:
        print(f"audit-deps: {exc}", file=sys.stderr)
        return 2
    where = f"{len(installed)} packages of {args.installed or args.python}"
    snapshot = f"the advisory snapshot {args.snapshot.name} (updated {updated})"
    tool = None if args.offline else find_pip_audit(args.pip_audit, None if args.installed else args.python)
    if args.offline:
        print(f"mode: offline (--offline): {where} against {snapshot}")
    elif tool is None:
        print(f"mode: offline (pip-audit is not installed): {where} against {snapshot}")
    elif (why := pypi_answers(args.timeout)) is not None:
        why = f"PyPI did not answer within {args.timeout:g}s: {why}"
        print(f"mode: offline ({why}): {where} against {snapshot}")
    else:
        online, skipped, error = pip_audit_findings(tool, installed, ignores, args.timeout)
        if error is not None:
            print(f"mode: offline ({error}): {where} against {snapshot}")
        elif len(skipped) == len(installed):
            # pip-audit then says "No known vulnerabilities found" and exits 0: that would be no audit at all.
            print(f"mode: offline (pip-audit audited none: {skipped[0]}): {where} against {snapshot}")
        else:
            audited = len(installed) - len(skipped)
            print(f"mode: online (pip-audit via PyPI: {audited} of {where}) and {snapshot}")
            for line in skipped:
                print(f"  not audited online: {line}")
            findings += online
    failed: list[Finding] = []
    used: set[tuple[str, str]] = set()
    seen: dict[str, set[str]] = {}  # package -> advisory ids (and aliases) already reported
    for f in findings:
        ids = f.id.split()
        if seen.setdefault(f.package, set()) & set(ids):
            continue  # the same advisory from pip-audit and the snapshot
        seen[f.package] |= set(ids)
        key = next(((i, f.package) for i in ids if (i, f.package) in ignores), None)
        if key is not None:
            used.add(key)
            print(f"ignored: {f.package} {f.version} {f.id} ({f.source}): {ignores[key]}")
        else:
            failed.append(f)
            print(f"VULNERABLE: {f.package} {f.version} {f.id} ({f.source}): {f.summary}")
    for ident, package in sorted(set(ignores) - used):
        print(f"note: ignore entry {ident} {package} matches nothing installed; delete it")
    print(f"{len(failed)} known vulnerable, {len(used)} ignored, {len(installed)} packages audited")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
