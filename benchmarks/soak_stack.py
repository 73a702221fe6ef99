"""Soak: the multi-service stack suite (tests/stack: PostgreSQL, mlflow server, airflow standalone) run
again and again, each time on fresh services, to find the tests that fail one run in N. Not in CI: one
run takes about 17 minutes on a 2-core machine.

    .venv/bin/python benchmarks/soak_stack.py [--runs 10] [-k EXPRESSION] [--log-dir soak-logs]

Prints one row per run (result, duration, the tests that failed) and the pass count; each run's pytest
output is kept in the log folder, so a failure can be read afterwards.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="how many times to run the suite (default 10)")
    parser.add_argument("-k", dest="expression", help="only the stack tests matching this pytest -k expression")
    parser.add_argument("--log-dir", type=Path, default=Path("soak-logs"), help="where each run's output goes")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/stack"]
    if args.expression:
        command += ["-k", args.expression]
    print(f"{'run':>3}  {'result':<7} {'minutes':>7}  summary / failed tests", flush=True)
    passed = 0
    for number in range(1, args.runs + 1):
        log = args.log_dir / f"run-{number:02d}.log"
        started = time.monotonic()
        with log.open("w") as out:
            code = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        minutes = (time.monotonic() - started) / 60
        text = log.read_text(errors="replace")
        failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)))
        summary = (re.findall(r"^=* ?(\d+ (?:passed|failed|error).* in [\d.]+s.*?) ?=*$", text, re.MULTILINE) or [f"exit {code}"])[-1]
        passed += code == 0
        print(f"{number:>3}  {'pass' if code == 0 else 'FAIL':<7} {minutes:>7.1f}  {summary}", flush=True)
        for name in failed:
            print(f"{'':>20}{name}", flush=True)
    print(f"\n{passed} of {args.runs} runs passed (logs in {args.log_dir})")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
