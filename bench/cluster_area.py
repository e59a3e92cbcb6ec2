"""The cluster area of bench/run: recovery and the control plane across the 3 nodes of
the virtual cluster (scripts/cluster; brought up here if it is not, and taken down
again). Needs root.

The job is the toy of tests/supervisor/toy_trainer.cpp (20 ms steps, an int64
all-reduce a step, a save every 5 steps), one rank a node, and its PyTorch twin
bench/torch_restart_job.py under torchrun. A node is lost with `scripts/cluster kill`
once the job has saved step 40; each job prints the wall-clock time of its first step
after a relaunch, so "loss -> first resumed step" is measured the same way for all:
- node killed, relaunched on the same 3 nodes: troupe-run vs a shell loop that reruns
  mpirun as soon as it exits;
- node lost for good (every process killed, torchrun's agent included, and not taken
  back): troupe-run with --exclude-after 1 --min-ranks 2 vs torchrun --nnodes 2:3 (c10d
  rendezvous on node1, an agent a node), both going on with 2 ranks. The link stays up,
  so peers see their connections reset: with the link down as well, gloo would wait
  out its 30-minute timeout;
- link down, healed once the failure is seen: troupe-run's detection and resume;
- regrow: train_digits (which writes troupe's checkpoints, what troupe-run waits for),
  node3 lost (link down, processes killed), the job shrinks to 2 ranks, then the link
  heals: troupe-run's probe (--probe-interval 1) finds node3 and the job grows back to
  3 ranks after its next checkpoint;
- a slow node: node3 held to 10% of a core under train_digits (batches of 384, so a
  step is mostly computation): how long until troupe-run names it a straggler.
Then the control plane at 16, 32 and 64 ranks (tests/actors/scale_main.cpp) and the
allreduce sweep across the nodes (collectives_bench, troupe vs MPI_Allreduce in one job).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from supervisor_restart import TORCH_PYTHON, median_of, torch_missing  # bench/, next to this file

STEPS, SAVE_EVERY, STEP_MS, LOSE_AT = 400, 5, 20, 40


class Cluster:
    def __init__(self, root: Path):
        self.script = root / "scripts" / "cluster"
        self.brought_up = not Path("/run/troupe-cluster/nodes").exists()
        self("up", "3")
        self.env = dict(os.environ)
        for line in self("env").splitlines():
            m = re.match(r"export (\w+)=(.*)", line)
            if m:
                self.env[m.group(1)] = m.group(2).strip("'\"")
        self.env.pop("TROUPE_FAULT", None)
        self.env.pop("TROUPE_FAULT_ARMED", None)
        self.hostfile = self("hostfile").strip()

    def __call__(self, *args: str) -> str:
        return subprocess.run([str(self.script), *args], check=True, capture_output=True, text=True,
                              timeout=300).stdout

    def close(self) -> None:
        for node in ("node1", "node2", "node3"):
            subprocess.run([str(self.script), "heal", node], capture_output=True, timeout=60)
        if self.brought_up:
            self("down")


def first_steps(text: str) -> list[tuple[int, float]]:
    return [(int(s), float(t)) for s, t in re.findall(r"first step (\d+) at t=([0-9.]+)", text)]


def saved_step(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def wait_saved(path: Path, process: subprocess.Popen, step: int = LOSE_AT, limit: float = 120) -> None:
    deadline = time.time() + limit
    while saved_step(path) < step:
        if process.poll() is not None or time.time() > deadline:
            out, err = process.communicate()
            raise RuntimeError(f"the job did not save step {step}: {err[-2000:]}")
        time.sleep(0.005)


def resumed_after(text: str, lost: float) -> float:
    later = [t for _, t in first_steps(text) if t > lost]
    if not later:
        raise RuntimeError(f"no first step after the loss in the job's output:\n{text[-2000:]}")
    return later[0] - lost


def toy(build: Path, steps: int = STEPS) -> list[str]:
    return [str(build / "tests" / "supervisor" / "supervisor_toy_trainer"), "--steps", str(steps), "--save-every",
            str(SAVE_EVERY), "--step-ms", str(STEP_MS)]


def troupe_run(c: Cluster, build: Path, work: Path, hostfile: str, extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen([str(build / "supervisor" / "troupe-run"), "-np", "3", "--hostfile", hostfile,
                             "--map-by", "node", "--bind-to", "none", "--checkpoint-dir", str(work), "--backoff", "0",
                             "--grace", "1", "--max-restarts", "3", *extra, "--", *toy(build)],
                            env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, what: str) -> str:
    out, err = process.communicate(timeout=180)
    if process.returncode != 0:
        raise RuntimeError(f"{what} failed ({process.returncode}):\n{err[-3000:]}")
    return out


def events(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "troupe-run-events.jsonl").read_text().splitlines()]


def troupe_node_killed(c: Cluster, build: Path, work: Path) -> dict:
    p = troupe_run(c, build, work, c.hostfile, [])
    wait_saved(work / "toy-step.txt", p)
    lost = time.time()
    c("kill", "node3")
    out = finish(p, "troupe-run (node killed)")
    failure = next(e for e in events(work) if e["event"] == "failure")
    return {"detection": failure["time"] - lost, "total": resumed_after(out, lost)}


def mpirun_loop_node_killed(c: Cluster, build: Path, work: Path) -> dict:
    work.mkdir(parents=True)
    env = dict(c.env, TROUPE_CHECKPOINT_DIR=str(work), TROUPE_RESTART="0")
    command = ["mpirun", "--hostfile", c.hostfile, "-np", "3", "--map-by", "node", "--bind-to", "none",
               "-x", "TROUPE_CHECKPOINT_DIR", "-x", "TROUPE_RESTART", *toy(build)]
    p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_saved(work / "toy-step.txt", p)
    lost = time.time()
    c("kill", "node3")
    p.communicate(timeout=180)  # mpirun notices and exits; the loop reruns it at once
    env["TROUPE_RESTART"] = "1"
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    if again.returncode != 0:
        raise RuntimeError(f"the mpirun relaunch failed:\n{again.stderr[-2000:]}")
    return {"total": resumed_after(again.stdout, lost)}


def troupe_node_lost(c: Cluster, build: Path, work: Path) -> dict:
    one_slot = work / "hosts"
    work.mkdir(parents=True, exist_ok=True)
    one_slot.write_text("node1 slots=1\nnode2 slots=1\nnode3 slots=1\n")
    p = troupe_run(c, build, work, str(one_slot), ["--exclude-after", "1", "--min-ranks", "2"])
    wait_saved(work / "toy-step.txt", p)
    lost = time.time()
    c("kill", "node3")
    out = finish(p, "troupe-run (node lost)")
    if not any(e["event"] == "exclude" and e["np"] == 2 for e in events(work)):
        raise RuntimeError("troupe-run did not shrink to 2 ranks")
    return {"total": resumed_after(out, lost)}


def troupe_link_down(c: Cluster, build: Path, work: Path) -> dict:
    p = troupe_run(c, build, work, c.hostfile, [])
    wait_saved(work / "toy-step.txt", p)
    lost = time.time()
    c("partition", "node3")
    deadline = time.time() + 30
    while time.time() < deadline and not (work / "troupe-run-events.jsonl").read_text().count('"failure"'):
        time.sleep(0.01)
    c("heal", "node3")
    out = finish(p, "troupe-run (link down)")
    failure = next(e for e in events(work) if e["event"] == "failure")
    return {"detection": failure["time"] - lost, "total": resumed_after(out, lost)}


def troupe_regrow(c: Cluster, build: Path, root: Path, work: Path) -> dict:
    """train_digits, not the toy: troupe-run grows back after a checkpoint of troupe's
    own (ckpt-<step>.h5), which the toy does not write."""
    one_slot = work / "hosts"
    work.mkdir(parents=True, exist_ok=True)
    one_slot.write_text("node1 slots=1\nnode2 slots=1\nnode3 slots=1\n")
    # 180 epochs at a global batch of 64, as tests/cluster's regrow: at 30 epochs the
    # 2-rank job now ends about 1.7 s after its resume, before the probe sees node3 back.
    digits = [str(build / "examples" / "train_digits"), "--epochs", "180", "--batch-size", "64", "--save-every", "7",
              "--data", str(root / "data" / "digits.csv.gz")]
    p = subprocess.Popen([str(build / "supervisor" / "troupe-run"), "-np", "3", "--hostfile", str(one_slot),
                          "--map-by", "node", "--bind-to", "none", "--checkpoint-dir", str(work), "--backoff", "0",
                          "--grace", "1", "--max-restarts", "3", "--exclude-after", "1", "--min-ranks", "2",
                          "--regrow", "--probe-interval", "1", "--", *digits],
                         env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(work.glob("ckpt-*.h5")):
        time.sleep(0.01)
    c("partition", "node3")
    c("kill", "node3")
    try:
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None:
            log = events_or_none(work)
            out = [e["restart"] for e in log if e["event"] == "exclude"]
            if out and any(e["event"] == "resume" and e["restart"] >= out[0] for e in log):
                break
            time.sleep(0.01)
    finally:
        c("heal", "node3")
    healed = time.time()
    finish(p, "troupe-run (regrow)")
    log = events(work)
    regrow = next((e for e in log if e["event"] == "regrow"), None)
    if regrow is None or not any(e["event"] == "readmit" and e["np"] == 3 for e in log):
        raise RuntimeError("troupe-run did not grow back to 3 ranks")
    back = next(e for e in log if e["event"] == "host_back")
    grown = next(e for e in log if e["event"] == "resume" and e["restart"] > regrow["restart"])
    return {"probe": back["time"] - healed, "total": grown["time"] - healed}


def troupe_straggler(c: Cluster, build: Path, root: Path, work: Path) -> dict:
    digits = [str(build / "examples" / "train_digits"), "--epochs", "60", "--batch-size", "384", "--save-every", "50",
              "--data", str(root / "data" / "digits.csv.gz")]
    p = subprocess.Popen([str(build / "supervisor" / "troupe-run"), "-np", "3", "--hostfile", c.hostfile, "--map-by",
                          "node", "--bind-to", "none", "--checkpoint-dir", str(work), "--", *digits],
                         env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not any(e["event"] == "first_step" for e in events_or_none(work)):
            time.sleep(0.01)
        c("slow", "node3", "10")
        slowed = time.time()
        deadline = time.time() + 60
        report = None
        while time.time() < deadline and p.poll() is None and report is None:
            report = next((e for e in events_or_none(work) if e["event"] == "straggler" and e["host"] == "node3"), None)
            time.sleep(0.01)
    finally:
        c("slow", "node3", "off")
    finish(p, "troupe-run (slow node)")
    if report is None:
        raise RuntimeError("node3 was not reported as a straggler")
    return {"seen": report["time"] - slowed, "slower": report["slower"]}


def events_or_none(work: Path) -> list[dict]:
    try:
        return events(work)
    except (OSError, ValueError):
        return []


def torchrun_node_lost(c: Cluster, root: Path, work: Path) -> dict:
    """torchrun's elastic answer to a lost node: an agent a node, c10d rendezvous on
    node1, --nnodes 2:3; the agents left re-rendezvous without node3 and restart."""
    work.mkdir(parents=True, exist_ok=True)
    port = 29400 + int(time.time()) % 500
    agents = []
    for i in (1, 2, 3):
        command = [str(c.script), "exec", f"node{i}", "env", f"CKPT_DIR={work}", "GLOO_SOCKET_IFNAME=eth0",
                   TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc_per_node", "1",
                   "--rdzv_backend", "c10d", "--rdzv_endpoint", f"node1:{port}", "--rdzv_id", f"bench{port}",
                   "--max_restarts", "3", "--redirects", "1", "--tee", "1", "--log_dir", str(work / f"logs{i}"),
                   str(root / "bench" / "torch_restart_job.py"), str(STEPS), str(SAVE_EVERY), str(STEP_MS), "-1", "-1"]
        agents.append(subprocess.Popen(command, env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        wait_saved(work / "torch-step.txt", agents[0])
        lost = time.time()
        c("kill", "node3")
        outputs = []
        for agent in agents[:2]:  # after the shrink, rank 0 runs on node1 or node2
            out, err = agent.communicate(timeout=300)
            if agent.returncode != 0:
                raise RuntimeError(f"torchrun failed ({agent.returncode}):\n{err[-3000:]}")
            outputs.append(out)
        return {"total": resumed_after("".join(outputs), lost)}
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
            a.communicate()


def control_plane(c: Cluster, build: Path, ranks: int) -> dict:
    p = subprocess.run(["mpirun", "--hostfile", c.hostfile, "-np", str(ranks), "--oversubscribe", "--map-by", "node",
                        "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
                        str(build / "tests" / "actors_scale")], env=c.env, capture_output=True, text=True, timeout=300)
    line = next((l for l in p.stdout.splitlines() if l.startswith("control plane:")), "")
    m = re.search(r"startup ([0-9.]+) s .* liveness (\d+) messages/s in all \(ring: (\d+), all-to-all would be (\d+)\), "
                  r"CPU per rank idle ([0-9.]+)% .* of which liveness ([0-9.]+)% \(highest ([0-9.]+)%\)", line)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"actors_scale at {ranks} ranks failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return {"startup": float(m[1]), "messages": float(m[2]), "all_to_all": float(m[4]), "cpu": float(m[5]),
            "liveness_cpu": float(m[6]), "liveness_cpu_max": float(m[7])}


def run(root: Path, build: Path, quick: bool, row) -> list[dict]:
    if os.geteuid() != 0:
        raise SystemExit("bench/run cluster: needs root (scripts/cluster makes network namespaces)")
    repeats = 1 if quick else 3
    c = Cluster(root)
    rows: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="troupe_cluster_") as tmp:
            def fresh(name: str, i: int) -> Path:
                return Path(tmp) / f"{name}{i}"
            killed = median_of([troupe_node_killed(c, build, fresh("kill", i)) for i in range(repeats)])
            loop = median_of([mpirun_loop_node_killed(c, build, fresh("loop", i)) for i in range(repeats)])
            lost = median_of([troupe_node_lost(c, build, fresh("lost", i)) for i in range(repeats)])
            link = median_of([troupe_link_down(c, build, fresh("link", i)) for i in range(repeats)])
            missing = torch_missing()
            torch = None
            if not missing:
                try:
                    torch = median_of([torchrun_node_lost(c, root, fresh("torch", i)) for i in range(repeats)])
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    missing = f"failed: {str(e).splitlines()[0][:120]}"
            regrown = median_of([troupe_regrow(c, build, root, fresh("regrow", i)) for i in range(repeats)])
            slow = median_of([troupe_straggler(c, build, root, fresh("slow", i)) for i in range(repeats)])
            scales = {n: control_plane(c, build, n) for n in (16, 32, 64)}
            scale = scales[64]
            sweep = Path(tmp) / "sweep.json"
            # --quick always: 1 round of 5 sizes (8 B to 32 MB); the full sweep over TCP
            # between namespaces on 2 cores would take most of an hour.
            subprocess.run(["mpirun", "--hostfile", c.hostfile, "-np", "3", "--map-by", "node", "--bind-to", "none",
                            str(build / "bench" / "collectives_bench"), "--transport", "3 nodes", "--json", str(sweep),
                            "--quick"], env=c.env, check=True, capture_output=True, timeout=900)
            swept = json.loads(sweep.read_text())
    finally:
        c.close()

    rows.append(row("node killed -> first resumed step, 3 nodes, relaunched on 3", "s", "lower", killed["total"],
                    "shell loop: mpirun exits, relaunch on the same nodes", loop["total"], "<= 2 s",
                    killed["total"] <= 2.0))
    rows.append(row("node killed -> failure seen", "s", "lower", killed["detection"], "none", None))
    torch_name = ("torchrun --nnodes 2:3, c10d rendezvous, gloo (goes on with 2)" if torch
                  else f"torchrun: {missing}")
    rows.append(row("node lost for good -> first resumed step, shrink 3 -> 2 nodes", "s", "lower", lost["total"],
                    torch_name, torch["total"] if torch else None, "<= 3 s and >= 3x faster than torchrun",
                    lost["total"] <= 3.0 and (torch is None or torch["total"] >= 3 * lost["total"]),
                    baseline_missing=torch is None))
    rows.append(row("link down -> failure seen", "s", "lower", link["detection"], "none (a TCP timeout: minutes)",
                    None, "<= 2 s", link["detection"] <= 2.0))
    rows.append(row("link down -> first resumed step (healed when seen)", "s", "lower", link["total"], "none", None,
                    "<= 3 s", link["total"] <= 3.0))
    rows.append(row("node back -> probe finds it (--probe-interval 1)", "s", "lower", regrown["probe"], "none", None))
    rows.append(row("node back -> first step regrown 2 -> 3 nodes (next checkpoint)", "s", "lower", regrown["total"],
                    "none", None))
    rows.append(row("slow node (10% of a core) -> straggler reported", "s", "lower", slow["seen"],
                    "none (DDP, torchrun: no report)", None))
    rows.append(row("straggler's work per step vs the ranks' median", "x", "higher", slow["slower"], "none", None))
    for n, figures in scales.items():  # O(N): ten messages a second per rank, whatever N
        rows.append(row(f"liveness messages/s, all {n} ranks (ring)", "msg/s", "lower", figures["messages"],
                        "all-to-all heartbeats, N(N-1)/period", figures["all_to_all"], "~ O(N)",
                        figures["messages"] <= 1.5 * 10 * n))
        rows.append(row(f"liveness CPU per rank, {n} ranks on 2 cores (highest rank)", "% core", "lower",
                        figures["liveness_cpu_max"], "none", None, "<= 1%", figures["liveness_cpu_max"] <= 1.0))
    rows.append(row("idle CPU per rank, 64 ranks on 2 cores (whole runtime, mean)", "% core", "lower", scale["cpu"],
                    "none", None))
    rows.append(row("start-up of a 64-rank actor runtime (slowest rank)", "s", "lower", scale["startup"], "none", None))
    for r in swept:  # the off-node paths: the ring (allreduce), MPI's allgather
        if r["case"].startswith(("allreduce f32", "allgather f32")):
            rows.append({**row(r["case"] + " (1 round)", r["unit"], r["better"], r["troupe"], r["baseline"],
                               r["baseline_value"]), "quick": True})
    return rows
