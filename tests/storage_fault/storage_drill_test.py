#!/usr/bin/env python3
"""SQLite's I/O-error test, for checkpoints: fail each storage call of a save, and then
each of a resume, in turn, and check the folder after every one.

For a save (of step 3 into a folder holding steps 1 and 2; serial, then parallel on
one rank through ParallelCheckpoint), each open, read, write,
fsync, rename and unlink it makes fails once (with an errno that call meets on real
storage, and writes also cut short; one errno a kind of call, since troupe's code path
depends on the kind of errno -- storage or not -- and every errno here is storage); the save must end acknowledged or loudly, never in
a crash. Then a resume without faults must load step 3 if the save was acknowledged,
else step 2 or 3 -- never less, never nothing, never bytes that are not its step's.

For a resume of that folder, each call fails once (a transient fault: retried, so the
resume loads step 3), then from that call on for good (retried, then a loud failure).
Never a silent fresh start, never an older file, never a torn file taken as good.

  storage_drill_test.py SHIM DRILL
"""
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHIM, DRILL = sys.argv[1], sys.argv[2]
ERRORS = {"open": ["EACCES"], "read": ["EIO"], "write": ["ENOSPC", "short"],
          "fsync": ["EIO"], "rename": ["EIO"], "unlink": ["EIO"]}
WORKERS = 3
failures = []
runs = itertools.count(1)


def drill(args, folder: Path, fault: str = "", counts: Path | None = None, retry_s: str = "1"):
    next(runs)
    env = dict(os.environ, LD_PRELOAD=SHIM, TROUPE_IOFAULT=f"path={folder}" + (f",{fault}" if fault else ""),
               TROUPE_STORAGE_RETRY_S=retry_s)
    if counts:
        env["TROUPE_IOFAULT_COUNTS"] = str(counts)
    p = subprocess.run([DRILL, *args], env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def counts_of(args) -> dict:
    folder = Path(args[1])
    with tempfile.TemporaryDirectory() as t:
        counts = Path(t) / "counts"
        code, out = drill(args, folder, counts=counts)
        assert code == 0, out
        lines = counts.read_text().splitlines()
    # One line per process that exits under the shim (a 1-rank MPI program starts a
    # helper daemon too): summed.
    total = {}
    for line in lines:
        for k, v in (f.split("=") for f in line.split()):
            if k != "pid":
                total[k] = total.get(k, 0) + int(v)
    return total


def check(ok: bool, what: str, out: str) -> None:
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}\n{out.strip()[-1500:]}")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="troupe-drill-"))
    try:
        good = work / "good"
        for step in ("1", "2"):
            code, out = drill(["save", str(good), step], good)
            assert code == 0, out
        cases = itertools.count()

        def fresh_copy() -> Path:
            folder = work / f"case-{next(cases)}"
            shutil.copytree(good, folder)
            return folder

        def save_case(mode: str, op: str, nth: int, err: str) -> None:
            folder = fresh_copy()
            what = f"{mode} with {op} #{nth} failing ({err})"
            code, out = drill([mode, str(folder), "3"], folder, f"op={op},nth={nth},err={err}")
            check(code in (0, 3), f"{what}: exit {code}, want 0 or 3", out)
            code2, out2 = drill(["resume", str(folder)], folder)
            want = ["step 3"] if code == 0 else ["step 2", "step 3"]
            check(code2 == 0 and out2.split("\n")[0] in want,
                  f"{what}, save exit {code}: resume says {out2.splitlines()[:1]} (exit {code2}), "
                  f"want {want}", out + out2)
            shutil.rmtree(folder, ignore_errors=True)

        def resume_case(op: str, nth: int, err: str) -> None:
            folder = fresh_copy()
            what = f"resume with {op} #{nth} failing once ({err})"
            code, out = drill(["resume", str(folder)], folder, f"op={op},nth={nth},err={err}")
            check(code == 0 and out.startswith("step 3"), f"{what}: exit {code}, want step 3", out)
            folder = fresh_copy()
            what = f"resume with {op} failing from #{nth} on ({err})"
            code, out = drill(["resume", str(folder)], folder, f"op={op},nth={nth},count=0,err={err}", "0.3")
            check(code == 3 or (code == 0 and out.startswith("step 3")),
                  f"{what}: exit {code}, want a loud failure or step 3", out)
            check("fresh" not in out.split("\n")[0], f"{what}: a silent fresh start", out)

        # Each case has a folder of its own, and most of a case's time is the shim's
        # faults being retried after a pause: a few at once take a third of the time.
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            jobs = []
            for mode in ("save", "psave"):  # the serial save, and the parallel one on one rank
                save_calls = counts_of([mode, str(fresh_copy()), "3"])
                print(f"a {mode} makes", save_calls)
                jobs += [pool.submit(save_case, mode, op, nth, err) for op, n_calls in save_calls.items()
                         for nth in range(1, n_calls + 1) for err in ERRORS[op] if err != "short" or op == "write"]
            for job in jobs:
                job.result()
            # Step 3 in the folder, so that the newest file is the one the faults meet.
            resume_calls = counts_of(["resume", str(fresh_copy())])
            print("a resume makes", resume_calls)
            code, out = drill(["save", str(good), "3"], good)
            assert code == 0, out
            jobs = [pool.submit(resume_case, op, nth, err) for op, n_calls in resume_calls.items()
                    for nth in range(1, n_calls + 1) for err in ERRORS[op] if err != "short"]
            for job in jobs:
                job.result()
        print(f"{next(runs) - 1} runs of the drill, {len(failures)} failed")
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
