"""issue 24 item 2, second half: how many one-token changes to a policy file do the fast tests
notice? Mutation testing with mutmut (from PyPI: ``pip install mutmut``; not a project
dependency) of ``mediator/core/match.py`` against the matcher's fast unit tests.

mutmut mutates the file's functions one change at a time (an operator, a constant, a comparison,
a returned value …) and runs the tests that reach the function; a mutant is *killed* when a test
fails, *survived* when all pass, *no tests* when no selected test reaches that function. The score
is killed ÷ (killed + survived): what the tests say about the code they run. Survivors, by
function, say where a test is missing (``mutmut show NAME`` in the work folder prints the diff).

The tree (``git archive HEAD``: committed files only) is copied to a throw-away folder, because
mutmut writes a ``mutants/`` copy beside the code. The fast tests need no database.

Run: ``.venv/bin/python bench/bench_mutation.py [--file mediator/core/match.py] [--tests T ...]
[--jobs N] [--keep]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = (
    "tests/unit/test_match.py",
    "tests/unit/test_match_width.py",
    "tests/unit/test_match_index.py",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default="mediator/core/match.py", help="the file to mutate")
    ap.add_argument("--tests", nargs="+", default=list(TESTS), help="the tests to run")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (mutmut show)")
    args = ap.parse_args()
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if mutmut is None:
        print("bench_mutation: mutmut is not installed (pip install mutmut)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-mutation-"))
    try:
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        tests = "\n    ".join(args.tests)
        (work / "setup.cfg").write_text(
            "[mutmut]\n"
            f"source_paths={args.file}\n"
            # the rest of the package beside the mutated file, or ``mediator`` in mutants/
            # would shadow the installed one with only that file in it
            "also_copy=mediator\n    sim\n    tests\n    pyproject.toml\n"
            f"pytest_add_cli_args_test_selection={tests}\n"
        )
        started = time.perf_counter()
        run = subprocess.run([mutmut, "run", "--max-children", str(args.jobs)], cwd=work,
                             capture_output=True, text=True)  # fmt: skip
        took = time.perf_counter() - started
        if run.returncode != 0:
            print(run.stdout[-3000:] + run.stderr[-3000:], file=sys.stderr)
            return 2
        listed = subprocess.run([mutmut, "results", "--all", "true"], cwd=work,
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        found = re.findall(r"^\s*(\S+?)__mutmut_\d+: (.+)$", listed, re.M)
        status = Counter(s for _, s in found)
        killed, survived = status["killed"], status["survived"]
        print(f"mutation testing of {args.file} against {', '.join(args.tests)}")
        print(f"  {len(found)} mutants in {took:.0f} s ({args.jobs} worker(s), load average "
              f"{os.getloadavg()[0]:.1f}): " + ", ".join(f"{n} {s}" for s, n in
                                                         status.most_common()))  # fmt: skip
        if killed + survived:
            print(f"  score: {killed} / {killed + survived} = {killed / (killed + survived):.1%} "
                  "of the mutants the tests reach are killed")  # fmt: skip
        print("  survivors by function:")
        for fn, n in Counter(f for f, s in found if s == "survived").most_common():
            print(f"    {n:4d}  {fn.replace('.x_', '.', 1)}")
        if args.keep:
            print(f"  work folder: {work} (mutmut show NAME there)")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
