"""The chart mirror (``chartMirror``): every release's chart from a configured OCI registry or Helm
repository at the pinned version, its archive verified against the SHA-256 of catalog/versions.py
before anything is registered; the charts' upstream repositories when it is not set.

The mirrors here are real HTTP servers on loopback (tools/chart_mirror.py): a Helm chart repository
(index.yaml + archives) and an OCI registry (distribution API v2 with a token or Basic challenge).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import runpy
import stat
import tarfile
from pathlib import Path

import pulumi
import pytest

from catalog.versions import HELM_CHARTS, KUEUE, HelmChart
from infra import chart_mirror
from infra.capabilities import charts_used
from infra.chart_mirror import ChartMirrorError
from infra.config import PROJECT, ConfigError, load_platform_config
from infra.plan.mock_engine import RecordingMonitor, run_recorded
from tests.conftest import _plan, problem_per_path, stack_config, to_values
from tools.chart_mirror import Auth, serve

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"
RELEASE = "kubernetes:helm.sh/v3:Release"
BY_ARCHIVE = {chart.archive: chart for chart in HELM_CHARTS}


def mirrored(raw: dict, url: str) -> dict:
    """``raw`` with a chart mirror and without the charts no archive is pinned for (Argo CD and
    Argo Workflows), which a mirror cannot serve yet."""
    raw = dict(raw, chartMirror={"url": url})
    raw.pop("gitops", None)
    return raw


def released_charts(recording) -> dict[str, dict]:
    return {r.name: r.inputs for r in recording.by_type(RELEASE)}


def chart_of(inputs: dict) -> HelmChart:
    """The pin a recorded release installs, by its chart input (upstream reference or archive path)."""
    for chart in HELM_CHARTS:
        if inputs["chart"] in (chart.reference, f"../build/charts/{chart.archive}"):
            return chart
    raise AssertionError(f"release chart {inputs['chart']!r} is no pin of catalog/versions.py")


# -- the setting -----------------------------------------------------------------------------------
@pytest.mark.parametrize("url, reason", [
    ("ftp://charts.example.com", "is not an oci:// registry or an https:// Helm repository"),
    ("https://user:token@charts.example.com", "carries credentials"),
    ("http://charts.internal.example.com", "plain http:// to a host other than this machine"),
    ("https://charts.example.com/?ref=main", "has a query or fragment"),
    ("oci://", "names no host"),
    ("oci://Registry.example.com/Charts", "upper-case letters in its repository path"),
    ("https://charts_example.com", "not RFC 1123 labels"),
    ("https://charts.example.com/a/../b", "'.' or '..' path segment"),
])
def test_a_mirror_url_nothing_can_read_is_refused_with_its_fix(url, reason):
    raw = stack_config("dev")
    raw["chartMirror"] = {"url": url}
    problem = problem_per_path(raw)["chartMirror.url"]
    assert reason in problem.message and "oci://123456789012.dkr.ecr" in problem.fix


def test_mirror_urls_of_ecr_a_helm_repository_and_a_local_test_mirror_are_accepted():
    raw = stack_config("prod")
    for url, kept in [("oci://123456789012.dkr.ecr.us-west-2.amazonaws.com/charts/", "oci://123456789012.dkr.ecr.us-west-2.amazonaws.com/charts"),
                      ("https://artifacts.example.com/helm/platform", "https://artifacts.example.com/helm/platform"),
                      ("http://127.0.0.1:8879", "http://127.0.0.1:8879")]:
        raw["chartMirror"] = {"url": url}
        assert load_platform_config(raw).chart_mirror.url == kept


def test_an_unknown_key_in_the_section_is_refused():
    raw = stack_config("dev")
    raw["chartMirror"] = {"url": "oci://r.example.com/charts", "password": "x"}
    assert "chartMirror.password" in problem_per_path(raw)


# -- upstream (default) ---------------------------------------------------------------------------
def test_without_a_mirror_every_release_names_its_pinned_upstream_chart(plan):
    releases = released_charts(plan.recording)
    assert releases
    for name, inputs in releases.items():
        chart = chart_of(inputs)
        assert inputs["version"] == chart.version, name
        if chart.oci:
            assert inputs["chart"] == f"{chart.repo}/{chart.name}" and "repositoryOpts" not in inputs, name
        else:
            assert inputs["chart"] == chart.name and inputs["repositoryOpts"] == {"repo": chart.repo}, name


# -- which charts a stack installs -------------------------------------------------------------------
VARIANTS = {
    "as is": lambda raw: None,
    "gpu operator, no efa": lambda raw: (raw["gpuEnablement"].update(mode="gpu-operator"),
                                         [p.pop("efa", None) for p in raw.get("gpuPools", [])]),
    "no dcgm, no crds": lambda raw: raw["gpuEnablement"].update(dcgmExporter=False, serviceMonitor=False,
                                                                 prometheusOperatorCrds=False),
    # Team alert e-mails need monitoring's Alertmanager (a config rule), so they go with it.
    "no monitoring, no alarm": lambda raw: (raw.pop("monitoring", None), raw.pop("gpuIdleAlarm", None),
                                            [t.pop("alertEmails", None) for t in raw.get("scheduling", {}).get("teams", [])]),
    "no container logs": lambda raw: raw.get("monitoring", {}).update(containerLogs=False),
    "no gitops": lambda raw: raw.pop("gitops", None),
    "no workflows, trainer v2": lambda raw: (raw.get("gitops", {}).update(argoWorkflows=False),
                                             raw.setdefault("training", {}).update(trainerV2=True)),
}


@pytest.mark.parametrize("stack", ["dev", "prod"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_charts_verified_before_the_program_are_exactly_the_charts_it_installs(stack, variant, plan_config):
    """The mirror check runs before any resource is registered, from the config alone: the list
    it fetches must be what the components then install, no more and no less."""
    raw = stack_config(stack)
    raw.setdefault("gpuEnablement", {})
    VARIANTS[variant](raw)
    recording = (_plan(stack) if variant == "as is" else plan_config(stack, raw)).recording
    installed = sorted(chart_of(inputs).name for inputs in released_charts(recording).values())
    assert sorted(c.name for c in charts_used(load_platform_config(raw))) == installed


# -- mirror mode in the plan ------------------------------------------------------------------------
@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_with_a_mirror_each_release_installs_the_verified_archive_by_a_path_every_machine_writes_alike(stack, plan_config):
    recording = plan_config(stack, mirrored(stack_config(stack), "oci://123456789012.dkr.ecr.us-west-2.amazonaws.com/charts")).recording
    releases = released_charts(recording)
    assert releases
    for name, inputs in releases.items():
        chart = chart_of(inputs)
        # Relative to the program's folder (Pulumi.yaml main: infra/), where the provider reads it.
        assert inputs["chart"] == f"../build/charts/{chart.archive}", name
        assert inputs["version"] == chart.version and "repositoryOpts" not in inputs, name


def test_a_mirror_cannot_serve_a_chart_whose_archive_is_not_pinned_and_the_plan_says_which():
    raw = stack_config("dev")
    raw["chartMirror"] = {"url": "oci://123456789012.dkr.ecr.us-west-2.amazonaws.com/charts"}
    config = load_platform_config(raw)
    with pytest.raises(ConfigError) as info:
        chart_mirror.check_pins(config)
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 2
    assert "argo-cd 10.3.3" in lines[0] and "argo-workflows 1.1.1" in lines[1]
    assert all(line.lstrip(" -").startswith("chartMirror.url:") and "catalog/versions.py" in line for line in lines)


def test_the_offline_plan_refuses_unpinned_charts_with_exit_2(tmp_path, capsys):
    from infra.plan import main as plan_main

    root = Path(__file__).resolve().parents[2]
    project = tmp_path / "project"
    (project / "infra").mkdir(parents=True)
    (project / "Pulumi.yaml").write_text((root / "Pulumi.yaml").read_text())
    (project / "Pulumi.dev.yaml").write_text((root / "Pulumi.dev.yaml").read_text() + (
        "  ml-training-platform:chartMirror:\n    url: oci://123456789012.dkr.ecr.us-west-2.amazonaws.com/charts\n"))
    assert plan_main(["--stack", "dev", "--project-dir", str(project)]) == 2
    err = capsys.readouterr().err
    assert "argo-cd 10.3.3" in err and "argo-workflows 1.1.1" in err and "Traceback" not in err


# -- fetching and verifying --------------------------------------------------------------------------
def fake_archive(chart: HelmChart) -> bytes:
    """A well-formed chart archive of the pinned name and version whose bytes are not the pinned ones."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        body = f"apiVersion: v2\nname: {chart.name}\nversion: {chart.version}\n".encode()
        info = tarfile.TarInfo(f"{chart.name}/Chart.yaml")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def mirror_dir(tmp_path: Path, archives: Path, *, without: str = "", tampered: str = "") -> Path:
    directory = tmp_path / "mirror"
    directory.mkdir()
    for path in archives.glob("*.tgz"):
        if path.name == without:
            continue
        data = fake_archive(BY_ARCHIVE[path.name]) if path.name == tampered else path.read_bytes()
        (directory / path.name).write_bytes(data)
    return directory


def registry_login(tmp_path: Path, monkeypatch, host: str, auth: Auth) -> None:
    """What `helm registry login` leaves: Helm's registry config with the host's credentials."""
    config = tmp_path / "registry.json"
    config.write_text(json.dumps({"auths": {host: {"auth": base64.b64encode(f"{auth.user}:{auth.password}".encode()).decode()}}}))
    monkeypatch.setenv("HELM_REGISTRY_CONFIG", str(config))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker"))


@pytest.mark.parametrize("kind", ["helm repository", "oci", "oci with a token challenge", "oci with basic auth (ecr)"])
def test_prepare_downloads_and_verifies_every_chart_the_stack_installs(kind, chart_archives, tmp_path, monkeypatch):
    oci = kind.startswith("oci")
    auth = Auth("bearer") if "token" in kind else Auth("basic") if "basic" in kind else None
    with serve(chart_archives, oci=oci, auth=auth) as mirror:
        if auth is not None:
            registry_login(tmp_path, monkeypatch, mirror.url.split("/")[2], auth)
        config = load_platform_config(mirrored(stack_config("prod"), mirror.url))
        written = chart_mirror.prepare(config, root=tmp_path)
    assert sorted(p.name for p in written) == sorted(c.archive for c in charts_used(config))
    for path in written:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == BY_ARCHIVE[path.name].sha256
        assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), f"{path.name} is writable"
    if oci:
        assert any("/manifests/" in r for r in mirror.requests) and any("/blobs/sha256:" in r for r in mirror.requests)


def test_credentials_come_from_a_docker_credential_helper_as_ecr_login_provides(chart_archives, tmp_path, monkeypatch):
    """amazon-ecr-credential-helper is configured as ``credHelpers: {<registry>: ecr-login}``; the
    client runs ``docker-credential-ecr-login get`` with the registry host on stdin."""
    auth = Auth("basic")
    helper_dir = tmp_path / "bin"
    helper_dir.mkdir()
    helper = helper_dir / "docker-credential-ecr-login"
    helper.write_text(f"#!/bin/sh\nread host\necho '{{\"ServerURL\": \"'$host'\", \"Username\": \"{auth.user}\", \"Secret\": \"{auth.password}\"}}'\n")
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helper_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HELM_REGISTRY_CONFIG", str(tmp_path / "none.json"))
    with serve(chart_archives, oci=True, auth=auth) as mirror:
        host = mirror.url.split("/")[2]
        (tmp_path / "docker").mkdir()
        (tmp_path / "docker" / "config.json").write_text(json.dumps({"credHelpers": {host: "ecr-login"}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
        data = chart_mirror.fetch(mirror.url, KUEUE)
    assert hashlib.sha256(data).hexdigest() == KUEUE.sha256


def test_a_registry_that_wants_credentials_nobody_stored_says_how_to_log_in(chart_archives, tmp_path, monkeypatch):
    monkeypatch.setenv("HELM_REGISTRY_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    with serve(chart_archives, oci=True, auth=Auth("basic")) as mirror, pytest.raises(ChartMirrorError) as info:
        chart_mirror.fetch(mirror.url, KUEUE)
    assert "helm registry login" in str(info.value) and "kueue 0.19.2" in str(info.value)


def test_an_unreachable_mirror_is_one_line_not_one_per_chart(tmp_path):
    with serve(tmp_path) as mirror:
        url = mirror.url
    config = load_platform_config(mirrored(stack_config("dev"), url))  # the server is gone: connection refused
    with pytest.raises(ChartMirrorError) as info:
        chart_mirror.prepare(config, root=tmp_path)
    assert len(str(info.value).splitlines()) == 1 and "cannot be reached" in str(info.value) and url in str(info.value)


# -- bad input through the entry point `pulumi preview` runs ---------------------------------------------
@pytest.fixture
def registrations(monkeypatch) -> list[str]:
    """Every resource the program registers with the engine (the stack itself aside)."""
    seen: list[str] = []
    original = RecordingMonitor.RegisterResource

    def register(self, request):
        if request.type != "pulumi:pulumi:Stack":
            seen.append(f"{request.type}::{request.name}")
        return original(self, request)

    monkeypatch.setattr(RecordingMonitor, "RegisterResource", register)
    return seen


def run_entry_point(raw: dict, monkeypatch, root: Path) -> None:
    import infra.vendor

    monkeypatch.setattr(infra.vendor, "prepare", lambda: None)  # offline: the Training Operator tree
    monkeypatch.setattr(chart_mirror, "ROOT", root)
    run_recorded(lambda: runpy.run_path(str(MAIN), run_name="__main__"), project=PROJECT, stack="dev",
                 config=to_values(raw))


@pytest.mark.parametrize("oci", [False, True], ids=["helm repository", "oci"])
def test_a_mirror_missing_a_chart_stops_the_preview_with_one_line_before_anything_registers(
        oci, chart_archives, tmp_path, monkeypatch, registrations):
    directory = mirror_dir(tmp_path, chart_archives, without=KUEUE.archive)
    with serve(directory, oci=oci) as mirror, pytest.raises(pulumi.RunError) as info:
        run_entry_point(mirrored(stack_config("dev"), mirror.url), monkeypatch, tmp_path)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert f"chart mirror {mirror.url} has no kueue 0.19.2" in message and "FIX:" in message
    assert registrations == []
    assert not (tmp_path / "build" / "charts").exists()  # nothing half-written either


@pytest.mark.parametrize("oci", [False, True], ids=["helm repository", "oci"])
def test_a_mirror_serving_other_bytes_stops_the_preview_with_one_line_naming_both_digests(
        oci, chart_archives, tmp_path, monkeypatch, registrations):
    directory = mirror_dir(tmp_path, chart_archives, tampered=KUEUE.archive)
    served = hashlib.sha256((directory / KUEUE.archive).read_bytes()).hexdigest()
    with serve(directory, oci=oci) as mirror, pytest.raises(pulumi.RunError) as info:
        run_entry_point(mirrored(stack_config("dev"), mirror.url), monkeypatch, tmp_path)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert (f"chart mirror {mirror.url} serves kueue 0.19.2 with SHA-256 {served}, pinned {KUEUE.sha256}"
            in message), message
    assert registrations == []
    assert not (tmp_path / "build" / "charts").exists()


def test_the_check_fails_closed_without_the_real_archives_too(tmp_path):
    """Every chart of a well-formed archive whose bytes differ is refused, one line each."""
    directory = tmp_path / "fakes"
    directory.mkdir()
    config = load_platform_config(mirrored(stack_config("dev"), "http://127.0.0.1:1"))
    for chart in charts_used(config):
        (directory / chart.archive).write_bytes(fake_archive(chart))
    with serve(directory) as mirror:
        config = load_platform_config(mirrored(stack_config("dev"), mirror.url))
        with pytest.raises(ChartMirrorError) as info:
            chart_mirror.prepare(config, root=tmp_path)
    lines = str(info.value).splitlines()
    assert len(lines) == len(charts_used(config)) and all("refusing it" in line for line in lines)
    assert not (tmp_path / "build").exists()


def test_a_good_mirror_lets_the_entry_point_build_the_stack_from_the_verified_files(
        chart_archives, tmp_path, monkeypatch, registrations):
    with serve(chart_archives) as mirror:
        run_entry_point(mirrored(stack_config("dev"), mirror.url), monkeypatch, tmp_path)
    assert any(r.startswith(RELEASE) for r in registrations)
    assert sorted(p.name for p in (tmp_path / "build" / "charts").iterdir()) == sorted(
        c.archive for c in charts_used(load_platform_config(mirrored(stack_config("dev"), mirror.url))))


# -- the loopback mirror is one real Helm reads ------------------------------------------------------------
@pytest.mark.parametrize("oci", [False, True], ids=["helm repository", "oci"])
def test_real_helm_pulls_the_pinned_bytes_from_the_loopback_mirror(oci, chart_archives, tmp_path, monkeypatch):
    """What the tests and the engine harness serve is a mirror Helm itself accepts (`helm pull`
    from the repository, or from the registry with --plain-http), not one only our client reads."""
    import subprocess

    from tests.support.charts import helm_binary

    helm = helm_binary()
    if helm is None:
        pytest.skip("no helm at .cache/engine-tools/bin/helm: run `make engine-tools` (or set ML_PLATFORM_HELM)")
    for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name))
    out = tmp_path / "pulled"
    out.mkdir()
    with serve(chart_archives, oci=oci) as mirror:
        command = ([str(helm), "pull", f"{mirror.url}/{KUEUE.name}", "--plain-http"] if oci
                   else [str(helm), "pull", KUEUE.name, "--repo", mirror.url])
        done = subprocess.run([*command, "--version", KUEUE.version, "-d", str(out)], capture_output=True, text=True,
                              timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256((out / KUEUE.archive).read_bytes()).hexdigest() == KUEUE.sha256


def test_verify_names_an_archive_whose_bytes_are_not_the_pin(tmp_path):
    from tools.chart_mirror import main as mirror_main

    (tmp_path / KUEUE.archive).write_bytes(fake_archive(KUEUE))
    assert mirror_main(["verify", str(tmp_path)]) == 1
