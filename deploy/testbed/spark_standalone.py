#!/usr/bin/env python3
"""A private Spark standalone cluster (one master, one or more workers) from the venv's pyspark.

    .venv/bin/python deploy/testbed/spark_standalone.py start [--workers 1] [--cores 2] [--memory 2g]
    .venv/bin/python deploy/testbed/spark_standalone.py check    # a tiny job through the master
    aldebaran audit --traces DIR --master spark://127.0.0.1:7077
    .venv/bin/python deploy/testbed/spark_standalone.py stop

Why: the audit's `--master` is a plain Spark master URL, so the same command that runs in
local mode runs on a cluster. This starts the standalone master and worker the pyspark
wheel ships (`spark-class org.apache.spark.deploy.master.Master` / `...worker.Worker`),
bound to 127.0.0.1 (SPARK_LOCAL_IP, --host), web UIs on free ports, logs and work dirs
under one root; `--workers N` starts N workers of `--cores` cores each; `stop` ends the
JVMs by their pids (never by name) and deletes it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
ROOT = Path(os.environ.get("ALDEBARAN_SPARK_ROOT", f"/tmp/aldebaran-spark-{os.getuid()}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(ROOT / "logs"),
               SPARK_WORKER_DIR=str(ROOT / "work"), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    return env


def _spawn(name: str, *args: str) -> int:
    with open(ROOT / f"{name}.out", "ab") as log:  # the child keeps its own copy
        process = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=_env(), stdout=log,
                                   stderr=log, start_new_session=True)
    return process.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start(port: int, cores: int, memory: str, timeout: float = 120, workers: int = 1) -> dict[str, object]:
    if (ROOT / "state.json").exists():
        raise SystemExit(f"a Spark test bed already lives under {ROOT}: stop it first")
    if _open(port):
        raise SystemExit(f"port {port} is in use")
    for sub in ("logs", "work"):
        (ROOT / sub).mkdir(parents=True, exist_ok=True)
    state: dict[str, object] = {"master_url": f"spark://127.0.0.1:{port}", "port": port,
                                "master_ui": _free_port(), "worker_ui": _free_port()}
    try:
        state["master_pid"] = _spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                     "--port", str(port), "--webui-port", str(state["master_ui"]))
        (ROOT / "state.json").write_text(json.dumps(state))
        _wait(lambda: _open(port), timeout, "master")
        for n in range(workers):
            name = "worker" if n == 0 else f"worker{n + 1}"
            ui = state["worker_ui"] if n == 0 else _free_port()
            state[f"{name}_pid"] = _spawn(name, "org.apache.spark.deploy.worker.Worker", str(state["master_url"]),
                                          "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                                          "--webui-port", str(ui), "--work-dir", str(ROOT / "work"))
            (ROOT / "state.json").write_text(json.dumps(state))
            _wait(lambda name=name: "Successfully registered with master" in _read(f"{name}.out"),
                  timeout, name)
    except BaseException:
        stop()
        raise
    return state


def _read(name: str) -> str:
    path = ROOT / name
    return path.read_text(errors="replace") if path.exists() else ""


def _wait(ready, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise RuntimeError(f"Spark {what} not up after {timeout:.0f}s:\n{_read(what + '.out')[-2000:]}")


def stop() -> None:
    state = json.loads(_read("state.json") or "{}")
    for key in [k for k in state if k.startswith("worker") and k.endswith("_pid")] + ["master_pid"]:
        pid = state.get(key)
        if not pid or not _alive(int(pid)):
            continue
        os.killpg(int(pid), signal.SIGTERM)  # the JVM leads its own session/process group
        deadline = time.monotonic() + 30
        while _alive(int(pid)) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(pid), os.WNOHANG)
            time.sleep(0.3)
        if _alive(int(pid)):
            os.killpg(int(pid), signal.SIGKILL)
    shutil.rmtree(ROOT, ignore_errors=True)


def check(master: str) -> str:
    """A tiny job through the master: proves executors run on the worker."""
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("aldebaran-testbed-check")
             .config("spark.ui.enabled", "false").config("spark.executor.memory", "1g").getOrCreate())
    try:
        total = spark.sparkContext.parallelize(range(100_000), 4).map(lambda x: x * 2).sum()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()  # type: ignore[union-attr]
        return f"sum {total} computed on {master} ({executors - 1} executor(s) besides the driver)"
    finally:
        spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("start")
    st.add_argument("--port", type=int, default=7077)
    st.add_argument("--workers", type=int, default=1, help="workers to start (each with --cores and --memory)")
    st.add_argument("--cores", type=int, default=2)
    st.add_argument("--memory", default="2g")
    sub.add_parser("stop")
    sub.add_parser("status")
    sub.add_parser("check")
    args = parser.parse_args()
    if args.command == "start":
        state = start(args.port, args.cores, args.memory, workers=args.workers)
        print(f"Spark standalone master {state['master_url']} (UI :{state['master_ui']}), {args.workers} worker(s) "
              f"registered (first UI :{state['worker_ui']}); logs under {ROOT}")
    elif args.command == "stop":
        stop()
        print("Spark test bed stopped and removed")
    elif args.command == "status":
        state = json.loads(_read("state.json") or "{}")
        for key in [k for k in state if k.endswith("_pid")]:
            pid = state.get(key)
            print(f"{key}: {pid} {'running' if pid and _alive(int(pid)) else 'stopped'}")
        print(state.get("master_url", "no test bed"))
    elif args.command == "check":
        state = json.loads(_read("state.json") or "{}")
        print(check(str(state.get("master_url", "spark://127.0.0.1:7077"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
