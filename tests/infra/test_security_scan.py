"""What `make security` hands checkov: every Kubernetes object of the plans, pod templates as Pods."""
from __future__ import annotations

from pathlib import Path

import yaml

from infra.plan.security_scan import (DOCKERFILES, ROOT, Manifest, as_pod, kubernetes_objects, pod_templates,
                                 skips_without_reason, write_manifests)

PYTORCH_JOB = {
    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
    "metadata": {"name": "gpt2", "namespace": "team-research"},
    "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": {
            "metadata": {"annotations": {"checkov.io/skip1": "CKV_K8S_40=the NVIDIA image runs as uid 1000 set in the Dockerfile"}},
            "spec": {"containers": [{"name": "pytorch", "image": "trainer@sha256:abc"}]}}},
        "Worker": {"replicas": 3, "template": {"spec": {"containers": [{"name": "pytorch", "image": "trainer@sha256:abc"}]}}},
    }},
}


def test_pod_templates_inside_custom_resources_become_pods():
    found = dict(pod_templates(PYTORCH_JOB))
    assert set(found) == {"spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"}
    pod = as_pod(PYTORCH_JOB, "spec.pytorchReplicaSpecs.Master.template", found["spec.pytorchReplicaSpecs.Master.template"])
    assert pod["kind"] == "Pod" and pod["apiVersion"] == "v1"
    assert pod["metadata"]["namespace"] == "team-research"
    assert pod["metadata"]["name"].startswith("gpt2-spec-pytorchreplicaspecs-master-template")
    # The template's skip annotations travel with it, so a justified skip still applies.
    assert pod["metadata"]["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_40=")
    assert pod["spec"]["containers"][0]["name"] == "pytorch"


def test_every_kubernetes_object_of_the_plan_is_rendered(plan, tmp_path):
    recording = plan.recording
    objects = dict(kubernetes_objects(recording))
    from infra.plan.security_scan import NOT_RENDERED

    expected = {r.name for r in recording.resources
                if r.type.startswith("kubernetes:") and not r.is_provider and r.type not in NOT_RENDERED}
    assert set(objects) == expected and expected
    assert all(doc["kind"] and doc["metadata"]["name"] for doc in objects.values())
    write_manifests([Manifest(plan.stack, n, d) for n, d in objects.items()], tmp_path)
    written = list(tmp_path.rglob("*.yaml"))
    assert len(written) == len(objects)
    assert all(yaml.safe_load(p.read_text())["kind"] for p in written)


def test_a_skip_without_a_reason_fails_the_scan(tmp_path):
    annotated = lambda value: Manifest("dev", "x", {"kind": "Pod", "metadata": {"annotations": {"checkov.io/skip1": value}}})
    assert skips_without_reason([annotated("CKV_K8S_20=needs NET_ADMIN for EFA")], []) == []
    assert skips_without_reason([annotated("CKV_K8S_20")], [])
    assert skips_without_reason([annotated("CKV_K8S_20=")], [])
    # checkov 3 splits the annotation on "=" into exactly (id, comment): a second "=" crashes it.
    assert skips_without_reason([annotated("CKV_K8S_22=writes under HOME=/tmp")], [])
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM scratch\n# checkov:skip=CKV_DOCKER_2\n")
    assert skips_without_reason([], [dockerfile])
    dockerfile.write_text("FROM scratch\n# checkov:skip=CKV_DOCKER_2: batch job, no server to probe\n")
    assert skips_without_reason([], [dockerfile]) == []


def test_the_repository_dockerfiles_justify_every_skip():
    dockerfiles = [ROOT / d for d in DOCKERFILES]
    assert all(p.is_file() for p in dockerfiles)
    assert skips_without_reason([], dockerfiles) == []


def test_ci_runs_the_scan_through_the_readme_test_command():
    makefile = (ROOT / "Makefile").read_text()
    assert "test: security pytest" in makefile
    assert "--skip-download" in (ROOT / "infra" / "plan" / "security_scan.py").read_text()
    pin = (ROOT / "requirements-checkov.txt").read_text()
    assert "checkov==" in pin
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "checkov" not in (ROOT / "pyproject.toml").read_text()  # never in .venv


def test_the_gitops_trees_jobs_are_scanned_with_the_operators_init_container():
    """Argo CD applies workloads/rendered/<stack> from Git: its PyTorchJobs run in the cluster as
    much as anything Pulumi applies, so the scan reads them too. Training Operator v1.9.4
    (pkg/controller.v1/pytorch/initcontainer.go) adds `init-pytorch` to every Worker of a job
    with a Master: the scanned worker pod carries it, with the image the platform pins."""
    from catalog.versions import TRAINING_OPERATOR_INIT_CONTAINER_IMAGE
    from infra.plan.security_scan import gitops_objects

    objects = dict(gitops_objects("prod", ROOT))
    jobs = {n: d for n, d in objects.items() if d["kind"] == "PyTorchJob"}
    assert jobs, "the prod GitOps tree declares a PyTorchJob"
    name, job = next(iter(jobs.items()))
    assert "Worker" in job["spec"]["pytorchReplicaSpecs"]
    from infra.plan.security_scan import with_operator_init_containers
    path = "spec.pytorchReplicaSpecs.Worker.template"
    template = dict(pod_templates(job))[path]
    worker = as_pod(job, path, with_operator_init_containers(job, path, template))
    (init,) = [c for c in worker["spec"]["initContainers"] if c["name"] == "init-pytorch"]
    assert init["image"] == TRAINING_OPERATOR_INIT_CONTAINER_IMAGE and "@sha256:" in init["image"]
