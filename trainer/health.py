"""The trainer's health on a Prometheus endpoint, from rank 0 only.

``health_exporter(env)`` returns an ``HttpHealth`` serving ``/metrics`` (text exposition 0.0.4,
stdlib http.server in a daemon thread) when ``TRAINER_METRICS_PORT`` is set on rank 0, else a
``NoHealth`` that does nothing. ``update`` takes values the loop already holds on the host at
its log points (no device sync of its own) and stores them; scrapes read the last values.

The platform's PodMonitor (workloads/monitoring/stack.py) scrapes the port named ``metrics``;
the alerts in workloads/monitoring/alerts.py read these names.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

log = logging.getLogger(__name__)

PORT_ENV = "TRAINER_METRICS_PORT"
JOB_ENV = "TRAINER_JOB_NAME"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"

# name -> help; every value is a gauge.
METRICS: dict[str, str] = {
    "mlp_trainer_step": "Last optimizer step completed.",
    "mlp_trainer_last_step_timestamp_seconds": "Unix time of the last reported step.",
    "mlp_trainer_step_seconds": "Mean compute seconds per step over the last log interval.",
    "mlp_trainer_tokens_per_second": "Tokens per second over the last log interval (all ranks).",
    "mlp_trainer_mfu_ratio": "Model FLOPs utilisation (0-1); absent where the peak is unknown.",
    "mlp_trainer_loss": "Training loss at the last log step (mean over ranks).",
    "mlp_trainer_last_checkpoint_step": "Step of the newest durable checkpoint.",
    "mlp_trainer_last_checkpoint_timestamp_seconds": "Unix time the newest durable checkpoint was first seen.",
    "mlp_trainer_checkpoint_interval_steps": "Configured steps between checkpoints.",
    "mlp_trainer_goodput_ratio": "Productive share of the job's wall time over every attempt.",
    "mlp_trainer_restarts": "Restarts of the job so far (attempts minus one).",
    "mlp_trainer_heartbeat_timestamp_seconds": "Unix time of this scrape's answer: the process is alive.",
}
METRIC_NAMES = frozenset(METRICS)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class NoHealth:
    """Health export off (not rank 0, or no port): every call is a no-op."""

    port: Optional[int] = None

    def update(self, **values: Any) -> None:
        pass

    def close(self) -> None:
        pass


class HttpHealth:
    def __init__(self, port: int, job_name: str, restarts: int, checkpoint_interval_steps: int = 0,
                 host: str = "0.0.0.0"):
        self._labels = f'job_name="{_escape(job_name)}"'
        self._values: dict[str, float] = {"mlp_trainer_restarts": float(restarts),
                                          "mlp_trainer_checkpoint_interval_steps": float(checkpoint_interval_steps)}
        self._lock = threading.Lock()
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = health.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes every 30 s would flood the log
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="trainer-health", daemon=True)
        self._thread.start()

    def update(self, *, step: int, loss: float, tokens_per_second: float, step_seconds: float,
               mfu: Optional[float], goodput: float, checkpoint_step: Optional[int]) -> None:
        now = time.time()
        with self._lock:
            v = self._values
            if checkpoint_step is not None and checkpoint_step != v.get("mlp_trainer_last_checkpoint_step"):
                v["mlp_trainer_last_checkpoint_step"] = float(checkpoint_step)
                v["mlp_trainer_last_checkpoint_timestamp_seconds"] = now
            v.update({"mlp_trainer_step": float(step), "mlp_trainer_last_step_timestamp_seconds": now,
                      "mlp_trainer_loss": float(loss), "mlp_trainer_tokens_per_second": float(tokens_per_second),
                      "mlp_trainer_step_seconds": float(step_seconds), "mlp_trainer_goodput_ratio": float(goodput)})
            if mfu is not None:
                v["mlp_trainer_mfu_ratio"] = float(mfu)

    def render(self) -> str:
        with self._lock:
            values = {**self._values, "mlp_trainer_heartbeat_timestamp_seconds": time.time()}
        lines = []
        for name, help_text in METRICS.items():
            if name in values:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                          f"{name}{{{self._labels}}} {_format(values[name])}"]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def health_exporter(is_main: bool, job_name: str, checkpoint_interval_steps: int = 0,
                    environ: Optional[dict[str, str]] = None) -> "HttpHealth | NoHealth":
    environ = dict(os.environ if environ is None else environ)
    port = environ.get(PORT_ENV)
    if not is_main or not port:
        return NoHealth()
    try:
        return HttpHealth(int(port), environ.get(JOB_ENV) or job_name, int(environ.get(RESTART_ENV) or 0),
                          checkpoint_interval_steps)
    except (ValueError, OSError) as exc:
        # Health export must never stop training: the job runs unobserved and says so.
        log.warning("trainer health endpoint not started (%s=%r): %s", PORT_ENV, port, exc)
        return NoHealth()
