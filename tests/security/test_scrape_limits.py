"""Flooding the shared Prometheus from a team pod (security review 4, N12), from the attacker's
seat: team A's code (or a bare pod carrying the scrape label) serves a million series on the
trainer's metrics port. What refuses it is the scrape limit on the team's PodMonitors: Prometheus
"If more than this number of samples are present after metric relabeling the entire scrape will
be treated as failed" (Prometheus docs, scrape_config ``sample_limit``; prometheus-operator maps
PodMonitor ``sampleLimit`` to it, and ``targetLimit``/``labelLimit``/``label_*_length_limit`` the
same way: "If more than this number of targets are present after target relabeling, Prometheus
will mark the targets as failed without scraping them").

``scrape`` ports the sample-limit and label-limit checks of prometheus ``scrape/scrape.go``
(``sampleLimitAppender``: ``if app.limit > 0 && i > app.limit { return errSampleLimit }``;
``verifyLabelLimits``).
"""
from __future__ import annotations

from typing import Any

from trainer.health import HttpHealth
from workloads.monitoring import stack


def team_monitors(namespace: str = "team-a") -> list[dict[str, Any]]:
    return [stack.trainer_pod_monitor(namespace), stack.trainjob_pod_monitor(namespace)]


def scrape(exposition: str, spec: dict[str, Any]) -> tuple[bool, int]:
    """(accepted, samples ingested) for one scrape of this exposition under the monitor's limits."""
    samples = [line for line in exposition.splitlines() if line and not line.startswith("#")]
    limit = spec.get("sampleLimit", 0)
    if limit > 0 and len(samples) > limit:
        return False, 0
    for line in samples:
        labels = line.split("{", 1)[1].rsplit("}", 1)[0].split(",") if "{" in line else []
        if spec.get("labelLimit", 0) and len(labels) + 1 > spec["labelLimit"]:  # + __name__
            return False, 0
        for pair in labels:
            name, _, value = pair.partition("=")
            if spec.get("labelNameLengthLimit", 0) and len(name) > spec["labelNameLengthLimit"]:
                return False, 0
            if spec.get("labelValueLengthLimit", 0) and len(value.strip('"')) > spec["labelValueLengthLimit"]:
                return False, 0
    return True, len(samples)


def flood(series: int) -> str:
    return "\n".join(f'attack_series{{i="{i}"}} 1' for i in range(series)) + "\n"


def test_a_million_series_from_a_team_pod_are_not_ingested():
    for monitor in team_monitors():
        accepted, ingested = scrape(flood(1_000_000), monitor["spec"])
        assert not accepted and ingested == 0, monitor["metadata"]["name"]


def test_huge_labels_are_not_ingested():
    exposition = 'x{' + ",".join(f'l{i}="v"' for i in range(200)) + '} 1\n' + f'y{{l="{"v" * 100_000}"}} 1\n'
    for monitor in team_monitors():
        assert scrape(exposition, monitor["spec"]) == (False, 0), monitor["metadata"]["name"]


def test_many_labelled_pods_are_capped_as_targets():
    for monitor in team_monitors():
        assert 0 < monitor["spec"]["targetLimit"] <= 100


def test_the_trainers_own_exposition_fits_the_limits():
    """The legitimate scrape passes (rank 0's health endpoint, every metric set)."""
    health = HttpHealth(port=0, job_name="j" * 63, restarts=3, checkpoint_interval_steps=100, host="127.0.0.1")
    try:
        health.update(step=10, loss=1.0, tokens_per_second=1.0, step_seconds=1.0, mfu=0.4, goodput=0.9, checkpoint_step=10)
        exposition = health.render()
    finally:
        health.close()
    for monitor in team_monitors():
        accepted, ingested = scrape(exposition, monitor["spec"])
        assert accepted and ingested >= 10, monitor["metadata"]["name"]
