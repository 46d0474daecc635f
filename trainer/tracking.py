"""Experiment tracking: a JSONL file next to the checkpoints (always) and MLflow (rank 0).

MLflow calls run on a background thread with a buffer, so an unreachable tracking server
costs warnings, never training time; the buffer is flushed when the server is back.
A resumed job reattaches to its run (by run id from the checkpoint, else by the job-id tag),
drops the points its previous attempt had already logged, so each step appears once, and
sends whatever MLflow lacks of the steps up to the checkpoint from `metrics.jsonl`, the
durable record (points buffered in memory die with a killed process).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

JOB_TAG = "trainer.job_id"
# Which history of the job a run holds: "main", or the rollback branch (trainer/branch.py).
# A rollback starts a new run (same job id, tags below), so the run the export registers
# against shows the curve that produced the model; the abandoned run keeps its own points.
BRANCH_TAG = "trainer.branch"
ROLLBACK_OF_TAG = "trainer.rollback_of"
BRANCH_POINT_TAG = "trainer.branch_point"
LOSS = "loss"
# A sweep (jobs/sweep.py): every point's run is a child of one parent run, found by these tags.
SWEEP_TAG = "trainer.sweep_id"
SWEEP_PARENT_TAG = "trainer.sweep_parent"
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag (mlflow/utils/mlflow_tags.py MLFLOW_PARENT_RUN_ID)
# Set by the platform on every pod of a sweep (jobs/sweep.py): the sweep's id and display name.
SWEEP_ID_ENV = "TRAINER_SWEEP_ID"
SWEEP_NAME_ENV = "TRAINER_SWEEP_NAME"


class NullTracker:
    run_id: str | None = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_summary(self, summary: dict[str, Any]) -> None:
        pass

    def log_artifact(self, local_dir: str, artifact_path: str) -> None:
        """Uploads a directory (e.g. a profiler trace) to the run; files stay where they are."""

    def close(self, status: str, timeout_seconds: float = 30.0) -> None:
        pass

    def sync(self) -> None:
        """Makes what was logged so far durable (called before a checkpoint's marker)."""

    def logged(self, step: int, name: str) -> bool:
        """Whether `name` was logged for `step` by an attempt whose checkpoint covers it."""
        return False


class JsonlTracker(NullTracker):
    """One line per step in `<checkpoint dir>/metrics.jsonl`; on resume, lines past the
    resumed step (work lost after the last checkpoint) are dropped and recomputed."""

    def __init__(self, path: str, resume_step: int):
        self.path = path
        self.rows: list[dict] = []  # what the checkpoint covers: MLflow's backfill source
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except ValueError:  # the last line of a killed writer
                        continue
                    if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= resume_step:
                        self.rows.append(row)
        # Rewritten whole, then renamed: a kill here leaves the old file or the new one.
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in self.rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.file = open(path, "a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def log_summary(self, summary: dict[str, Any]) -> None:
        with open(os.path.join(os.path.dirname(self.path), "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def logged(self, step: int, name: str) -> bool:
        return any(row.get("step") == step and name in row for row in self.rows)

    def close(self, status: str, timeout_seconds: float = 30.0) -> None:
        if not self.file.closed:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()


class MLflowTracker(NullTracker):
    MAX_BUFFERED_POINTS = 5000
    def __init__(self, *, uri: str, experiment: str, job_id: str, run_name: str | None, run_id: str | None,
                 params: dict[str, Any], tags: dict[str, str], config_yaml: str, retry_seconds: float = 5.0,
                 client=None, backfill: list[dict] | None = None, branch: str = "main",
                 sweep: tuple[str, str] | None = None):
        # A dead server must fail fast inside the worker, not retry for minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri = uri
        self.experiment = experiment
        self.job_id = job_id
        self.run_name = run_name
        self.run_id = run_id
        self.params = {k: str(v) for k, v in params.items()}
        self.branch = branch
        self.tags = {**tags, JOB_TAG: job_id, BRANCH_TAG: branch}
        self.config_yaml = config_yaml
        self.sweep = sweep  # (sweep id, parent run name)
        self.retry_seconds = retry_seconds
        self._client = client
        self._connected = False
        # (key -> steps MLflow already holds) for a reattached run; None: a run created here.
        self._logged: dict[str, set[int]] | None = None
        now_ms = int(time.time() * 1000)
        self._backfill = [(row["step"], k, float(v), now_ms) for row in backfill or []
                          for k, v in row.items() if k != "step" and isinstance(v, (int, float))
                          and not isinstance(v, bool)]
        self._points: list[tuple[int, str, float, int]] = []
        self._summary: dict | None = None
        self._artifacts: list[tuple[str, str]] = []
        self._final_status: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._outage_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="mlflow-tracker", daemon=True)
        self._wake.set()  # connect at once: the run id goes into the first checkpoint's marker
        self._thread.start()

    # --- called from the training loop: never blocks on the network -------------------
    def log(self, step: int, metrics: dict[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        with self._lock:
            self._points += [(step, k, float(v), now_ms) for k, v in metrics.items() if v is not None]
            many = len(self._points) >= self.MAX_BUFFERED_POINTS
        # The thread sends what accumulated every `retry_seconds` (or when the buffer is
        # large): one request per interval instead of one per logging step. Each request
        # costs CPU on the training host (serialising, TLS; with a sqlite URI the whole
        # store), measured as part of the trainer's overhead in benchmarks/throughput_overhead.py.
        if many:
            self._wake.set()

    def log_summary(self, summary: dict[str, Any]) -> None:
        with self._lock:
            self._summary = summary
        self._wake.set()

    def log_artifact(self, local_dir: str, artifact_path: str) -> None:
        with self._lock:
            self._artifacts.append((local_dir, artifact_path))
        self._wake.set()

    def close(self, status: str, timeout_seconds: float = 30.0) -> None:
        self._final_status = status
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_seconds)
        if self._thread.is_alive() or self._points:
            log.warning("MLflow unreachable at exit: %d metric points not delivered (they are in metrics.jsonl)",
                        len(self._points))

    # --- background thread ----------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=self.retry_seconds)
            self._wake.clear()
            stopping = self._stopping
            try:
                self._connect()
                self._flush()
                if stopping:
                    self._finish()
                    return
                if self._outage_since is not None:
                    log.warning("MLflow reachable again after %.0f s; buffered metrics flushed",
                                time.time() - self._outage_since)
                    self._outage_since = None
            except Exception as exc:
                if self._outage_since is None:
                    self._outage_since = time.time()
                    log.warning("MLflow at %s unreachable (%s): training continues, metrics buffered",
                                self.uri, str(exc).splitlines()[0][:200])
                if stopping:
                    time.sleep(min(self.retry_seconds, 1.0))  # keep retrying until close() gives up

    def _client_(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _connect(self) -> None:
        if self._connected:
            return
        client = self._client_()
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(self.experiment)
        run = client.get_run(self.run_id) if self.run_id else None
        if run is None:
            found = client.search_runs([experiment_id], filter_string=f"tags.`{JOB_TAG}` = '{self.job_id}'",
                                       max_results=100, order_by=["attributes.start_time ASC"])
            # Runs from before branches were tagged belong to main.
            found = [r for r in found if r.data.tags.get(BRANCH_TAG, "main") == self.branch]
            run = found[0] if found else None
        if self.sweep is not None:
            self.tags.update({SWEEP_TAG: self.sweep[0], PARENT_RUN_TAG: self._sweep_parent(client, experiment_id)})
        if run is None:
            run = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
            client.log_text(run.info.run_id, self.config_yaml, "config.yaml")
        else:
            client.update_run(run.info.run_id, status="RUNNING")
            self._logged = {}
        self.run_id = run.info.run_id
        with self._lock:  # what the previous attempts wrote to metrics.jsonl goes first
            self._points, self._backfill = self._backfill + self._points, []
        self._log_params_and_tags(client, run)
        self._connected = True

    def _sweep_parent(self, client, experiment_id: str) -> str:
        """The sweep's parent run: the oldest run tagged as its parent, created by whichever point
        connects first. Two points racing may both create one; every point then names the
        oldest, and the other stays an empty run of the sweep."""
        sweep_id, name = self.sweep  # type: ignore[misc]
        query = f"tags.`{SWEEP_TAG}` = '{sweep_id}' and tags.`{SWEEP_PARENT_TAG}` = 'true'"

        def oldest():
            found = client.search_runs([experiment_id], filter_string=query, max_results=1,
                                       order_by=["attributes.start_time ASC"])
            return found[0] if found else None

        parent = oldest()
        if parent is None:
            created = client.create_run(experiment_id, run_name=name, tags={SWEEP_TAG: sweep_id, SWEEP_PARENT_TAG: "true"})
            parent = oldest() or created
        return parent.info.run_id

    def _log_params_and_tags(self, client, run) -> None:
        from mlflow.entities import Param, RunTag

        existing = run.data.params
        new = [Param(k, v[:6000]) for k, v in self.params.items() if k not in existing]
        changed = {k: v for k, v in self.params.items() if k in existing and existing[k] != v[:6000]}
        tags = dict(self.tags)
        # MLflow params are immutable: a resume with a different value is recorded as a tag.
        tags.update({f"resumed_with.{k}": v for k, v in changed.items()})
        for i in range(0, max(len(new), 1), 100):
            client.log_batch(self.run_id, params=new[i : i + 100],
                             tags=[RunTag(k, str(v)) for k, v in tags.items()] if i == 0 else [])

    def _flush(self) -> None:
        from mlflow.entities import Metric

        with self._lock:
            points, self._points = self._points, []
        if self._logged is not None:
            for key in {p[1] for p in points} - self._logged.keys():
                try:
                    self._logged[key] = {m.step for m in self._client_().get_metric_history(self.run_id, key)}
                except Exception:
                    with self._lock:
                        self._points = points + self._points
                    raise
        # Steps MLflow holds already are replays of identical computation (or were sent from
        # metrics.jsonl); everything else, backfill included, is sent once.
        seen = self._logged or {}
        fresh = [p for p in points if p[0] not in seen.get(p[1], ())]
        num_sent = 0
        try:
            for i in range(0, len(fresh), 1000):
                batch = fresh[i : i + 1000]
                self._client_().log_batch(self.run_id, metrics=[Metric(k, v, ts, s) for s, k, v, ts in batch])
                num_sent += len(batch)
                if self._logged is not None:
                    for s, k, _, _ in batch:
                        self._logged.setdefault(k, set()).add(s)
        except Exception:
            with self._lock:
                self._points = fresh[num_sent:] + self._points
            raise
        with self._lock:
            artifacts, self._artifacts = self._artifacts, []
        for i, (local_dir, artifact_path) in enumerate(artifacts):
            try:
                self._client_().log_artifacts(self.run_id, local_dir, artifact_path)
            except Exception:
                with self._lock:
                    self._artifacts = artifacts[i:] + self._artifacts
                raise
        with self._lock:
            summary, self._summary = self._summary, None
        if summary is not None:
            self._client_().log_dict(self.run_id, summary, "goodput.json")
            self._client_().log_batch(self.run_id, metrics=[
                Metric(f"goodput/{k}", float(v), int(time.time() * 1000), 0)
                for k, v in summary.items() if isinstance(v, (int, float))])

    def _finish(self) -> None:
        if self._final_status:
            self._client_().set_terminated(self.run_id, status=self._final_status)


class Trackers(NullTracker):
    def __init__(self, *trackers):
        self.trackers = trackers

    @property
    def run_id(self) -> str | None:
        return next((t.run_id for t in self.trackers if t.run_id), None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for t in self.trackers:
            t.log(step, metrics)

    def log_summary(self, summary: dict[str, Any]) -> None:
        for t in self.trackers:
            t.log_summary(summary)

    def log_artifact(self, local_dir: str, artifact_path: str) -> None:
        for t in self.trackers:
            t.log_artifact(local_dir, artifact_path)

    def close(self, status: str, timeout_seconds: float = 30.0) -> None:
        for t in self.trackers:
            t.close(status, timeout_seconds)

    def sync(self) -> None:
        for t in self.trackers:
            t.sync()

    def logged(self, step: int, name: str) -> bool:
        return any(t.logged(step, name) for t in self.trackers)
