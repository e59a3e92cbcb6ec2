#!/usr/bin/python3
"""End-to-end tests of troupe-run with toy_trainer on 2 ranks under real mpirun.

    scenarios.py SCENARIO --troupe-run PATH --trainer PATH --workdir DIR

Each scenario runs troupe-run once, then checks its exit status, its stderr, the
events log (JSONL) and the trainer's result against the value a run without failure
computes (toy_trainer's recurrence, recomputed here). Exits non-zero with a message
naming what differed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

STEPS, SAVE_EVERY, STEP_MS, NP = 30, 5, 20, 2
PROTOCOL_VERSION = 6  # supervisor/include/troupe/supervisor/protocol.hpp, kProtocolVersion
# Short timeouts keep the tests quick; the hang test relies on the heartbeat interval
# (heartbeat timeout / 5 = 0.4 s) being well under the hang timeout.
FAST = ["--backoff", "0", "--grace", "1", "--heartbeat-timeout", "2", "--hang-timeout", "5"]


def expected_value(steps: int, np: int = NP) -> int:
    value = 1
    for step in range(steps):
        total = sum(value + r + step for r in range(np))
        value = (value * 31 + total) % 1000003
    return value


class Check:
    def __init__(self, name: str):
        self.name = name

    def __call__(self, ok: bool, message: str) -> None:
        if not ok:
            print(f"FAILED [{self.name}]: {message}", file=sys.stderr)
            if Run.last is not None:  # everything a person needs to see why
                print("---- events ----", file=sys.stderr)
                for e in Run.last.events():
                    print(json.dumps(e), file=sys.stderr)
            sys.exit(1)
        print(f"ok: {message}")


class Run:
    """One troupe-run invocation and what it left behind."""
    last: "Run | None" = None

    def __init__(self, args, scenario: str, fault: str | None, extra: list[str], steps: int = STEPS,
                 step_ms: int = STEP_MS, background: bool = False, np: int = NP, program: list[str] | None = None):
        self.dir = Path(args.workdir) / scenario
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.ckpt = self.dir / "ckpt"
        env = dict(os.environ)
        env.pop("TROUPE_FAULT", None)
        env.pop("TROUPE_FAULT_ARMED", None)
        if fault:
            env["TROUPE_FAULT"] = fault
            env["TROUPE_FAULT_ARMED"] = "1"
        program = program or [args.trainer, "--steps", str(steps), "--save-every", str(SAVE_EVERY), "--step-ms",
                              str(step_ms)]
        self.command = [args.troupe_run, "-np", str(np), "--checkpoint-dir", str(self.ckpt), *extra, "--", *program]
        print("$", " ".join(self.command), f"(TROUPE_FAULT={fault})" if fault else "")
        self.started = time.time()
        Run.last = self
        self.process = subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not background:
            self.wait()

    def wait(self, timeout: float = 60) -> None:
        self.stdout, self.stderr = self.process.communicate(timeout=timeout)
        self.code = self.process.returncode
        self.elapsed = time.time() - self.started
        print(self.stdout, end="")
        print(self.stderr, end="", file=sys.stderr)

    def events(self) -> list[dict]:
        path = self.ckpt / "troupe-run-events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events() if e["event"] == kind]

    def result(self) -> int | None:
        path = self.ckpt / "toy-result.txt"
        return int(path.read_text()) if path.exists() else None

    def fault_time(self) -> float:
        found = re.search(r"troupe fault: \w+ on rank \d+ at step \d+ \(pid \d+, t=([0-9.]+)\)", self.stderr)
        return float(found.group(1)) if found else float("nan")


def finished_like_a_clean_run(run: Run, check: Check, restarts: int, resumed_at: int, np: int = NP,
                              steps: int = STEPS) -> None:
    check(run.code == 0, f"troupe-run exit status {run.code} == 0")
    check(run.result() == expected_value(steps, np),
          f"final value {run.result()} equals the value of a run that never failed ({expected_value(steps, np)})")
    finish = run.of("finish")
    check(len(finish) == 1 and finish[0]["status"] == "succeeded" and finish[0]["restarts"] == restarts,
          f"finish event says succeeded after {restarts} restart(s): {finish}")
    resumes = [e for e in run.of("resume") if e["restart"] == 1]
    check(len(resumes) == 1 and resumes[0]["step"] == resumed_at,
          f"the relaunch resumed at step {resumed_at}: {resumes}")
    check(f"starting at step {resumed_at}" in run.stdout, f"rank 0 printed 'starting at step {resumed_at}'")


def crash(args, check: Check, extra: list[str] = []) -> None:
    run = Run(args, args.scenario, "rank=1,step=17,kind=crash,restart=0", FAST + ["--max-restarts", "2"] + extra)
    failures = run.of("failure")
    check(len(failures) == 1 and failures[0]["cause"] == "rank_lost" and failures[0]["rank"] == 1,
          f"one failure, rank 1 lost: {failures}")
    detection = failures[0]["time"] - run.fault_time()
    check(0 <= detection < 1.0, f"rank 1's death detected {detection:.3f} s after the crash (< 1 s)")
    # One host: every rank is watched through a pidfd (LocalRanks), so the stop ends when
    # they have exited, not when mpirun notices (over a second later).
    stopped = run.of("stopped")
    check(len(stopped) == 1 and stopped[0].get("mpirun") == "killed once every rank had exited",
          f"the stop ended once the ranks' pidfds said they had exited: {stopped}")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=15)


def hang(args, check: Check) -> None:
    hang_timeout = 1.5
    run = Run(args, "hang", "rank=0,step=12,kind=hang,restart=0",
              FAST[:-1] + [str(hang_timeout), "--max-restarts", "2"])
    failures = run.of("failure")
    check(len(failures) == 1 and failures[0]["cause"] == "hang", f"one failure, a hang: {failures}")
    detail = failures[0]["detail"]
    check("rank 0 at step 12" in detail and "rank 1 at step 12" in detail, f"both ranks' steps reported: {detail}")
    by_rank = {r["rank"]: r for r in failures[0]["ranks"]}
    check(by_rank[0]["collective"] < by_rank[1]["collective"],
          f"rank 0 is behind: collective {by_rank[0]['collective']} < rank 1's {by_rank[1]['collective']}")
    check(re.search(r"behind: rank 0 \(never entered collective \d+\)", detail) is not None,
          f"the report names rank 0 as behind: {detail}")
    detection = failures[0]["time"] - run.fault_time()
    check(hang_timeout - 0.05 <= detection <= hang_timeout + 1.0,
          f"hang detected {detection:.3f} s after it began (within the {hang_timeout} s timeout + 1 s)")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=10)


def crash_before_first_save(args, check: Check) -> None:
    run = Run(args, "early", "rank=1,step=2,kind=crash,restart=0", FAST + ["--max-restarts", "1"])
    check(not any((run.ckpt / "toy-step.txt.tmp").exists() for _ in [0]), "no half-written save left")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=0)


def give_up(args, check: Check) -> None:
    run = Run(args, "give_up", "rank=1,step=3,kind=crash", FAST + ["--max-restarts", "2"])
    check(run.code == 1, f"troupe-run exit status {run.code} == 1 (gave up)")
    failures = run.of("failure")
    check(len(failures) == 3 and all(f["cause"] == "rank_lost" for f in failures),
          f"3 launches, 3 failures: {[f['cause'] for f in failures]}")
    finish = run.of("finish")
    check(len(finish) == 1 and finish[0]["status"] == "gave_up" and finish[0]["restarts"] == 2
          and finish[0]["causes"] == ["rank_lost"] * 3, f"finish says gave_up after 2 restarts: {finish}")
    check("summary: gave up after 2 restart(s)" in run.stderr and "time lost" in run.stderr,
          "stderr carries the closing summary")
    check([e["failed_in_a_row"] for e in run.of("restart")] == [1, 2],
          f"no launch saved a checkpoint, so the backoff's count grows: {run.of('restart')}")
    check(run.result() is None, "no result was written")


def throw(args, check: Check) -> None:
    run = Run(args, "throw", "rank=0,step=8,kind=throw,restart=0", FAST + ["--max-restarts", "1"])
    failures = run.of("failure")
    check(len(failures) == 1 and failures[0]["cause"] == "rank_lost" and failures[0]["rank"] == 0,
          f"an exception escaping on rank 0 is a lost rank, seen without waiting for mpirun: {failures}")
    check(len(failures) == 1 and failures[0].get("error", "").startswith("injected fault (TROUPE_FAULT) on rank 0"),
          f"the failure quotes the rank's error: {failures}")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=5)


def frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def hostile(args, check: Check) -> None:
    run = Run(args, "hostile", None, FAST, steps=60, step_ms=25, background=True)
    address = None
    deadline = time.time() + 10
    # troupe-run prints the server's address first; read it from the events log.
    while address is None and time.time() < deadline:
        starts = run.of("start")
        address = starts[0]["supervisor"] if starts else None
        time.sleep(0.02)
    check(address is not None, f"troupe-run announced its server: {address}")
    host, port = address.rsplit(":", 1)

    def send(data: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(data)
            chunks = []
            try:
                while chunk := s.recv(4096):
                    chunks.append(chunk)
            except ConnectionResetError:  # refused while our extra bytes were unread
                pass
            return b"".join(chunks)

    def s16(b: bytes) -> bytes:
        return struct.pack("<H", len(b)) + b
    run_id = run.of("start")[0]["run_id"].encode()
    hello = bytes([1]) + struct.pack("<H", PROTOCOL_VERSION) + s16(b"0" * 32) + s16(run_id) + struct.pack("<IIII", 0, 0, 2, 1) + s16(b"evil")
    answer = send(frame(hello))
    check(b"wrong token" in answer, f"a hello with a guessed token is answered 'wrong token': {answer!r}")
    send(b"\xff\xff\xff\xff" + os.urandom(64))
    send(frame(b"\x99" + os.urandom(15)))
    send(frame(b"\x04" + b"\x00" * 3))
    run.wait()
    reasons = [e["reason"] for e in run.of("refused")]
    check(any("wrong token" in r for r in reasons), "the wrong token was logged")
    check(any("length prefix 4294967295 exceeds" in r for r in reasons), "the huge length prefix was logged")
    check(len(reasons) >= 4, f"all 4 hostile connections were refused and logged: {reasons}")
    check(run.code == 0 and run.result() == expected_value(60, NP),
          f"the job was not disturbed: exit {run.code}, value {run.result()}")
    check(not run.of("failure"), "no failure was recorded")


def sigint(args, check: Check, sig: int = signal.SIGINT) -> None:
    run = Run(args, args.scenario, None, FAST, steps=1000, step_ms=20, background=True)
    deadline = time.time() + 10
    while len(run.of("rank_up")) < NP and time.time() < deadline:
        time.sleep(0.02)
    ups = run.of("rank_up")
    check(len(ups) == NP, f"both ranks registered: {len(ups)}")
    time.sleep(0.3)
    sent = time.time()
    run.process.send_signal(sig)
    run.wait(timeout=15)
    check(run.code == 128 + sig, f"exit status {run.code} == {128 + sig} after {signal.Signals(sig).name}")
    check(time.time() - sent < 3, f"stopped {time.time() - sent:.2f} s after {signal.Signals(sig).name}")
    check(not run.of("restart") and not run.of("failure"), "no failure and no restart")
    check(run.of("finish")[0]["status"] == "interrupted", "finish says interrupted")
    for e in ups:
        check(gone(e["pid"]), f"rank {e['rank']} (pid {e['pid']}) is gone")


def sigterm(args, check: Check) -> None:
    sigint(args, check, signal.SIGTERM)


def sighup(args, check: Check) -> None:
    """A closed terminal or ssh session stops the job in order, as SIGTERM does."""
    sigint(args, check, signal.SIGHUP)


def server_address(run: Run, check: Check) -> tuple[str, int]:
    """The heartbeat server's address, from the start event (written before the launch)."""
    deadline = time.time() + 10
    while not run.of("start") and time.time() < deadline:
        time.sleep(0.01)
    starts = run.of("start")
    check(bool(starts), "troupe-run announced its server")
    host, port = starts[0]["supervisor"].rsplit(":", 1)
    return host, int(port)


def lockout(args, check: Check) -> None:
    """100 rotating silent connections from the ranks' own address, from before the
    launch to the end: troupe-run evicts the oldest pending connection rather than
    refusing the newest, so every rank registers, and its refusal lines stay bounded."""
    run = Run(args, "lockout", None, FAST, steps=40, step_ms=25, background=True)
    host, port = server_address(run, check)
    stop, opened, began = threading.Event(), [0], [0.0]

    def flood() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            try:
                s = socket.create_connection((host, port), timeout=1)
                # Closed with RST, not FIN: thousands of TIME_WAIT sockets would use up
                # the ephemeral ports other tests on this machine connect from.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                held.append(s)
                opened[0] += 1
                began[0] = began[0] or time.time()
            except OSError:  # troupe-run has ended
                time.sleep(0.01)
            if len(held) > 100:
                held.pop(0).close()
            time.sleep(0.0005)  # a few thousand a second: a flood, not a CPU hog
        for s in held:
            s.close()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        run.wait()
    finally:
        stop.set()
        thread.join(timeout=5)
    print(f"the flood opened {opened[0]} connections in {run.elapsed:.1f} s")
    check(opened[0] >= 500, f"the flood was a flood: {opened[0]} connections")
    check(run.code == 0 and run.result() == expected_value(40),
          f"the job finished under the flood: exit {run.code}, value {run.result()}")
    ups = run.of("rank_up")
    check(len(ups) == NP and not run.of("failure"), "every rank registered, no failure")
    check(0 < began[0] < min(e["time"] for e in ups),
          f"the flood began {min(e['time'] for e in ups) - began[0]:.2f} s before the first rank registered")
    lines = [l for l in run.stderr.splitlines() if "troupe-run: refused a connection from" in l]
    summaries = [l for l in run.stderr.splitlines() if re.search(r"\d+ more refusal\(s\) in the last", l)]
    seconds = int(run.elapsed) + 2
    check(len(lines) <= 5 * seconds, f"{len(lines)} refusal lines in {run.elapsed:.1f} s (at most 5 a second)")
    check(summaries and "evicted" in summaries[0], f"the rest are summed up: {summaries[:2]}")
    events, summed = run.of("refused"), run.of("refused_summary")
    check(len(events) <= 20 * (seconds // 10 + 1), f"{len(events)} refused events (at most 20 per 10 s)")
    counted = len(events) + sum(e["count"] for e in summed)
    check(counted >= opened[0] // 2, f"{counted} refusals counted for {opened[0]} connections")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def job_processes(run_id: str) -> list[int]:
    """Live processes whose environment carries this run's TROUPE_RUN_ID: mpirun and
    every rank of the job, whoever their parent is now."""
    needle = f"TROUPE_RUN_ID={run_id}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def killed_troupe_run(args, check: Check) -> None:
    """kill -9 of troupe-run: no handler runs, yet mpirun (its parent-death signal) and
    the ranks (mpirun's teardown; a registered rank's fencing too) end within seconds --
    for ranks that registered, and for ranks that never could (`sleep`)."""
    sleep = [shutil.which("sleep"), "60"]
    for label, program, registered in [("registered ranks", None, NP), ("ranks without a client", sleep, 0)]:
        run = Run(args, "killed_troupe_run", None, FAST, steps=1000, step_ms=20, background=True, program=program)
        run_id, procs, seen = None, [], []
        try:
            # A process mid-fork or mid-exec can show the run's environment for a moment, so
            # the job counts as up once the same processes are seen twice 0.3 s apart.
            deadline = time.time() + 15
            while time.time() < deadline:
                run_id = run_id or next((e["run_id"] for e in run.of("start")), None)
                if run_id and len(run.of("rank_up")) == registered:
                    seen, procs = procs, sorted(job_processes(run_id))
                    if len(procs) >= NP + 1 and procs == seen:
                        break
                time.sleep(0.3)
            check(run_id is not None and len(procs) >= NP + 1 and procs == seen,
                  f"{label}: mpirun and {NP} ranks are running: {procs} (before: {seen})")
            killed = time.time()
            run.process.kill()
            run.wait(timeout=10)
            left = job_processes(run_id)
            while left and time.time() - killed < 5:
                time.sleep(0.02)
                left = job_processes(run_id)
            took = time.time() - killed
            check(not left, f"{label}: every process of the job is gone {took:.2f} s after kill -9 of troupe-run "
                            f"(left: {left})")
        finally:
            for pid in job_processes(run_id) if run_id else []:
                if pid > 1:  # never kill(-1) or init
                    os.kill(pid, signal.SIGKILL)


def gone(pid: int, within: float = 2.0) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts as gone)."""
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def crash_4ranks(args, check: Check) -> None:
    run = Run(args, "crash_4ranks", "rank=3,step=12,kind=crash,restart=0", FAST + ["--max-restarts", "1"], np=4)
    failures = run.of("failure")
    check(len(failures) == 1 and failures[0]["cause"] == "rank_lost" and failures[0]["rank"] == 3,
          f"one failure, rank 3 lost: {failures}")
    check(len([e for e in run.of("rank_up") if e["restart"] == 1]) == 4, "all 4 ranks registered again")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=10, np=4)


def stopped_rank(args, check: Check) -> None:
    """A rank that stops (SIGSTOP: alive, socket open, silent) is caught by the heartbeat
    timeout, and stopping the job still ends it (a fatal signal ends a stopped process)."""
    run = Run(args, "stopped_rank", None, ["--backoff", "0", "--grace", "0.5", "--heartbeat-timeout", "1",
                                          "--hang-timeout", "30", "--max-restarts", "1"],
              steps=60, step_ms=25, background=True)
    deadline = time.time() + 10
    while len(run.of("rank_up")) < NP and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    victim = [e for e in run.of("rank_up") if e["rank"] == 1][0]
    stopped_at = time.time()
    os.kill(victim["pid"], signal.SIGSTOP)
    run.wait()
    failures = run.of("failure")
    check(len(failures) == 1 and failures[0]["cause"] == "heartbeat_timeout" and failures[0]["rank"] == 1,
          f"one failure, rank 1's heartbeats stopped: {failures}")
    after = failures[0]["time"] - stopped_at
    # The last heartbeat left up to one interval (0.2 s) before the SIGSTOP.
    check(0.7 <= after <= 1.5, f"detected {after:.2f} s after SIGSTOP (heartbeat timeout 1 s)")
    check(gone(victim["pid"]), "the stopped rank is gone")
    check(run.code == 0 and run.result() == expected_value(60), f"the relaunch finished: exit {run.code}")


def mpirun_exit(args, check: Check) -> None:
    missing = str(Path(args.workdir) / "no-such-program")
    run = Run(args, "mpirun_exit", None, FAST + ["--max-restarts", "1"], program=[missing])
    failures = run.of("failure")
    check(len(failures) == 2 and all(f["cause"] == "mpirun_exit" for f in failures)
          and "mpirun exited with status" in failures[0]["detail"],
          f"mpirun's non-zero exit is a failure on each launch: {[f['detail'] for f in failures]}")
    check(run.code == 1 and run.of("finish")[0]["status"] == "gave_up", f"gave up: exit {run.code}")


def unregistered(args, check: Check) -> None:
    """A rank that never registers while the others do is stuck: a hang after the timeout."""
    run = Run(args, "unregistered", None, ["--backoff", "0", "--grace", "1", "--hang-timeout", "1.5",
                                          "--max-restarts", "0"],
              program=[args.trainer, "--steps", "200", "--step-ms", "20", "--no-client-rank", "1"])
    failures = run.of("failure")
    check(len(failures) == 1 and failures[0]["cause"] == "hang"
          and "rank(s) 1 never registered within the hang timeout" in failures[0]["detail"],
          f"rank 1 reported as never registered: {failures}")
    check(run.code == 1, f"gave up (max-restarts 0): exit {run.code}")


def crash_tcp(args, check: Check) -> None:
    hostfile = Path(args.workdir) / "hostfile-localhost-twice"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    hostfile.write_text("localhost\nlocalhost\n")
    # The cluster path: TCP between ranks, hosts from a hostfile, the heartbeat server on
    # every interface (ranks are told this host's name, not 0.0.0.0).
    crash(args, check, ["--mca", "btl", "self,tcp", "--hostfile", str(hostfile), "--bind", "0.0.0.0:0"])


def bad_flags(args, check: Check) -> None:
    for flags, text in [(["-np", "2", "--max-restarts", "many", "--", "x"], "--max-restarts 'many'"),
                        (["-np", "2", "--bogus", "--", "x"], "unknown option '--bogus'"),
                        (["-np", "2"], "no program given")]:
        p = subprocess.run([args.troupe_run, *flags], capture_output=True, text=True, timeout=10)
        check(p.returncode == 2 and text in p.stderr and "usage: troupe-run" in p.stderr,
              f"{' '.join(flags)} -> exit {p.returncode}, says {text!r} and prints usage")
    p = subprocess.run([args.troupe_run, "-np", "2", "--fault", "rank=1,step=oops,kind=crash", "--", "x"],
                       capture_output=True, text=True, timeout=10)
    check(p.returncode == 2 and "step='oops'" in p.stderr, f"--fault with a bad spec -> exit {p.returncode}: {p.stderr}")
    # Not armed: a TROUPE_FAULT left in the environment is named and ignored, the job runs.
    env = dict(os.environ, TROUPE_FAULT="rank=1,step=2,kind=crash")
    env.pop("TROUPE_FAULT_ARMED", None)
    d = Path(args.workdir) / "unarmed_fault"
    p = subprocess.run([args.troupe_run, "-np", "2", "--max-restarts", "0", "--checkpoint-dir", str(d), "--backoff", "0",
                        "--", args.trainer, "--steps", "3"], capture_output=True, text=True, env=env, timeout=30)
    check(p.returncode == 0 and "ignoring TROUPE_FAULT='rank=1,step=2,kind=crash': fault injection is not armed"
          in p.stderr and "troupe fault:" not in p.stderr,
          f"an unarmed TROUPE_FAULT is ignored with a warning (exit {p.returncode}): {p.stderr}")
    env = dict(os.environ, TROUPE_FAULT="rank=1,step=oops,kind=crash", TROUPE_FAULT_ARMED="1")
    d = Path(args.workdir) / "bad_fault"
    shutil.rmtree(d, ignore_errors=True)  # a workdir kept from an earlier run holds its events
    p = subprocess.run([args.troupe_run, "-np", "2", "--max-restarts", "0", "--checkpoint-dir", str(d), "--backoff", "0",
                        "--", args.trainer, "--steps", "3"], capture_output=True, text=True, env=env, timeout=30)
    check(p.returncode == 1 and "TROUPE_FAULT='rank=1,step=oops,kind=crash': step='oops'" in p.stderr,
          f"a malformed TROUPE_FAULT is named by the ranks and the job fails (exit {p.returncode}): {p.stderr}")
    events = [json.loads(line) for line in (d / "troupe-run-events.jsonl").read_text().splitlines()]
    failures = [e for e in events if e["event"] == "failure"]
    check(len(failures) == 1 and "step='oops'" in failures[0].get("error", "")
          and "failing with: TROUPE_FAULT=" in failures[0]["detail"],
          f"the failure quotes the error the rank sent before it dropped its connection: {failures}")


def slow_save(args, check: Check) -> None:
    # Saves of 2 s on every rank against a 1 s hang timeout: a slow phase, not a hang.
    steps = 12
    run = Run(args, "slow_save", None, ["--backoff", "0", "--grace", "1", "--hang-timeout", "1", "--max-restarts", "0"],
              steps=steps, program=[args.trainer, "--steps", str(steps), "--save-every", "5", "--step-ms", "20",
                                    "--save-ms", "2000"])
    check(run.code == 0 and not run.of("failure"), f"finished without a failure (exit {run.code}): {run.of('failure')}")
    check(run.result() == expected_value(steps), f"final value {run.result()} == {expected_value(steps)}")


def stuck_save(args, check: Check) -> None:
    # The same saves past a 1.5 s checkpoint_save deadline: a hang, named with its phase.
    run = Run(args, "stuck_save", None, ["--backoff", "0", "--grace", "1", "--hang-timeout", "1", "--max-restarts", "0",
                                         "--phase-timeout", "checkpoint_save=1.5"],
              steps=12, program=[args.trainer, "--steps", "12", "--save-every", "5", "--step-ms", "20",
                                 "--save-ms", "4000"])
    failures = run.of("failure")
    check(run.code == 1 and len(failures) == 1 and failures[0]["cause"] == "hang", f"one failure, a hang: {failures}")
    detail = failures[0]["detail"]
    check("no progress for 1.50 s in checkpoint_save" in detail and "(checkpoint_save on " in detail,
          f"the report names the phase and the host: {detail}")
    check(all(r["phase"] == "checkpoint_save" and r["step"] == 4 for r in failures[0]["ranks"]),
          f"every rank in checkpoint_save after step 4: {failures[0]['ranks']}")


def hang_dump(args, check: Check) -> None:
    """A rank hangs outside a collective while 3 others wait in the next all-reduce: the
    dump names it, the all-reduce's kind and number, and the waiting ranks, within the
    hang timeout + 2 s; every rank's file holds its flight record and thread stacks."""
    hang_timeout = 1.5
    run = Run(args, "hang_dump", "rank=0,step=12,kind=hang,restart=0",
              FAST[:-1] + [str(hang_timeout), "--max-restarts", "1"], np=4)
    dumps = run.of("dump")
    check(len(dumps) == 1 and dumps[0]["why"] == "hang", f"one dump, for the hang: {dumps}")
    lines = dumps[0]["ranks"]
    check(len(lines) == 4, f"a line per rank: {lines}")
    check(lines[0].startswith("rank 0 (step 12): in no collective; the last it finished: allreduce #12")
          and "FaultInjector" in lines[0], f"rank 0 is in no collective, its stack in the fault: {lines[0]}")
    for r in (1, 2, 3):
        check(re.match(rf"rank {r} \(step 12\): waits in allreduce #13 \(sum, 1 x i64 = 8 B\): in flight for", lines[r])
              is not None, f"rank {r} waits in allreduce #13: {lines[r]}")
    check(f"rank 1 (step 12): waits in allreduce #13" in run.stderr, "troupe-run printed the summary")
    failure = run.of("failure")[0]
    check(failure["cause"] == "hang" and "troupe-run-dumps" in failure["detail"], f"the verdict names the folder")
    within = failure["time"] - run.fault_time()
    check(within <= hang_timeout + 2.0, f"summary and verdict {within:.2f} s after the hang (<= {hang_timeout} + 2 s)")
    for r in range(4):
        text = (run.ckpt / "troupe-run-dumps" / f"rank-{r}.txt").read_text()
        check(text.startswith(f"troupe rank dump: rank {r} of 4") and "== threads ==" in text and
              re.search(r"^#\d+ +0x[0-9a-f]+ main$", text, re.M) is not None,
              f"rank {r}'s file: header, flight record and a symbolised main thread")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=10, np=4)


def crash_dump(args, check: Check) -> None:
    """A rank dies of a real SIGSEGV: its crash handler writes its stacks and last
    collectives before it goes, troupe-run's failure names the signal, the crashing
    frames and the file, and the job resumes and finishes as if nothing had happened."""
    run = Run(args, "crash_dump", "rank=1,step=17,kind=segv,restart=0", FAST + ["--max-restarts", "2"])
    failures = run.of("failure")
    check(len(failures) == 1, f"one failure: {failures}")
    crashes = failures[0].get("crashes", [])
    text = (run.ckpt / "troupe-run-dumps" / "crash-rank-1.txt").read_text()
    check(len(crashes) == 1 and crashes[0].startswith("rank 1 crashed: SIGSEGV (address 0x")
          and "FaultInjector::fire" in crashes[0] and "crash-rank-1.txt" in crashes[0],
          f"the failure names the signal, the crashing frames and the file: {crashes}")
    check("rank 1 crashed: SIGSEGV" in failures[0]["detail"], "and so does its detail")
    check("troupe: rank 1 crashed with SIGSEGV" in run.stderr, "the rank said so as it went")
    check(text.startswith("troupe rank dump: rank 1 of 2") and "\ncrashed: SIGSEGV (address 0x" in text
          and "== collectives" in text and "allreduce #" in text and "== threads ==" in text,
          "the crash file: header, signal, flight record and stacks")
    check(not (run.ckpt / "troupe-run-dumps" / "crash-rank-0.txt").exists(), "rank 0 did not crash")
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=15)


def plot_prometheus(query, out: Path) -> None:
    """The picture in docs/OBSERVABILITY.md: what Prometheus kept of the job, as a
    dashboard would draw it (--plot FILE; python3-matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("troupe_rank_step[5m]", "troupe_rank_step", "rank"),
              ("troupe_rank_steps_per_second[5m]", "troupe_rank_steps_per_second", "rank"),
              ("troupe_rank_heartbeat_age_seconds[5m]", "troupe_rank_heartbeat_age_seconds", "rank"),
              ("troupe_restarts_total[5m]", "troupe_restarts_total", None)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 7), sharex=True)
    results = [query(expr) for expr, _, _ in panels]
    start = min(float(series["values"][0][0]) for result in results for series in result)
    for ax, (_, title, label), result in zip(axes, panels, results):
        for series in result:
            points = [(float(t) - start, float(v)) for t, v in series["values"]]
            ax.step([t for t, _ in points], [v for _, v in points], where="post",
                    label=f"{label} {series['metric'].get(label)}" if label else None)
        ax.set_title(title, fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        if label:
            ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("s (rank 1 killed at step 200; troupe-run relaunched the job from step 200's checkpoint)",
                        fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


def dump_on_signal(args, check: Check) -> None:
    """`troupe-run dump DIR` (SIGUSR1 to the job's troupe-run): every rank dumps, the
    summary is printed, and the job goes on to finish."""
    run = Run(args, "dump_on_signal", None, FAST, steps=60, step_ms=40, background=True)
    deadline = time.time() + 20
    while not run.of("first_step") and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    asked = subprocess.run([args.troupe_run, "dump", str(run.ckpt)], capture_output=True, text=True, timeout=30)
    print(asked.stdout, end="")
    check(asked.returncode == 0 and "rank 0 (step" in asked.stdout and "rank 1 (step" in asked.stdout,
          f"troupe-run dump printed where both ranks are (exit {asked.returncode})")
    run.wait()
    gone = subprocess.run([args.troupe_run, "dump", str(run.ckpt)], capture_output=True, text=True, timeout=30)
    check(gone.returncode == 1 and "is not running" in gone.stdout, f"after the job, dump says so: {gone.stdout!r}")
    check(run.code == 0 and run.result() == expected_value(60), f"the job finished right (exit {run.code})")
    dumps = run.of("dump")
    check(len(dumps) == 1 and dumps[0]["why"] == "SIGUSR1" and len(dumps[0]["ranks"]) == 2,
          f"one dump of 2 ranks for SIGUSR1: {dumps}")
    check(not run.of("failure"), "no failure")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


SAMPLE = re.compile(r'^([a-z_:][a-z0-9_:]*)(\{[^}]*\})? (\S+)$')


def parse_metrics(text: str) -> dict[str, float]:
    """'name{labels}' -> value; raises ValueError on a line the text format does not allow."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        found = SAMPLE.match(line)
        if not found:
            raise ValueError(f"not a sample line: {line!r}")
        samples[found.group(1) + (found.group(2) or "")] = float(found.group(3))
    return samples


def metrics(args, check: Check) -> None:
    """--metrics serves Prometheus' text format while the job runs; the series go on
    across a relaunch (same run id) and count the restart and its cause."""
    port = free_port()
    run = Run(args, "metrics", "rank=1,step=40,kind=crash,restart=0",
              FAST + ["--max-restarts", "2", "--metrics", f"127.0.0.1:{port}"], steps=80, step_ms=30, background=True)
    url = f"http://127.0.0.1:{port}/metrics"
    scrapes: list[dict[str, float]] = []
    while run.process.poll() is None:
        try:
            status, text = http_get(url)
        except OSError:  # not listening yet, or already gone
            time.sleep(0.05)
            continue
        if status != 200:
            check(False, f"GET /metrics answered {status}")
        try:
            scrapes.append(parse_metrics(text))
        except ValueError as e:
            check(False, f"the text format: {e}")
        time.sleep(0.1)
    run.wait()
    finished_like_a_clean_run(run, check, restarts=1, resumed_at=40, steps=80)
    check(len(scrapes) >= 10, f"{len(scrapes)} scrapes while the job ran (>= 10)")
    start = run.of("start")[0]
    check(start.get("metrics") == url, f"the start event names the endpoint: {start.get('metrics')}")
    info = [k for s in scrapes for k in s if k.startswith("troupe_run_info")]
    check(set(info) == {f'troupe_run_info{{run_id="{start["run_id"]}"}}'}, f"one run id across the relaunch: {set(info)}")
    restarts = [s["troupe_restarts_total"] for s in scrapes]
    check(restarts[0] == 0 and restarts[-1] == 1 and restarts == sorted(restarts),
          f"troupe_restarts_total went 0 -> 1 and never back: {sorted(set(restarts))}")
    check(scrapes[-1].get('troupe_failures_total{cause="rank_lost"}') == 1,
          f"one failure, rank_lost: {[k for k in scrapes[-1] if k.startswith('troupe_failures')]}")
    steps = [s.get('troupe_rank_step{rank="0",host="%s"}' % socket.gethostname()) for s in scrapes]
    steps = [x for x in steps if x is not None]
    check(len(steps) >= 5 and max(steps) >= 60, f"rank 0's step reported and advancing: {steps[:3]} .. {steps[-3:]}")
    rates = [v for s in scrapes for k, v in s.items() if k.startswith("troupe_rank_steps_per_second")]
    check(any(10 <= r <= 40 for r in rates), f"a step rate near 1 / 30 ms: max {max(rates, default=0):.1f}")
    check(any(k.startswith("troupe_rank_phase") and k.endswith('phase="training"}') and v == 1
              for s in scrapes for k, v in s.items()), "a rank in phase training")


def metrics_errors(args, check: Check) -> None:
    """Requests other than GET /metrics get HTTP errors; a silent or oversized request
    is cut off; troupe-run goes on, and refuses a --metrics address it cannot use."""
    port = free_port()
    run = Run(args, "metrics_errors", None, FAST + ["--metrics", f"127.0.0.1:{port}"], steps=300, step_ms=30,
              background=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            http_get(base + "/")
            break
        except OSError:
            time.sleep(0.05)
    check(http_get(base + "/nothing")[0] == 404, "GET /nothing: 404")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"hello there\r\n\r\n")
        check(s.recv(100).startswith(b"HTTP/1.1 400"), "a request that is not HTTP: 400")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 20000)
        check(s.recv(100) == b"", "a request head over 8 KiB is closed without an answer")
    # More silent connections than the server keeps open: the extra ones are closed at
    # once, and /metrics answers again once the silent ones time out (5 s).
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
    answered, deadline = False, time.time() + 10
    while not answered and time.time() < deadline:
        try:
            status, text = http_get(base + "/metrics")
            answered = status == 200 and "troupe_step" in text
        except OSError:
            time.sleep(0.2)
    check(answered, "after 20 silent connections, /metrics answers within 10 s")
    for s in silent:
        s.close()
    run.wait()
    check(run.code == 0, f"troupe-run exit status {run.code} == 0")
    bad = Run(args, "metrics_bad", None, ["--metrics", "not-an-address:9"], steps=2, step_ms=1)
    check(bad.code == 2 and "--metrics: 'not-an-address' is not an IP address" in bad.stderr,
          f"a bad --metrics address is refused before anything starts (exit {bad.code})")


def prometheus(args, check: Check) -> None:
    """Debian's Prometheus scrapes a running job every second and keeps its series
    across a relaunch: read back through Prometheus' own HTTP API."""
    binary = shutil.which("prometheus")
    check(binary is not None, "prometheus is installed (scripts/setup installs it)")
    job_port, prom_port = free_port(), free_port()
    home = Path(args.workdir) / "prometheus"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "prometheus.yml").write_text(f"""global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: troupe
    static_configs:
      - targets: ['127.0.0.1:{job_port}']
""")
    server = subprocess.Popen([binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                              stderr=open(home / "prometheus.log", "w"))
    api = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if http_get(api + "/-/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        check(http_get(api + "/-/ready")[0] == 200, "prometheus is ready")
        # Prometheus starts each target's scrapes at an offset within its interval and
        # takes a few seconds to begin: a 12 s job, failing half-way.
        run = Run(args, "prometheus_job", "rank=1,step=200,kind=crash,restart=0",
                  FAST + ["--max-restarts", "2", "--metrics", f"127.0.0.1:{job_port}"], steps=400, step_ms=30)
        finished_like_a_clean_run(run, check, restarts=1, resumed_at=200, steps=400)

        def query(expr: str) -> list[dict]:
            import urllib.parse
            status, text = http_get(api + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
            check(status == 200, f"query {expr}: HTTP {status}")
            return json.loads(text)["data"]["result"]

        scraped = query('count_over_time(up{job="troupe"}[5m])')
        check(scraped and float(scraped[0]["value"][1]) >= 5, f"scraped at least 5 times (1 s interval) while the job ran: {scraped}")
        restarts = query("troupe_restarts_total[5m]")
        values = sorted({float(v) for series in restarts for _, v in series["values"]})
        check(len(restarts) == 1 and values == [0.0, 1.0],
              f"one troupe_restarts_total series, 0 then 1 across the relaunch: {len(restarts)} series, {values}")
        run_ids = {s["metric"]["run_id"] for s in query("troupe_run_info[5m]")}
        check(len(run_ids) == 1, f"one run id: {run_ids}")
        failures = query('max_over_time(troupe_failures_total{cause="rank_lost"}[5m])')
        check(failures and float(failures[0]["value"][1]) == 1, f"one rank_lost failure: {failures}")
        steps = query('max_over_time(troupe_rank_step{rank="1"}[5m])')
        check(steps and float(steps[0]["value"][1]) >= 250, f"rank 1's step series reached past the relaunch: {steps}")
        if args.plot:
            plot_prometheus(query, Path(args.plot))
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


SCENARIOS = {"crash": crash, "crash_4ranks": crash_4ranks, "stopped_rank": stopped_rank, "mpirun_exit": mpirun_exit, "unregistered": unregistered, "hang": hang, "crash_before_first_save": crash_before_first_save, "give_up": give_up,
             "slow_save": slow_save, "stuck_save": stuck_save, "throw": throw, "hostile": hostile, "sigint": sigint, "sigterm": sigterm,
             "sighup": sighup, "lockout": lockout, "killed_troupe_run": killed_troupe_run, "crash_tcp": crash_tcp, "bad_flags": bad_flags,
             "metrics": metrics, "metrics_errors": metrics_errors, "prometheus": prometheus,
             "hang_dump": hang_dump, "dump_on_signal": dump_on_signal, "crash_dump": crash_dump}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--troupe-run", required=True)
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--plot", help="prometheus: draw the series read back into this PNG")
    args = parser.parse_args()
    SCENARIOS[args.scenario](args, Check(args.scenario))


if __name__ == "__main__":
    main()
