"""troupe-ckpt on the crafted files of hostile_files.py: each must be refused quickly and
cheaply, with its reason on one line -- not a crash, a hang or gigabytes allocated.

    hostile_verify.py TROUPE_CKPT

For every crafted file: `verify` exits 1 within 1 s, stdout is one INVALID line, stderr
is one line naming the reason (a word per case, from hostile_files.py), and the tool's
peak RSS is under 100 MB in all (CUDA's libraries are not loaded: CUDA on demand) and
under 100 MB above what `troupe-ckpt --version` takes. `ls` refuses it the same way with
exit status 2, and `meta` ends as quickly. The same file without the hostile part
verifies (exit 0)."""
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# A sanitized build runs several times slower: its CTest entry raises the bound.
MAX_SECONDS = float(os.environ.get("TROUPE_HOSTILE_MAX_SECONDS", "1.0"))
MAX_EXTRA_RSS_KB = 100 * 1024
# A sanitized build's shadow memory alone is more: its CTest entry raises this bound.
MAX_RSS_KB = float(os.environ.get("TROUPE_HOSTILE_MAX_RSS_MB", "100")) * 1024
HANG_SECONDS = 20  # a run still going by then is killed: a hang, reported as such


def run(tool, args, cwd):
    """Runs tool with args; returns (exit status, stdout, stderr, seconds, peak RSS in KB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        child = subprocess.Popen([tool] + args, cwd=cwd, stdout=out, stderr=err)
        killer = threading.Timer(HANG_SECONDS, child.kill)
        killer.start()
        # wait4 gives this child's own rusage (RUSAGE_CHILDREN would be the largest of all).
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - start
        killer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return child.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), \
            seconds, usage.ru_maxrss


def lines(text):
    return [line for line in text.split("\n") if line]


def main():
    tool = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory(prefix="troupe-hostile-") as work:
        listing = subprocess.run([sys.executable, os.path.join(HERE, "hostile_files.py"), work],
                                 check=True, capture_output=True, text=True).stdout
        cases = [line.split(" ", 1) for line in lines(listing)]
        _, _, _, _, base_rss = run(tool, ["--version"], work)
        print(f"troupe-ckpt --version: {base_rss / 1024:.0f} MB peak RSS (the baseline)")
        for name, keyword in cases:
            rc, out, err, seconds, rss = run(tool, ["verify", name], work)
            extra = rss - base_rss
            print(f"{name}: exit {rc}, {seconds:.2f} s, {rss / 1024:.0f} MB peak RSS "
                  f"({extra / 1024:+.0f} MB): {err.strip() or out.strip()}")
            if keyword == "ok":
                if rc != 0:
                    failures.append(f"{name}: the file without hostile parts does not verify (exit {rc}): {out}{err}")
                continue
            if rc != 1:
                failures.append(f"{name}: verify exited {rc}, expected 1 (signal or trouble?)")
            if len(lines(err)) != 1 or keyword not in err:
                failures.append(f"{name}: stderr is not one line naming '{keyword}': {err!r}")
            if len(lines(out)) != 1 or not out.startswith("INVALID"):
                failures.append(f"{name}: stdout is not one INVALID line: {out!r}")
            if seconds >= MAX_SECONDS:
                failures.append(f"{name}: took {seconds:.2f} s (limit {MAX_SECONDS} s)")
            if extra >= MAX_EXTRA_RSS_KB:
                failures.append(f"{name}: peak RSS {rss} KB, {extra} KB above the baseline (limit {MAX_EXTRA_RSS_KB})")
            if rss >= MAX_RSS_KB:
                failures.append(f"{name}: peak RSS {rss} KB (limit {MAX_RSS_KB:.0f})")
            # meta reads no dataset, so a file whose harm is in one may pass it (exit 0).
            for command, statuses in (("ls", (2,)), ("meta", (0, 2))):
                rc, out, err, seconds, _ = run(tool, [command, name], work)
                if rc not in statuses or (rc == 2 and len(lines(err)) != 1) or seconds >= MAX_SECONDS:
                    failures.append(f"{name}: {command} exited {rc} in {seconds:.2f} s, stderr {err!r}")
    for failure in failures:
        print("FAIL " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
