"""`troupe-run status DIR` while a job runs: the table names the actor, the rank it
lives on, the method it runs and for how long, and its mailbox (and --metrics serves
the same mailbox to Prometheus); after the job, every rank's snapshot says it finished.

    status_test.py TROUPE_RUN ACTORS_STATUS WORKDIR
"""
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def main() -> None:
    troupe_run, program, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = subprocess.Popen([troupe_run, "-np", "2", "--checkpoint-dir", str(workdir), "--metrics", f"127.0.0.1:{port}",
                            "--", program, "6000"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    deadline = time.time() + 20
    while time.time() < deadline:
        status = subprocess.run([troupe_run, "status", str(workdir)], capture_output=True, text=True, timeout=10)
        if status.returncode == 0 and "nap for" in status.stdout:
            seen = status.stdout
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                scraped = reply.read().decode()
            break
        time.sleep(0.3)
    try:
        output, _ = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # a hang must not outlive the test: troupe-run stops its job
        job.terminate()
        output, _ = job.communicate(timeout=30)
        print(output)
        print("FAILED: the job did not finish within 60 s")
        sys.exit(1)
    print(output)
    failures = []
    if not seen:
        failures.append("no status showed the nap running within 20 s")
    else:
        print(seen)
        row = next((line for line in seen.splitlines() if "Napper 'napper'" in line), "")
        cells = row.split()
        # rank host label... state mailbox running ... served restarts
        if not row or cells[0] != "1" or "alive" not in cells or "nap" not in cells:
            failures.append(f"the napper's row is wrong: {row!r}")
        elif cells[cells.index("alive") + 1] != "1":
            failures.append(f"the second call should wait in the mailbox: {row!r}")
        mailbox = 'troupe_actor_mailbox_depth{rank="1",actor="Napper \'napper\'"} 1'
        if mailbox not in scraped.splitlines():
            failures.append(f"/metrics lacks '{mailbox}':\n{scraped}")
        if "rank 0" in seen and "may be stuck" in seen:
            failures.append("a live rank was called stale")
    if job.returncode != 0:
        failures.append(f"troupe-run exited with {job.returncode}")
    after = subprocess.run([troupe_run, "status", str(workdir)], capture_output=True, text=True, timeout=10)
    print(after.stdout)
    for rank in (0, 1):
        if f"rank {rank} has finished" not in after.stdout:
            failures.append(f"rank {rank}'s last snapshot does not say it finished")
    empty = subprocess.run([troupe_run, "status", str(workdir / "nowhere")], capture_output=True, text=True,
                           timeout=10)
    if empty.returncode != 1 or "no status" not in empty.stdout:
        failures.append(f"a folder without status should say so and exit 1: {empty.returncode} {empty.stdout!r}")
    for f in failures:
        print("FAILED:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
