"""The test cluster's machine: one process holding a network namespace and a mount namespace of
its own, in which every process of a control plane runs.

    python -m tools.cluster.machine WORKDIR --api-fd N      (started by ControlPlane, never by hand)

Why a namespace of its own:

- ports: etcd, kube-apiserver, the controller manager, the scheduler and kwok listen on their
  usual fixed ports (2379, 6443, 10257, 10259, 10247) inside it, so two planes on one machine (the
  two stacks under ``make test``, another checkout) can never collide, and no port is chosen by a
  check-then-use probe. The one port the host sees is the API server's: the test process binds
  127.0.0.1:0, keeps the listening socket and hands its descriptor over (``--api-fd``); a
  forwarding thread here relays each connection to 6443 (bind and hand over: no race);
- a pod network: a bridge with the pod range's gateway address (``POD_GATEWAY``). Each pod the
  kubelet runs as a process gets a network namespace with a veth on it and the pod IP kwok's
  place would give it, so a Service's endpoint (pod IP:port, which the API server's endpoint
  validation requires outside 127.0.0.0/8) really reaches the process that serves it; kube-apiserver
  runs with ``--enable-aggregator-routing=true`` and dials webhooks and aggregated APIs there;
- nothing of this is visible outside: no interface, route, mount or file outside the work
  directory is created on the host.

The test process speaks to it over a Unix socket in the work directory
(``multiprocessing.connection`` with a random key): spawn a process here, ask whether it runs,
stop it, run a short command. Processes are spawned from the main thread only (the orphan guard of
tools/cluster/procs.py fires when the forking thread exits) and every one is stopped, in reverse
order, when the machine stops or when its parent (the test process) is gone.
"""
from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any, Optional

from tools.cluster import procs

POD_CIDR = "10.244.0.0/16"
POD_GATEWAY = "10.244.0.1"
POD_PREFIX = 16
BRIDGE = "mlp0"
API_PORT = 6443


def socket_path(workdir: Path) -> Path:
    return workdir / "machine.sock"


def key_path(workdir: Path) -> Path:
    return workdir / "machine.key"


class MachineClient:
    """The test process's side: one connection per call, so any thread may call."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def call(self, op: str, timeout_s: float = 120, **args) -> Any:
        with Client(str(socket_path(self.workdir)), family="AF_UNIX", authkey=key_path(self.workdir).read_bytes()) as conn:
            conn.send({"op": op, **args})
            if not conn.poll(timeout_s):
                raise TimeoutError(f"machine: no answer to {op} within {timeout_s:.0f} s")
            reply = conn.recv()
        if "error" in reply:
            raise RuntimeError(f"machine: {op} failed: {reply['error']}")
        return reply.get("result")


class Machine:
    def __init__(self, workdir: Path, api_fd: int):
        self.workdir = workdir
        self.api_listener = socket.socket(fileno=api_fd)
        self.parent = os.getppid()
        self.processes: dict[str, procs.Process] = {}
        self.order: list[str] = []
        self.requests: "queue.Queue[tuple[dict, queue.Queue]]" = queue.Queue()
        self.stopping = threading.Event()

    # -- network --
    def setup_network(self) -> None:
        batch = "\n".join([
            "link set lo up",
            f"link add {BRIDGE} type bridge",
            f"addr add {POD_GATEWAY}/{POD_PREFIX} dev {BRIDGE}",
            f"link set {BRIDGE} up",
        ]) + "\n"
        procs.run(["ip", "-batch", "-"], input=batch)

    def forward(self) -> None:
        """Relay each connection on the host's listening socket to the API server here."""
        while not self.stopping.is_set():
            try:
                client, _ = self.api_listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay_connection, args=(client,), daemon=True).start()

    @staticmethod
    def _relay_connection(client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", API_PORT), timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        other = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        other.start()
        pump(client, upstream)
        other.join()
        client.close()
        upstream.close()

    # -- requests --
    def serve(self, listener: Listener) -> None:
        while not self.stopping.is_set():
            try:
                conn = listener.accept()
            except (OSError, EOFError):
                if self.stopping.is_set():
                    return
                continue
            except Exception:  # noqa: BLE001 - a client with a wrong key: refuse it, keep serving
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        try:
            request = conn.recv()
            if request.get("op") in ("spawn", "stop_all"):
                reply: "queue.Queue[dict]" = queue.Queue()
                self.requests.put((request, reply))
                conn.send(reply.get())
            else:
                conn.send(self.handle(request))
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def handle(self, request: dict) -> dict:
        try:
            return {"result": getattr(self, f"op_{request.pop('op')}")(**request)}
        except Exception as exc:  # noqa: BLE001 - the caller gets the error, the machine keeps running
            return {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"}

    def op_ping(self) -> str:
        return "pong"

    def op_spawn(self, name: str, argv: list[str], log: str, env: Optional[dict] = None,
                 cwd: Optional[str] = None) -> int:
        if name in self.processes and self.processes[name].alive():
            raise ValueError(f"a process named {name} already runs")
        process = procs.spawn(name, argv, Path(log), env=env, cwd=Path(cwd) if cwd else self.workdir)
        self.processes[name] = process
        if name in self.order:
            self.order.remove(name)
        self.order.append(name)
        return process.pid

    def op_status(self, name: str) -> dict:
        process = self.processes.get(name)
        if process is None:
            return {"known": False, "alive": False, "returncode": None}
        return {"known": True, "alive": process.alive(), "returncode": process.popen.returncode, "pid": process.pid}

    def op_stop(self, name: str, grace_s: float = 10.0) -> Optional[int]:
        process = self.processes.get(name)
        if process is None:
            return None
        process.stop(grace_s)
        return process.popen.returncode

    def op_signal(self, name: str, sig: int) -> None:
        process = self.processes.get(name)
        if process is not None:
            process.signal(sig)

    def op_run(self, argv: list[str], input: Optional[str] = None, timeout_s: float = 60) -> dict:
        result = procs.run(argv, input=input, timeout_s=timeout_s, check=False)
        return {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}

    def op_stop_all(self, grace_s: float = 10.0) -> None:
        for name in reversed(self.order):
            self.processes[name].stop(grace_s)

    # -- life --
    def run(self) -> int:
        self.setup_network()
        key = os.urandom(32)
        path = key_path(self.workdir)
        path.write_bytes(key)
        path.chmod(0o600)
        listener = Listener(str(socket_path(self.workdir)), family="AF_UNIX", authkey=key)
        threading.Thread(target=self.serve, args=(listener,), daemon=True).start()
        threading.Thread(target=self.forward, daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        (self.workdir / "machine.ready").write_text(str(os.getpid()))
        while not self.stopping.is_set():
            if os.getppid() != self.parent:  # the test process is gone: nobody will stop us
                break
            try:
                request, reply = self.requests.get(timeout=0.5)
            except queue.Empty:
                continue
            reply.put(self.handle(request))
        self.stopping.set()
        self.op_stop_all(grace_s=5.0)
        listener.close()
        self.api_listener.close()
        return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster.machine")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--api-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return Machine(args.workdir, args.api_fd).run()


if __name__ == "__main__":
    sys.exit(main())
