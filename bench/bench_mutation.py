"""issue 24 item 2, second half: how many one-token changes to the policy code do the tests notice,
and how many does the scheduler gate notice? Mutation testing with mutmut (a dev extra).

mutmut mutates a file's functions one change at a time (an operator, a constant, a comparison,
a returned value …) and runs the tests that reach the function; a mutant is *killed* when a test
fails, *survived* when all pass, *no tests* when no selected test reaches that function. The score
is killed ÷ (killed + survived): what the tests say about the code they run. Survivors, by
function, say where a test is missing (``mutmut show NAME`` in the work folder, ``--keep``).

Two judges, reported separately (docs/performance.md "Mutation testing of the policy code"):

- **the fast tests** (default): per file, the test files that exercise it (``TESTS``: unit tests
  for the pure core, the relevant ``tests/db`` files for the flows — the machine's two cores are
  shared, so each mutant runs only those);
- **the gate** (``--gate``): ``bench/gate_judge.py``, which is ``python -m sim check --baseline
  sim-baseline`` as one test. A gate run takes ~40 s, so ``--sample N`` judges N mutants drawn
  (``--seed``) from those the fast tests reach, and ``--from DIR`` takes the list of a kept fast
  run's folder so the same mutants are judged by both.

The tree (``git archive HEAD``: committed files only) is copied to a throw-away folder, because
mutmut writes a ``mutants/`` copy beside the code. ``--budget S`` stops a file's run after S
seconds (what finished is reported; the machine is shared: time-box it). A flow's whole set is
hours on two cores, so ``--sample-tests N --seed S`` judges a uniform sample of N of the file's
mutants by the tests, with the Wilson interval of the file's score; ``--resume DIR`` goes on in a
kept folder.

Run: ``.venv/bin/python bench/bench_mutation.py [--file F ...] [--tests T ...] [--jobs N]
[--budget S] [--keep] [--sample-tests N --seed S]`` and ``… --gate --file F --sample 30 --from
DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from scipy.stats import binomtest  # type: ignore[import-untyped, unused-ignore]

from mediator.pg import EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[1]
# The flows are judged by the database tier's tests that drive them in this process (mutmut runs,
# for each mutant, only those of them that reach the mutated function); not the ones that start a
# server or enode process (a child runs the unmutated code), nor the fuzzer.
FLOW_TESTS = tuple(
    f"tests/db/test_{name}.py"
    for name in (
        "actions", "api", "event_order", "fleet_history", "floods", "gaps", "lifecycle",
        "node_id_errors", "promote_statement", "records_after_commit", "result_race",
        "run_counts", "statement_counts", "store", "store_cursors", "submit", "wake",
        "width_exact",
    )
)  # fmt: skip
TESTS: dict[str, tuple[str, ...]] = {
    "mediator/core/match.py": (
        "tests/unit/test_match.py",
        "tests/unit/test_match_width.py",
        "tests/unit/test_match_index.py",
        "tests/unit/test_match_messages.py",
        "tests/unit/test_match_search.py",
        "tests/unit/test_match_budget.py",
        "tests/unit/test_match_classes.py",
        "tests/unit/test_sweep_memo.py",
    ),
    "mediator/core/progress.py": (
        "tests/unit/test_progress.py",
        "tests/unit/test_progress_decisions.py",
    ),
    "mediator/core/states.py": (
        "tests/unit/test_states.py",
        "tests/unit/test_state_sql.py",
        "tests/unit/test_progress.py",
        "tests/unit/test_progress_decisions.py",
    ),
    "mediator/flows/sweep.py": (*FLOW_TESTS, "tests/unit/test_sweep_memo.py"),
    "mediator/flows/submit.py": FLOW_TESTS,
    "mediator/flows/advert.py": (*FLOW_TESTS, "tests/adversarial/test_python_interface.py"),
    "mediator/flows/steps.py": FLOW_TESTS,
}
GATE = "bench/gate_judge.py"


def mutmut_bin() -> str | None:
    return shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")


def workdir(file: str, tests: list[str]) -> Path:
    work = Path(tempfile.mkdtemp(prefix="bench-mutation-"))
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    listed = "\n    ".join(tests)
    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        f"source_paths={file}\n"
        # the rest of the package beside the mutated file, or ``mediator`` in mutants/
        # would shadow the installed one with only that file in it
        "also_copy=mediator\n    sim\n    tests\n    bench\n    sim-baseline\n    pyproject.toml\n"
        f"pytest_add_cli_args_test_selection={listed}\n"
        # a mutant that loops spends (its tests' time + 1 s) × this × 2 of CPU before it is
        # stopped (counted killed, "timeout"); mutmut's 15 made one such mutant cost minutes
        "timeout_multiplier=3\n"
    )
    return work


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion k/n (scipy's): what a sample's score says
    of the whole file's."""
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def results(mutmut: str, work: Path) -> list[tuple[str, str]]:
    listed = subprocess.run([mutmut, "results", "--all", "true"], cwd=work,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    return re.findall(r"^\s*(\S+__mutmut_\d+): (.+)$", listed, re.M)


def one_file(
    mutmut: str, file: str, tests: list[str], args: argparse.Namespace, env: dict[str, str]
) -> int:
    names: list[str] = []
    if args.gate:
        tests = [GATE]
        if args.from_dir:
            reached = [n for n, s in results(mutmut, Path(args.from_dir)) if s in
                       ("killed", "survived")]  # fmt: skip
            names = sorted(random.Random(args.seed).sample(reached, min(args.sample, len(reached))))
    work = Path(args.resume) if args.resume else workdir(file, tests)
    try:
        started = time.perf_counter()
        if not args.gate and args.sample_tests:
            # A uniform sample of the file's mutants: mutmut generates them all and maps the
            # tests to functions, then stops at a name that matches none (its exit status says
            # so, and is not an error here); then these run.
            subprocess.run([mutmut, "run", "--max-children", str(args.jobs), "no-such-mutant*"],
                           cwd=work, capture_output=True, env=env, check=False)  # fmt: skip
            every = [n for n, _ in results(mutmut, work)]
            names = sorted(random.Random(args.seed).sample(every, min(args.sample_tests,
                                                                      len(every))))  # fmt: skip
        try:
            run = subprocess.run([mutmut, "run", "--max-children", str(args.jobs), *names],
                                 cwd=work, capture_output=True, text=True, env=env,
                                 timeout=args.budget or None)  # fmt: skip
            failed = run.returncode != 0
            tail = run.stdout[-3000:] + run.stderr[-3000:]
        except subprocess.TimeoutExpired:
            failed, tail = False, ""
            print(f"  (stopped after the {args.budget:.0f} s budget)")
        took = time.perf_counter() - started
        if failed:
            print(tail, file=sys.stderr)
            return 2
        found = results(mutmut, work)
        if names:
            found = [(n, s) for n, s in found if n in set(names)]
        status = Counter(s for _, s in found)
        # a mutant stopped for running too long is killed (mutmut's own score counts it so)
        killed, survived = status["killed"] + status["timeout"], status["survived"]
        judge = "the gate (all sim-baseline cases)" if args.gate else ", ".join(tests)
        print(f"mutation testing of {file} judged by {judge}")
        print(f"  {len(found)} mutants in {took:.0f} s ({args.jobs} worker(s), load average "
              f"{os.getloadavg()[0]:.1f}): " + ", ".join(f"{n} {s}" for s, n in
                                                         status.most_common()))  # fmt: skip
        if killed + survived:
            print(f"  score: {killed} / {killed + survived} = {killed / (killed + survived):.1%} "
                  "of the mutants the tests reach are killed")  # fmt: skip
            if names:
                lo, hi = wilson(killed, killed + survived)
                print(f"  (a sample: 95 % Wilson interval {lo:.1%}–{hi:.1%})")
        print("  survivors by function:")
        for fn, n in Counter(f.rsplit("__mutmut_", 1)[0] for f, s in found
                             if s == "survived").most_common():  # fmt: skip
            print(f"    {n:4d}  {fn.replace('.x_', '.', 1)}")
        if args.keep:
            print(f"  work folder: {work} (mutmut show NAME there)")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", action="append", default=[], help="a file to mutate (repeatable; "
                    "default: the seven policy files)")  # fmt: skip
    ap.add_argument("--tests", nargs="+", default=[], help="the tests to run (default: TESTS)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budget", type=float, default=0.0, help="seconds per file (0: no limit)")
    ap.add_argument("--gate", action="store_true", help="judge by the scheduler gate")
    ap.add_argument("--sample", type=int, default=30, help="with --gate --from: mutants judged")
    ap.add_argument("--sample-tests", type=int, default=0, help="without --gate: judge this "
                    "many of the file's mutants, drawn uniformly (0: every one)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1, help="with --sample: which ones")
    ap.add_argument("--from", dest="from_dir", help="a kept fast run's work folder")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (mutmut show)")
    ap.add_argument("--resume", help="go on in a kept work folder (one --file; what finished "
                    "there stands)")  # fmt: skip
    args = ap.parse_args()
    if args.resume:
        args.keep = True
    mutmut = mutmut_bin()
    if mutmut is None:
        print("bench_mutation: mutmut is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    # One PostgreSQL cluster for the whole run: every mutant's pytest session (a fork running the
    # tests that reach the mutated function) would otherwise start its own, which costs more than
    # the tests of most mutants. The sessions share it through MEDIATOR_TEST_DATABASE_URL, each
    # with its own schema template and databases (tests/conftest.py).
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if "MEDIATOR_TEST_DATABASE_URL" not in env:
            cluster = stack.enter_context(EmbeddedPostgres(database="postgres"))
            env["MEDIATOR_TEST_DATABASE_URL"] = cluster.url("postgres")
        rc = 0
        for file in args.file or list(TESTS):
            tests = args.tests or list(TESTS.get(file, ()))
            if not tests and not args.gate:
                print(f"bench_mutation: no tests known for {file}: pass --tests", file=sys.stderr)
                return 2
            rc = max(rc, one_file(mutmut, file, tests, args, env))
    return rc


if __name__ == "__main__":
    sys.exit(main())
