"""Logs of attempts whose pods are gone, from the team's CloudWatch container log group.

Fluent Bit (components/container_logs.py, aws-for-fluent-bit) tails every container's log on
every node and puts each line of a team namespace into that team's group,
``/aws/eks/<cluster>/containers/<namespace>`` (``team_log_group_name``; the team's roles may read
it, no other team's), stream ``<namespace>.<pod>.<container>`` (``log_stream_name``). With the chart's ``logKey`` unset
(eks-charts stable/aws-for-fluent-bit values.yaml: ``cloudWatchLogs.logKey:`` empty) each event
is the whole record as JSON: the line under ``log`` and the Kubernetes filter's metadata under
``kubernetes`` (``pod_name``, ``pod_id``, ``namespace_name``, ``container_name``, labels).

A PyTorchJob's pods keep their name across attempts (the Training Operator recreates
``<job>-master-0`` after an exit 143), so one stream holds every attempt of a rank: the attempts
are told apart by ``kubernetes.pod_id``, the uid of each pod, in order of their first line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from components.container_logs import log_stream_name
from jobs.store import StoreError

# CloudWatch Logs API reference, FilterLogEvents: at most 10,000 events per page.
PAGE_LIMIT = 10_000


class LogArchiveError(StoreError):
    """The log group cannot be read: one line naming the group and the fix."""


@dataclass(frozen=True)
class PastAttempt:
    pod_uid: str
    first_ms: int
    last_ms: int
    lines: tuple[str, ...]


def _record(message: str) -> tuple[str, str]:
    """(pod uid, line) of one event; a message that is not Fluent Bit's JSON is a line of its own."""
    try:
        record = json.loads(message)
    except ValueError:
        return "", message.rstrip("\n")
    if not isinstance(record, dict) or "log" not in record:
        return "", message.rstrip("\n")
    kubernetes = record.get("kubernetes") or {}
    return str(kubernetes.get("pod_id") or ""), str(record["log"]).rstrip("\n")


class LogArchive:
    """One CloudWatch log group (``client``: a boto3 ``logs`` client; default one for ``region``)."""

    def __init__(self, group: str, region: str, client: Any = None):
        self.group = group
        self.region = region
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("logs", region_name=self.region)
        return self._client

    def _events(self, stream_prefix: str, since_ms: Optional[int]) -> Iterator[dict]:
        from botocore.exceptions import BotoCoreError, ClientError

        request: dict[str, Any] = {"logGroupName": self.group, "logStreamNamePrefix": stream_prefix, "limit": PAGE_LIMIT}
        if since_ms is not None:
            request["startTime"] = since_ms
        where = f"CloudWatch log group {self.group} ({self.region})"
        try:
            while True:
                page = self.client.filter_log_events(**request)
                yield from page.get("events") or []
                token = page.get("nextToken")
                if not token:
                    return
                request["nextToken"] = token
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException":
                raise LogArchiveError(f"{where} does not exist: the stack's container logs are off or not deployed "
                                      "(monitoring.containerLogs in Pulumi.<stack>.yaml)") from None
            if code in ("AccessDeniedException", "UnrecognizedClientException", "ExpiredTokenException"):
                raise LogArchiveError(f"cannot read {where}: {code}. Fix: log in to AWS with a role that may "
                                      "logs:FilterLogEvents on it (aws sso login; export AWS_PROFILE=...)") from None
            raise LogArchiveError(f"cannot read {where}: {code or exc}") from None
        except BotoCoreError as exc:  # no credentials, no region, no network
            raise LogArchiveError(f"cannot read {where}: {str(exc).splitlines()[0]}. Fix: log in to AWS "
                                  "(aws sso login, or export AWS_PROFILE=...) and run it again") from None

    def attempts(self, namespace: str, pod: str, container: str, *, exact: bool = True,
                 since_ms: Optional[int] = None) -> list[PastAttempt]:
        """The attempts of one pod name (``exact=False``: of every pod whose name starts with
        ``pod``, e.g. a JobSet pod's random suffix), oldest first."""
        exact_name = log_stream_name(namespace, pod, container)
        prefix = exact_name if exact else f"{namespace}.{pod}"
        by_uid: dict[str, list[tuple[int, str]]] = {}
        for event in self._events(prefix, since_ms):
            # The prefix is a prefix: job-master-0 would also find job-master-0x's stream.
            stream = str(event.get("logStreamName", ""))
            if (stream != exact_name) if exact else not stream.endswith(f".{container}"):
                continue
            uid, line = _record(str(event.get("message", "")))
            by_uid.setdefault(uid, []).append((int(event.get("timestamp") or 0), line))
        out = []
        for uid, rows in by_uid.items():
            rows.sort(key=lambda r: r[0])
            out.append(PastAttempt(uid, rows[0][0], rows[-1][0], tuple(line for _, line in rows)))
        return sorted(out, key=lambda a: a.first_ms)
