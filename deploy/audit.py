"""Dependency audit: pip-audit over the installed environment (.venv) against PyPI's vulnerability data.

Known vulnerabilities that cannot be fixed yet go in deploy/audit-ignore.txt, one id per line with the
reason after a ``#``. Exit codes: 0 clean, 1 vulnerable (or pip-audit failed), 3 not audited because no
vulnerability database answered (as on our build machines, whose network reaches only the package
indexes); ``make audit`` turns 3 into a loud notice unless HORUS_AUDIT_REQUIRED=1.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE = "https://pypi.org/pypi/pip/24.0/json"  # what pip-audit asks PyPI for: one release's vulnerabilities
NOT_AUDITED = 3


def ignored(path: Path = HERE / "audit-ignore.txt") -> list[str]:
    ids = []
    for line in path.read_text().splitlines():
        vuln_id, _, reason = line.partition("#")
        if vuln_id.strip():
            if not reason.strip():
                raise SystemExit(f"{path}: {vuln_id.strip()} needs its reason after '#'")
            ids.append(vuln_id.strip())
    return ids


def database_reachable() -> str | None:
    """None when PyPI answers per-release vulnerability queries, else why not."""
    try:
        with urllib.request.urlopen(PROBE, timeout=15) as answer:
            return None if answer.status == 200 else f"{PROBE} answered {answer.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{PROBE}: {exc}"


def main(pip_audit: str, site_packages: str) -> int:
    problem = database_reachable()
    if problem is not None:
        print(f"NOT AUDITED: no vulnerability database reachable ({problem})", file=sys.stderr)
        return NOT_AUDITED
    command = [pip_audit, "--path", site_packages, "--strict", "--skip-editable", "--desc", "on", "--progress-spinner", "off"]
    for vuln_id in ignored():
        command += ["--ignore-vuln", vuln_id]
    return 0 if subprocess.run(command, check=False).returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sysconfig.get_paths()["purelib"]))
