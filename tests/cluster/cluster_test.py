#!/usr/bin/python3
"""troupe across the hosts of the virtual cluster (scripts/cluster), end to end.

    cluster_test.py SCENARIO --build DIR [--nodes 3]

The cluster must be up (the CTest fixture runs `scripts/cluster up`). Each scenario
runs real programs across the nodes -- plain mpirun through the cluster's rsh agent,
troupe-run, Slurm -- injects real failures with scripts/cluster (kill, partition) and
checks the outcome: exit status, the events log, the parameter hash against a run that
never failed. Exits 77 (CTest's skip) when namespaces cannot be made here, non-zero
with a message naming what differed otherwise. Every wait is bounded.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "cluster"
DATA = ROOT / "data" / "digits.csv.gz"
# 3 ranks, one per node: a global batch of 48 divides by 3 and, after losing a node, by 2.
DIGITS = ["--epochs", "4", "--batch-size", "48", "--save-every", "7", "--data", str(DATA)]
FAST = ["--backoff", "0", "--grace", "1", "--heartbeat-timeout", "1.5", "--hang-timeout", "60"]


def fail(message: str) -> None:
    print(f"FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check(ok: bool, message: str) -> None:
    if not ok:
        fail(message)
    print(f"ok: {message}")


def cluster(*args: str, timeout: float = 120) -> str:
    done = subprocess.run([str(CLUSTER), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        fail(f"scripts/cluster {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    for line in cluster("env").splitlines():
        found = re.match(r"export (\w+)=(.*)", line)
        if found:
            env[found.group(1)] = found.group(2).strip("'\"")
    env.pop("TROUPE_FAULT", None)
    env.pop("TROUPE_FAULT_ARMED", None)
    return env


def run(command: list[str], env: dict[str, str], timeout: float, log: Path) -> subprocess.CompletedProcess:
    print("$", " ".join(command))
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        fail(f"timed out after {timeout} s: {' '.join(command)}\n{e.stdout or ''}\n{e.stderr or ''}")
    log.write_text(done.stdout + done.stderr)
    return done


def hash_of(text: str) -> str:
    found = re.search(r"parameters hash ([0-9a-f]+) \((\d+) steps, (\d+) rank", text)
    return found.group(1) if found else ""


def events(directory: Path) -> list[dict]:
    path = directory / "troupe-run-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Scenario:
    def __init__(self, args):
        self.args = args
        self.build = Path(args.build).resolve()
        self.work = Path(tempfile.mkdtemp(prefix=f"troupe-cluster-{args.scenario}-", dir="/tmp"))
        self.env = cluster_env()
        self.hostfile = cluster("hostfile").strip()
        self.nodes = args.nodes

    def binary(self, path: str) -> str:
        found = self.build / path
        if not found.exists():
            fail(f"{found} is not built")
        return str(found)

    def mpirun(self, np: int, program: list[str], map_by: str = "node") -> list[str]:
        # As troupe-run does: the head's BLAS settings reach every node, whose own
        # environment could pick other GEMM kernels (other bits than a run here).
        forwarded = [arg for name in sorted(self.env) if name.startswith(("OPENBLAS_", "OMP_")) for arg in ("-x", name)]
        return ["mpirun", "--hostfile", self.hostfile, "-np", str(np), "--map-by", map_by, "--bind-to", "none",
                *forwarded, *program]

    def troupe_run(self, np: int, directory: Path, program: list[str], extra: list[str] = ()) -> list[str]:
        return [self.binary("supervisor/troupe-run"), "-np", str(np), "--hostfile", self.hostfile, "--map-by", "node",
                "--bind-to", "none", "--checkpoint-dir", str(directory), *FAST, *extra, "--", *program]

    def digits(self, *extra: str) -> list[str]:
        return [self.binary("examples/train_digits"), *DIGITS, *extra]

    def cleanup(self) -> None:
        if os.environ.get("TROUPE_KEEP_WORK"):  # for a person looking into a failure
            print(f"work folder kept: {self.work}")
            return
        shutil.rmtree(self.work, ignore_errors=True)


# ---- plain mpirun across the nodes ----

def collectives(s: Scenario) -> None:
    # One rank per node (TCP alone), then two nodes of two ranks: shared memory inside
    # a node, TCP between nodes (the ring, MPI's allgather), the paths a single host
    # never takes. Two ranks on each of three nodes took 167 s idle, over 300 beside
    # stress-ng (6 processes on 2 cores); two nodes of two take 73 s and reach the same
    # paths.
    # Every test, but of the per-dtype ones only f32 and bf16 (a 4-byte type and a
    # widened 2-byte one): a dtype's arithmetic is the same code on every transport, and
    # the seven dtypes over TCP took 200 of this scenario's seconds. The ring's large
    # all-reduce in 24-byte segments (tens of thousands of messages) runs once, f32 in
    # place: its other three variants took 15 s here and differ only on the host.
    test = s.binary("tests/collectives_test")
    other_dtypes = ":".join([*(f"*/{t}_*:*_{t}_*" for t in ("f64", "f16", "i32", "i64", "u8")),
                             "*TinySegments/sum_f32_out_of_place", "*TinySegments/sum_bf16_*"])
    for np, map_by in ((s.nodes, "node"), (4, "slot")):
        done = run(s.mpirun(np, [test, f"--gtest_filter=-{other_dtypes}"], map_by), s.env, 480,
                   s.work / f"collectives-{np}.log")
        tail = (done.stdout + done.stderr)[-3000:]
        check(done.returncode == 0 and "PASSED" in done.stdout, f"collectives_test on {np} ranks across the nodes\n{tail}")


def examples(s: Scenario) -> None:
    done = run(s.mpirun(2, [s.binary("examples/ping_pong")]), s.env, 120, s.work / "ping_pong.log")
    check(done.returncode == 0, f"ping_pong between node1 and node2: {(done.stdout + done.stderr)[-2000:]}")
    done = run(s.mpirun(s.nodes, [s.binary("examples/parameter_server"), "--updates", "500", "--require-accuracy", "0.9"]),
               s.env, 180, s.work / "parameter_server.log")
    check(done.returncode == 0, f"parameter_server on {s.nodes} nodes learns: {(done.stdout + done.stderr)[-2000:]}")


def kill_rank(s: Scenario) -> None:
    # One rank per node; rank 2 (node3) is SIGKILLed while ranks 0 and 1 wait on it. No
    # rank shares its host, so troupe sees the death only on the liveness ring (rank 0
    # watches rank 2 and tells rank 1). Open MPI may get there first: it ends a rank
    # whose TCP send to the dead peer fails (rank 1 heartbeats rank 2), and mpirun then
    # tears the job down. Either way the job must end within seconds, not hang.
    started = time.time()
    done = run(["mpirun", "--hostfile", s.hostfile, "-np", "3", "--map-by", "node", "--bind-to", "none",
                s.binary("tests/actors_kill_rank")], s.env, 60, s.work / "kill_rank.log")
    took = time.time() - started
    out = done.stdout + done.stderr
    print(out[-3000:])
    check(done.returncode != 0, "the job ended with an error after losing rank 2")
    ours = re.search(r"rank 0: caller got rank_lost after (\d+) ms", out)
    theirs = "mpirun noticed that process rank 2" in out
    check(ours is not None or theirs, "rank 0's caller got rank_lost, or Open MPI tore the job down first")
    if ours:
        check(int(ours.group(1)) - 300 <= 2000, f"rank_lost {int(ours.group(1)) - 300} ms after the kill (<= 2 s)")
    check(took < 10, f"the whole job ended {took:.1f} s after it started (the kill comes at 0.3 s)")


def control_plane(s: Scenario) -> None:
    for n in (16, 32, 64):
        done = run(["mpirun", "--hostfile", s.hostfile, "-np", str(n), "--oversubscribe", "--map-by", "node",
                    "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1", s.binary("tests/actors_scale")],
                   s.env, 240, s.work / f"scale-{n}.log")
        line = next((l for l in done.stdout.splitlines() if l.startswith("control plane:")), "")
        print(f"figure: {line}")
        check(done.returncode == 0 and "FAILED" not in done.stdout,
              f"{n} ranks across {s.nodes} nodes: {line or (done.stdout + done.stderr)[-2000:]}")


def digits_modes(s: Scenario) -> None:
    # Each sharding mode across the nodes, then the same on the head alone: the same
    # parameters bit for bit (the reduction order does not depend on the transport).
    local_env = dict(s.env)
    for mode in ("ddp", "zero1", "zero2", "fsdp"):
        program = s.digits("--sharding", mode, "--checkpoint-dir", str(s.work / f"{mode}-cluster"))
        done = run(s.mpirun(s.nodes, program), s.env, 240, s.work / f"{mode}-cluster.log")
        check(done.returncode == 0 and hash_of(done.stdout), f"train_digits --sharding {mode} on {s.nodes} nodes")
        local = ["mpirun", "-np", str(s.nodes), "--oversubscribe", "--bind-to", "none",
                 *s.digits("--sharding", mode, "--checkpoint-dir", str(s.work / f"{mode}-local"))]
        here = run(local, local_env, 240, s.work / f"{mode}-local.log")
        check(here.returncode == 0, f"train_digits --sharding {mode} on this host alone")
        check(hash_of(done.stdout) == hash_of(here.stdout),
              f"{mode}: across nodes {hash_of(done.stdout)}, one host {hash_of(here.stdout)}")
        ckpts = sorted((s.work / f"{mode}-cluster").glob("ckpt-*.h5"))
        verify = subprocess.run([s.binary("tools/troupe-ckpt"), "verify", str(ckpts[-1])], capture_output=True, text=True)
        check(verify.returncode == 0, f"{mode}: the checkpoint the nodes wrote verifies ({ckpts[-1].name})")


# ---- troupe-run across the nodes, with real failures ----

def reference(s: Scenario) -> str:
    """The parameter hash of the 12-epoch job under troupe-run across the nodes, never failed."""
    done = run(s.troupe_run(s.nodes, s.work / "ref12", s.digits("--epochs", "12")), s.env, 240, s.work / "ref12.log")
    check(done.returncode == 0 and hash_of(done.stdout), f"reference run on {s.nodes} nodes: {done.stderr[-2000:]}")
    return hash_of(done.stdout)


def wait_for_checkpoint(directory: Path, step: int, process: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        for ckpt in directory.glob("ckpt-*.h5"):
            if int(ckpt.stem.split("-")[1]) >= step:
                return
        if process.poll() is not None:
            fail(f"the job ended before its checkpoint of step {step}: {process.communicate()}")
        time.sleep(0.02)
    fail(f"no checkpoint of step >= {step} within {limit} s")


def under_troupe_run(s: Scenario, name: str, extra: list[str] = (), hostfile: str | None = None):
    """The 12-epoch job under troupe-run across the nodes, started in the background."""
    directory = s.work / name
    command = s.troupe_run(s.nodes, directory, s.digits("--epochs", "12"), extra)
    if hostfile:
        command[command.index("--hostfile") + 1] = hostfile
    print("$", " ".join(command))
    process = subprocess.Popen(command, env=s.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return directory, process


def finish(process: subprocess.Popen, log: Path, limit: float = 180) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        fail(f"troupe-run did not finish within {limit} s\n{err[-3000:]}")
    log.write_text(out + err)
    print(err[-3000:], file=sys.stderr)
    return process.returncode, out, err


def node_kill(s: Scenario) -> None:
    expected = reference(s)
    directory, process = under_troupe_run(s, "kill")
    wait_for_checkpoint(directory, 70, process)
    killed = time.time()
    cluster("kill", f"node{s.nodes}")
    code, out, err = finish(process, s.work / "kill.log")
    check(code == 0, f"troupe-run finished (status {code}) after node{s.nodes} was killed")
    failures = [e for e in events(directory) if e["event"] == "failure"]
    check(len(failures) >= 1 and failures[0].get("host") == f"node{s.nodes}",
          f"the failure is blamed on node{s.nodes}: {failures[:1]}")
    resume = [e for e in events(directory) if e["event"] == "resume"]
    check(bool(resume), "the relaunch resumed")
    print(f"figure: node killed -> failure seen {failures[0]['time'] - killed:.2f} s, "
          f"-> first resumed step {resume[0]['time'] - killed:.2f} s")
    check(failures[0]["time"] - killed < 2.0, f"the node's loss was seen within 2 s ({failures[0]['time'] - killed:.2f} s)")
    check(hash_of(out) == expected, f"parameters after the node loss {hash_of(out)} == never failed {expected}")


def link_down(s: Scenario) -> None:
    expected = reference(s)
    directory, process = under_troupe_run(s, "partition")
    wait_for_checkpoint(directory, 70, process)
    cut = time.time()
    node = f"node{s.nodes}"
    cluster("partition", node)
    deadline = time.time() + 30
    while time.time() < deadline and not [e for e in events(directory) if e["event"] == "failure"]:
        time.sleep(0.02)
    failures = [e for e in events(directory) if e["event"] == "failure"]
    check(bool(failures), "the partition was detected")
    seen = failures[0]["time"] - cut
    cluster("heal", node)  # the partition heals: the job must restart whole, not in two halves
    code, out, err = finish(process, s.work / "partition.log")
    print(f"figure: link down -> failure seen {seen:.2f} s ({failures[0]['cause']})")
    # Either troupe-run's heartbeat timeout fires, or first a rank's own liveness check
    # (1 s) ends that rank; either way the failure is blamed on the silent node.
    check(failures[0]["cause"] in ("heartbeat_timeout", "rank_lost") and failures[0].get("host") == node,
          f"the failure is blamed on {node}, the silent one: {failures[0]}")
    check(seen < 2.0, f"detected within 2 s ({seen:.2f} s)")
    check(code == 0, f"troupe-run finished after the partition healed (status {code})")
    check(hash_of(out) == expected, f"parameters {hash_of(out)} == never failed {expected}")
    # The ranks left behind the partition fenced themselves: nothing of the job is left on the node.
    left = subprocess.run(["ip", "netns", "pids", f"troupe-{node}"], capture_output=True, text=True).stdout.split()
    check(not left, f"no process left on {node} after the job: {left}")


def relaunch_waits_for_host(s: Scenario) -> None:
    # A node killed and its link cut: the relaunch onto it fails before its ranks start.
    # troupe-run then probes the node instead of relaunching into it again, and when the
    # link heals the launch that failed for it is not counted: with --max-restarts 1
    # the job still finishes, bit for bit.
    expected = reference(s)
    directory, process = under_troupe_run(s, "host-wait", ["--max-restarts", "1"])
    wait_for_checkpoint(directory, 70, process)
    node = f"node{s.nodes}"
    cluster("partition", node)
    cluster("kill", node)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not [e for e in events(directory) if e["event"] == "host_wait" or
                                              e["event"] == "finish"]:
            if [e for e in events(directory) if e["event"] == "failure"][1:]:
                time.sleep(3)  # the failed relaunch is in: let a probe or two fail, then heal
                break
            time.sleep(0.05)
    finally:
        cluster("heal", node)
    code, out, err = finish(process, s.work / "host-wait.log")
    waits = [e for e in events(directory) if e["event"] == "host_wait"]
    print(f"host_wait events: {waits}")
    check(code == 0, f"troupe-run finished with --max-restarts 1 after a relaunch into a cut link (status {code})")
    check(bool(waits) and waits[0]["host"] == node and waits[0]["answered"] and waits[0]["failed_probes"] > 0,
          f"troupe-run waited for {node} and it answered after failing probes: {waits}")
    check(bool(waits) and waits[0]["hosts"] == s.nodes, f"troupe-run probed all {s.nodes} hosts of the job: {waits}")
    check("not counted against --max-restarts" in err, "troupe-run said the failed launch is not counted")
    check(hash_of(out) == expected, f"parameters {hash_of(out)} == never failed {expected}")


def lose_node_for_good(s: Scenario, name: str, hostfile: str) -> tuple[Path, str, str, float]:
    # The node goes for good (link down, then its processes killed): detected by missed
    # heartbeats, the relaunch onto it fails (its daemon cannot be started) and is
    # blamed on it too, and after those two failures it is left out.
    directory, process = under_troupe_run(
        s, name, ["--exclude-after", "2", "--min-ranks", str(s.nodes - 1), "--max-restarts", "4"], hostfile)
    wait_for_checkpoint(directory, 70, process)
    node = f"node{s.nodes}"
    cut = time.time()
    cluster("partition", node)
    cluster("kill", node)
    try:
        code, out, err = finish(process, s.work / f"{name}.log")
    finally:
        cluster("heal", node)
    check(code == 0, f"troupe-run finished on the remaining nodes (status {code})")
    check(f"leaving out host {node}" in err, "troupe-run said which host it left out")
    resume = [e for e in events(directory) if e["event"] == "resume"]
    return directory, out, err, resume[-1]["time"] - cut


def node_lost(s: Scenario) -> None:
    node = f"node{s.nodes}"
    expected = reference(s)
    # Two slots a node: the remaining nodes hold all 3 ranks, and the result is the
    # same bit for bit.
    directory, out, err, took = lose_node_for_good(s, "spare", s.hostfile)
    excluded = [e for e in events(directory) if e["event"] == "exclude"]
    check(len(excluded) == 1 and excluded[0]["host"] == node and excluded[0]["np"] == s.nodes,
          f"{node} was left out, {s.nodes} ranks kept on the other nodes: {excluded}")
    check(hash_of(out) == expected, f"parameters {hash_of(out)} == never failed {expected}")
    print(f"figure: node lost for good -> first resumed step on the other nodes {took:.2f} s")
    # One slot a node: the job shrinks to 2 ranks and resumes mid-epoch, resharded,
    # with the same global batch (equal in exact arithmetic; summed in another order).
    one_slot = s.work / "one-slot-hosts"
    one_slot.write_text("".join(f"node{i} slots=1\n" for i in range(1, s.nodes + 1)))
    directory, out, err, took = lose_node_for_good(s, "shrink", str(one_slot))
    excluded = [e for e in events(directory) if e["event"] == "exclude"]
    check(len(excluded) == 1 and excluded[0]["host"] == node and excluded[0]["np"] == s.nodes - 1,
          f"{node} was left out and the job shrank to {s.nodes - 1} ranks: {excluded}")
    # Mid-epoch as a rule; at an epoch's end when the cut fell just after the epoch's
    # checkpoint (one checkpoint in five: every 7 steps of a 30-step epoch, and its end).
    # A mid-epoch resume at another world size is also tested on one host,
    # deterministically (train_digits_resumes_mid_epoch_at_another_world_size).
    resumed = re.search(r"resumed from .* at step \d+ \(epoch \d+(, in progress| done)\)", out)
    check(resumed is not None, "the shrunk job resumed from the last checkpoint")
    print(f"the shrunk job {resumed.group(0)}")
    check(f"(360 steps, {s.nodes - 1} rank(s))" in out, f"it ended after the same 360 steps on {s.nodes - 1} ranks")
    accuracy = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
    check(accuracy >= 0.95, f"final test accuracy {accuracy} >= 0.95")
    print(f"figure: node lost for good -> first resumed step on {s.nodes - 1} ranks {took:.2f} s")


def straggler(s: Scenario) -> None:
    # A node held to 5% of a core: named as a straggler (rank, node, how much slower)
    # and not restarted; its result is the one the job has without the limit. Batches
    # of 384 make a step mostly computation, which is what the limit slows. At 10% a
    # CI run with other tests beside it slowed the healthy ranks enough that node3
    # came out under the 1.5x ratio (1.8x measured beside stress-ng; 5-20x at 5%).
    # Slow is not dead: at 5% of a core on a loaded machine a rank can go seconds
    # without being scheduled -- once more than 10 s, in a full CTest run -- so both
    # kinds of heartbeat get 30 s here.
    # 80 epochs give the slowed run about a dozen 2 s windows: at 40 (about six) one
    # full run in many ended with no two windows in a row over the ratio.
    job = s.digits("--epochs", "80", "--batch-size", "384", "--save-every", "50")
    patient = ["--heartbeat-timeout", "30", "--liveness-timeout", "30"]
    node = f"node{s.nodes}"
    healthy = run(s.troupe_run(s.nodes, s.work / "healthy", job, patient), s.env, 240, s.work / "healthy.log")
    check(healthy.returncode == 0 and hash_of(healthy.stdout), f"the run without a slow node: {healthy.stderr[-2000:]}")
    cluster("slow", node, "5")
    try:
        slow = run(s.troupe_run(s.nodes, s.work / "slow", job, patient), s.env, 240, s.work / "slow.log")
    finally:
        cluster("slow", node, "off")
    print(slow.stderr[-3000:], file=sys.stderr)
    check(slow.returncode == 0, f"the run with {node} slowed finished (status {slow.returncode})")
    log = events(s.work / "slow")
    reports = [e for e in log if e["event"] == "straggler" and e["host"] == node]
    check(bool(reports), f"{node} was reported as a straggler: {[e for e in log if 'straggler' in e['event']]}")
    check(reports[0]["slower"] >= 1.5 and reports[0]["rank"] == s.nodes - 1,
          f"the report names rank {s.nodes - 1} and how much slower it is: {reports[0]}")
    check(f"straggler: rank {s.nodes - 1} on {node}" in slow.stderr, "and says so on stderr")
    check(not [e for e in log if e["event"] in ("failure", "restart")], "the job was not restarted for it")
    check(hash_of(slow.stdout) == hash_of(healthy.stdout),
          f"parameters {hash_of(slow.stdout)} == without the slow node {hash_of(healthy.stdout)}")
    print(f"figure: straggler reported {reports[0]['slower']:.1f}x slower")


def regrow(s: Scenario) -> None:
    # One slot a node: node3 is lost for good, the job shrinks to 2 ranks; the node
    # comes back, troupe-run's probe finds it, and after the next checkpoint the job
    # grows back to 3 ranks and finishes there, resumed resharded each time. A global
    # batch of 64: uneven shares on 3 ranks (22, 21, 21), even ones on 2.
    # 180 epochs (4140 steps) keep the 2-rank job going for seconds after the heal:
    # at 30 a fast CI machine finished them before the probe saw node3 back.
    epochs = 180
    steps = epochs * 23  # 23 steps an epoch at a global batch of 64
    node = f"node{s.nodes}"
    one_slot = s.work / "one-slot-hosts"
    one_slot.write_text("".join(f"node{i} slots=1\n" for i in range(1, s.nodes + 1)))
    directory = s.work / "regrow"
    extra = ["--exclude-after", "2", "--min-ranks", str(s.nodes - 1), "--max-restarts", "4", "--regrow",
             "--probe-interval", "1"]
    command = s.troupe_run(s.nodes, directory, s.digits("--epochs", str(epochs), "--batch-size", "64"), extra)
    command[command.index("--hostfile") + 1] = str(one_slot)
    print("$", " ".join(command))
    process = subprocess.Popen(command, env=s.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(directory, 70, process)
    cluster("partition", node)
    cluster("kill", node)
    try:
        deadline = time.time() + 60
        shrunk = False
        while time.time() < deadline and process.poll() is None and not shrunk:
            log = events(directory)
            out = [e["restart"] for e in log if e["event"] == "exclude"]
            shrunk = bool(out) and any(e["event"] == "resume" and e["restart"] >= out[0] for e in log)
            time.sleep(0.05)
        check(shrunk, f"the job shrank to {s.nodes - 1} ranks and resumed")
    finally:
        cluster("heal", node)
    healed = time.time()
    code, out, err = finish(process, s.work / "regrow.log")
    check(code == 0, f"troupe-run finished (status {code})")
    log = events(directory)
    names = [e["event"] for e in log]
    check("host_back" in names and "regrow" in names and "readmit" in names,
          f"the probe found {node} back and the job grew back onto it: {names}")
    readmit = [e for e in log if e["event"] == "readmit"][0]
    check(readmit["host"] == node and readmit["np"] == s.nodes and readmit["np_before"] == s.nodes - 1,
          f"{node} readmitted, {s.nodes - 1} -> {s.nodes} ranks: {readmit}")
    regrow_event = [e for e in log if e["event"] == "regrow"][0]
    check(regrow_event["checkpoint_step"] < steps, f"it grew back before the last step: {regrow_event}")
    check(f"({steps} steps, {s.nodes} rank(s))" in out, f"it ended after the same {steps} steps on {s.nodes} ranks again")
    accuracy = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
    check(accuracy >= 0.95, f"final test accuracy {accuracy} >= 0.95")
    grown = [e for e in log if e["event"] == "resume" and e["restart"] > regrow_event["restart"]]
    check(bool(grown), "the grown job resumed")
    print(f"figure: node healed -> regrown job's first step {grown[0]['time'] - healed:.2f} s "
          f"(checkpoint wait included)")


def bad_input(s: Scenario) -> None:
    bad = s.work / "bad-hosts"
    bad.write_text("node1 slots=1\nnode-that-does-not-exist slots=1\n")
    started = time.time()
    done = run([s.binary("supervisor/troupe-run"), "-np", "2", "--hostfile", str(bad), "--", "true"], s.env, 30,
               s.work / "bad-hosts.log")
    check(done.returncode == 2 and "'node-that-does-not-exist' does not resolve" in done.stderr,
          f"an unknown host in the hostfile: status {done.returncode}, {done.stderr.strip()}")
    check(time.time() - started < 5, "said within seconds")
    done = run([s.binary("supervisor/troupe-run"), "-np", "2", "--hostfile", s.hostfile, "--bind", "127.0.0.1:0",
                "--", "true"], s.env, 30, s.work / "loopback.log")
    check(done.returncode == 2 and "loopback address" in done.stderr and "node2" in done.stderr,
          f"a loopback --bind with remote ranks: status {done.returncode}, {done.stderr.strip()}")


@contextlib.contextmanager
def slurm_job(s: Scenario, run_flags: str = ""):
    """Slurm up for the scenario (down after); yields the job's folder, the environment
    for sbatch, and the sbatch command line for examples/troupe_run_slurm.sbatch."""
    cluster("slurm", "up", timeout=300)
    s.env = cluster_env()
    try:
        work = s.work / "slurm"
        work.mkdir()
        env = dict(s.env, TROUPE_BUILD_DIR=str(s.build), TROUPE_CHECKPOINT_DIR=str(work / "ckpt"),
                   TROUPE_RUN_FLAGS=run_flags)
        command = ["sbatch", "--wait", f"--nodes={s.nodes}", "--chdir", str(work), "--output", str(work / "job.out"),
                   str(ROOT / "examples" / "troupe_run_slurm.sbatch"), *DIGITS]
        yield work, env, command
    finally:
        cluster("slurm", "down", timeout=120)


def job_output(work: Path) -> str:
    out = (work / "job.out").read_text() if (work / "job.out").exists() else ""
    print(out[-3000:])
    return out


def slurm(s: Scenario) -> None:
    with slurm_job(s) as (work, env, command):
        done = run(command, env, 300, s.work / "sbatch.log")
        out = job_output(work)
        check(done.returncode == 0, f"sbatch --wait: status {done.returncode}: {done.stderr.strip()}")
        check("troupe-run: summary: finished" in out and hash_of(out), "troupe-run finished the job inside the allocation")
        check(f"{s.nodes} rank(s))" in out, f"on {s.nodes} ranks, one per node")
        hosts = sorted(e["host"] for e in events(work / "ckpt") if e["event"] == "rank_up")
        check(hosts == [f"node{i}" for i in range(1, s.nodes + 1)], f"one rank registered from each node: {hosts}")


def slurm_node_lost(s: Scenario) -> None:
    # The same job inside an allocation, and node3 killed (its slurmd too) mid-run: the
    # relaunch inside the allocation leaves it out and goes on with 2 ranks.
    with slurm_job(s, "--exclude-after 1 --min-ranks 2 --backoff 0") as (work, env, command):
        command += ["--epochs", "12"]
        print("$", " ".join(command))
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_checkpoint(work / "ckpt", 70, process)
        cluster("kill", f"node{s.nodes}")
        _, err = process.communicate(timeout=240)
        out = job_output(work)
        check(process.returncode == 0, f"sbatch --wait: status {process.returncode}: {err.strip()}")
        check(f"leaving out host node{s.nodes}" in out, f"troupe-run left node{s.nodes} out")
        check(f"(360 steps, {s.nodes - 1} rank(s))" in out, f"it ended after 360 steps on {s.nodes - 1} ranks")
        accuracy = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
        check(accuracy >= 0.95, f"final test accuracy {accuracy} >= 0.95")


SCENARIOS = {f.__name__: f for f in (collectives, examples, kill_rank, control_plane, digits_modes, node_kill, link_down,
                                     relaunch_waits_for_host, node_lost, straggler, regrow, bad_input, slurm,
                                     slurm_node_lost)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--build", required=True)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0 or not Path("/run/troupe-cluster/nodes").exists() and not os.environ.get("TROUPE_CLUSTER_DIR"):
        print("SKIPPED: the virtual cluster is not up (scripts/cluster up needs root and network namespaces)")
        sys.exit(77)
    s = Scenario(args)
    try:
        SCENARIOS[args.scenario](s)
    finally:
        s.cleanup()
    print(f"PASS: {args.scenario}")


if __name__ == "__main__":
    main()
