"""`python -m workloads render`: the committed GitOps tree is current, deterministic and valid."""
from __future__ import annotations

import copy
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs import render
from infra.plan import ROOT
from workloads import gitops
from tests.support.validation import validate_custom_resource, validate_pod_template
from tests.support.pipelines import embedded_job

STACKS = ("dev", "prod")


def _tree(stack):
    rendered, files = render.render_tree(stack, ROOT)
    return rendered, {path: yaml.safe_load(text) for path, text in files.items()}


@pytest.mark.parametrize("stack", STACKS)
def test_committed_tree_is_current(stack):
    stale = render.write_tree(stack, ROOT, check=True)
    assert stale == [], (f"workloads/rendered/{stack} is stale ({stale}); "
                         f"run `python -m workloads render --stack {stack}` and commit the result")


@pytest.mark.parametrize("stack", STACKS)
def test_rendered_objects_are_valid_managed_and_in_their_namespace(stack, schemas):
    rendered, docs = _tree(stack)
    config = render.load_config(stack)
    from infra.gitops import gitops_spec

    spec = gitops_spec(config, stack)
    namespaces = set()
    assert docs, f"stack {stack} renders nothing"
    for path, doc in docs.items():
        assert validate_custom_resource(doc, schemas) == [], path
        if path.startswith("apps/"):
            assert doc["kind"] == "Application"
            assert doc["spec"]["project"] == spec.team_project_name(doc["spec"]["destination"]["namespace"])
            source = doc["spec"]["source"]["path"]
            assert source.startswith(f"{rendered}/namespaces/"), path
            assert any(p.startswith(source.removeprefix(rendered + "/") + "/") for p in docs), f"{path}: empty source"
            continue
        _, namespace, _ = path.split("/")
        namespaces.add(namespace)
        assert doc["metadata"]["namespace"] == namespace
        assert namespace in spec.namespaces
        assert gitops.is_managed_kind(doc)
        for pod_path, pod in _pod_templates(doc):
            assert validate_pod_template(pod) == [], f"{path} {pod_path}"
    assert {f"apps/application-{ns}.yaml" for ns in namespaces} == {p for p in docs if p.startswith("apps/")}


def _pod_templates(doc):
    from workloads import pipeline

    if doc["kind"] == "PyTorchJob":
        return [(replica, spec["template"]) for replica, spec in doc["spec"]["pytorchReplicaSpecs"].items()]
    if doc["kind"] == "WorkflowTemplate":
        job = embedded_job(doc)
        return pipeline.pod_templates(doc) + [(f"train/{r}", s["template"]) for r, s in job["spec"]["pytorchReplicaSpecs"].items()]
    return []


def test_dev_pipeline_runs_the_declared_job_as_its_train_step(schemas):
    _, docs = _tree("dev")
    template = docs["namespaces/team-research/workflowtemplate-shakespeare-gpt.yaml"]
    from workloads import pipeline

    job = embedded_job(template)
    assert validate_custom_resource(job, schemas) == []
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"]["mlplatform.io/pool"] == "l4"
    args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert args[-5:] == ["data.dir=/fsx/checkpoints/team-research/pipelines/{{workflow.name}}/tokens",
                         "checkpoint.dir=/fsx/checkpoints/team-research/pipelines/{{workflow.name}}/checkpoints",
                         "tracking.job_id={{workflow.name}}", "tracking.run_name={{workflow.name}}",
                         "export.at_end=false"]


def test_cli_twice_gives_identical_bytes(tmp_path):
    root = tmp_path / "repo"
    for stack in STACKS:
        (root).mkdir(exist_ok=True)
        shutil.copy(ROOT / f"Pulumi.{stack}.yaml", root / f"Pulumi.{stack}.yaml")
        shutil.copytree(ROOT / render.DECLARED_ROOT / stack, root / render.DECLARED_ROOT / stack)
    digests = []
    for _ in range(2):
        for stack in STACKS:
            render.write_tree(stack, root, render.default_job_renderer(stack, root))
        files = sorted(p for p in (root / "workloads/rendered").rglob("*") if p.is_file())
        digests.append({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    assert digests[0] == digests[1]
    committed = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in (ROOT / "workloads/rendered").rglob("*") if p.is_file()}
    assert digests[0] == committed


# -- behaviour on a scratch repository (a stand-in job renderer: the real one is tested above) ----
def _scratch(tmp_path, stack="dev"):
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(ROOT / f"Pulumi.{stack}.yaml", root / f"Pulumi.{stack}.yaml")
    return root


def _job(namespace="team-research", name="tiny"):
    from tests.workloads.test_gitops_manifests import TRAIN_JOB

    job = copy.deepcopy(TRAIN_JOB)
    job["metadata"].update({"name": name, "namespace": namespace})
    return job


def _declare(root, relative, doc):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_deleted_declarations_delete_their_files(tmp_path):
    root = _scratch(tmp_path)
    _declare(root, "workloads/declared/dev/jobs/a.yaml", {"ns": "team-research", "name": "a"})
    _declare(root, "workloads/declared/dev/jobs/b.yaml", {"ns": "team-platform", "name": "b"})
    renderer = lambda path: _job(**{"namespace": yaml.safe_load(path.read_text())["ns"],
                                    "name": yaml.safe_load(path.read_text())["name"]})
    render.write_tree("dev", root, renderer)
    out = root / "workloads/rendered/dev"
    assert (out / "namespaces/team-platform/pytorchjob-b.yaml").exists()
    (root / "workloads/declared/dev/jobs/b.yaml").unlink()
    assert render.write_tree("dev", root, renderer, check=True) == [
        "apps/application-team-platform.yaml", "namespaces/team-platform/pytorchjob-b.yaml"]
    render.write_tree("dev", root, renderer)
    assert not (out / "namespaces/team-platform").exists()
    assert not (out / "apps/application-team-platform.yaml").exists()
    assert (out / "namespaces/team-research/pytorchjob-a.yaml").exists()


def test_every_bad_declaration_is_reported_at_once(tmp_path):
    root = _scratch(tmp_path)
    _declare(root, "workloads/declared/dev/pipelines/p1.yaml", {"name": "Bad_Name", "jobSpec": "x.yaml",
                                                                "dataset": "/data/raw", "modelName": "m", "extra": 1})
    _declare(root, "workloads/declared/dev/pipelines/p2.yaml", {"name": "ok", "jobSpec": "job.yaml",
                                                                "dataset": "/fsx/raw", "modelName": "m"})
    _declare(root, "job.yaml", {})

    def renderer(path):
        raise ValueError(f"{path.name}: team 'nobody' is not in scheduling.teams")

    with pytest.raises(render.RenderError) as info:
        render.render_tree("dev", root, renderer)
    message = str(info.value)
    for expected in ("name: not a DNS label", "dataset: must be on the FSx mount", "extra: unknown key",
                     "jobSpec job.yaml: job.yaml: team 'nobody'"):
        assert expected in message
    assert not (root / "workloads/rendered").exists(), "nothing half-done"


def test_objects_outside_the_team_namespaces_are_refused(tmp_path):
    root = _scratch(tmp_path)
    _declare(root, "workloads/declared/dev/jobs/a.yaml", {})
    with pytest.raises(render.RenderError, match="team-elsewhere is not a team namespace"):
        render.render_tree("dev", root, lambda path: _job(namespace="team-elsewhere"))


def test_cli_reports_a_stale_tree_with_the_fix(tmp_path):
    done = subprocess.run([sys.executable, "-m", "workloads", "render", "--stack", "nosuch", "--check"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "no stack file Pulumi.nosuch.yaml" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_no_object_is_applied_by_both_pulumi_and_argo_cd(stack):
    from tests.conftest import _plan

    plan = _plan(stack)
    pulumi_objects = {(r.inputs.get("apiVersion", "").rpartition("/")[0], r.inputs.get("kind"),
                       r.inputs.get("metadata", {}).get("namespace"), r.inputs.get("metadata", {}).get("name"))
                      for r in plan.recording.resources if r.type.startswith("kubernetes:") and "kind" in r.inputs}
    # Pulumi never creates a kind Argo CD's workloads project manages ...
    assert not [o for o in pulumi_objects if (o[0], o[1]) in gitops.MANAGED_KINDS]
    # ... and nothing Argo CD applies is also in Pulumi's graph (apps/ are Applications in argocd).
    _, docs = _tree(stack)
    for path, doc in docs.items():
        key = (doc["apiVersion"].rpartition("/")[0], doc["kind"], doc["metadata"]["namespace"], doc["metadata"]["name"])
        assert key not in pulumi_objects, path


def test_render_refuses_what_preflight_refuses_and_writes_nothing(tmp_path):
    """`submit` runs preflight before it renders (jobs/__main__.py ``_preflighted``); the Git
    path does the same, so a job preflight refuses never reaches the tree Argo CD applies. Three
    jobs that resolve (trainingjob.render accepts them) but preflight refuses: more GPUs than the
    pool can ever launch, a trainer override the trainer's own parser rejects, and a checkpoint
    budget shorter than the save takes at the shared file system's throughput (dev: EFS per client;
    a spot interruption kills the save)."""
    root = _scratch(tmp_path)
    job = yaml.safe_load((ROOT / "workloads/declared/dev/pipelines/jobs/shakespeare-gpt.yaml").read_text())
    too_big = {**job, "name": "too-big", "nodes": 5}
    bad_override = {**job, "name": "bad-override", "trainer": {**job["trainer"], "overrides": ["model.n_embd=13"]}}
    short_budget = {**job, "name": "short-budget", "timeBudget": {"maxStepSeconds": 5, "checkpointSeconds": 1}}
    for doc in (too_big, bad_override, short_budget, {**job, "name": "fits"}):
        _declare(root, f"workloads/declared/dev/jobs/{doc['name']}.yaml", doc)
    # The renderer alone accepts them: the refusal below is preflight's.
    from workloads import jobspec, trainingjob

    facts = render._plan_facts("dev")
    for name in ("too-big", "bad-override", "short-budget"):
        trainingjob.render(jobspec.load_job_spec(root / f"workloads/declared/dev/jobs/{name}.yaml"), facts)
    with pytest.raises(render.RenderError) as info:
        render.write_tree("dev", root)
    message = str(info.value)
    assert "3 problems" in message
    assert "jobs/too-big.yaml: preflight refused it" in message and "nodes: 5 x 1 = 5 GPUs" in message
    assert "jobs/bad-override.yaml: preflight refused it" in message and "trainer[model.n_embd]: is not a trainer config key" in message
    assert "jobs/short-budget.yaml: preflight refused it" in message and "timeBudget.checkpointSeconds" in message
    assert "fits.yaml" not in message
    assert not (root / "workloads/rendered").exists(), "nothing half-done"
