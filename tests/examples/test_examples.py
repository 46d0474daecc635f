"""Every example in examples/ runs: the consumer Pulumi program under the recording engine,
each job spec through the real renderer against the platform facts of the stack it names."""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import yaml

from tests.support.pipelines import embedded_job

ROOT = Path(__file__).resolve().parents[2]
CONSUMER = ROOT / "examples" / "consumer"
JOBS = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))

WORKLOAD_ACCOUNT, LOGGING_ACCOUNT = "123456789012", "210987654321"
CONSUMER_CONFIG = {
    "research-platform:workloadAccountId": WORKLOAD_ACCOUNT,
    "research-platform:loggingAccountId": LOGGING_ACCOUNT,
    "research-platform:workloadRoleArn": f"arn:aws:iam::{WORKLOAD_ACCOUNT}:role/research-deploy",
    "research-platform:loggingRoleArn": f"arn:aws:iam::{LOGGING_ACCOUNT}:role/research-deploy",
    "aws:region": "eu-west-1",
}


# -- the consumer program -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def consumer():
    from infra.plan.mock_engine import run_recorded

    project = yaml.safe_load((CONSUMER / "Pulumi.yaml").read_text())["name"]
    return run_recorded(lambda: runpy.run_path(str(CONSUMER / "__main__.py"), run_name="__main__"),
                        project=project, stack="research-dev", config=CONSUMER_CONFIG)


def _provider_name(urn):
    return urn.rsplit("::", 1)[-1] if urn else None


def _top(recording, resource):
    by_urn = {r.urn: r for r in recording.resources}
    while resource.parent in by_urn and by_urn[resource.parent].type != "pulumi:pulumi:Stack":
        resource = by_urn[resource.parent]
    return resource


def test_consumer_every_aws_resource_uses_the_consumers_provider_for_its_account(consumer):
    expected = {"research-logs": "research-logging", "research-log-key": "research-workload",
                "research-net": "research-workload", "research-cluster": "research-workload"}
    aws = [r for r in consumer.resources if r.type.startswith("aws:")]
    assert len(aws) > 40
    wrong = [(r.name, _provider_name(r.provider)) for r in aws
             if _provider_name(r.provider) != expected[_top(consumer, r).name]]
    assert not wrong, f"resources on another provider than their component's: {wrong[:5]}"
    # pulumi-eks, a remote component, gets the provider map too (its children are created by it).
    eks = consumer.one("eks:index:Cluster")
    assert _provider_name(eks.providers["aws"]) == "research-workload"


def test_consumer_providers_assume_its_roles_and_are_pinned_to_its_accounts(consumer):
    providers = {r.name: r.inputs for r in consumer.by_type("pulumi:providers:aws")}
    assert set(providers) == {"research-workload", "research-logging"}
    for name, account in (("research-workload", WORKLOAD_ACCOUNT), ("research-logging", LOGGING_ACCOUNT)):
        inputs = providers[name]
        assert inputs["allowedAccountIds"] == [account]
        # camelCase: the provider reads roleArn; a dict with role_arn would be ignored silently.
        assert inputs["assumeRoles"][0]["roleArn"] == f"arn:aws:iam::{account}:role/research-deploy"


def test_consumer_names_are_its_own(consumer):
    names = [r.name for r in consumer.resources if r.type != "pulumi:pulumi:Stack"]
    assert names and all(n.startswith("research-") for n in names), [n for n in names if not n.startswith("research-")]
    assert not any("mlp-" in n for n in names)
    assert consumer.one("aws:eks/cluster:Cluster").inputs["name"] == "research-eks"
    assert consumer.stack_outputs["clusterName"] == "research-eks"


def test_consumer_flow_logs_cross_into_its_logging_account_after_the_policy_admits_them(consumer):
    flow_log = consumer.one("aws:ec2/flowLog:FlowLog")
    policy = consumer.one("aws:s3/bucketPolicy:BucketPolicy", "research-logs-logs-policy")
    assert policy.urn in flow_log.dependencies
    assert f"aws-account-id={WORKLOAD_ACCOUNT}" in policy.inputs["policy"]
    bucket_arn = flow_log.inputs["logDestination"].split("/", 1)[0]  # arn:aws:s3:::<bucket>/<prefix>
    archive_bucket = consumer.resolve(bucket_arn)
    assert archive_bucket.type == "aws:s3/bucket:Bucket"
    assert _provider_name(archive_bucket.provider) == "research-logging"


def test_consumer_project_disables_the_default_providers_it_replaces():
    project = yaml.safe_load((CONSUMER / "Pulumi.yaml").read_text())
    disabled = project["config"]["pulumi:disable-default-providers"]["value"]
    assert {"aws", "kubernetes"} <= set(disabled) and "eks" not in disabled and "*" not in disabled


def test_consumer_deploy_role_gets_a_visible_access_entry(consumer):
    entries = [r.inputs["principalArn"] for r in consumer.by_type("aws:eks/accessEntry:AccessEntry")]
    assert f"arn:aws:iam::{WORKLOAD_ACCOUNT}:role/research-deploy" in entries


# -- job specs --------------------------------------------------------------------------------------
def _stack_of(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# stack: "), f"{path.name}: first line must be '# stack: <name>'"
    return first.split(":", 1)[1].strip()


@pytest.fixture(scope="module")
def stack_facts(dev_plan, prod_plan):
    from jobs.facts import facts_from_plan

    return {"dev": facts_from_plan(dev_plan), "prod": facts_from_plan(prod_plan)}


def test_there_is_an_example_job_for_every_gpu_pool_of_both_stacks(stack_facts):
    from workloads.jobspec import load_job_spec
    from workloads.trainingjob import resolve

    covered = set()
    for path in JOBS:
        stack = _stack_of(path)
        covered.add((stack, resolve(load_job_spec(path), stack_facts[stack]).pool.name))
    offered = {(stack, pool.name) for stack, facts in stack_facts.items() for pool in facts.pools}
    assert offered - covered == set(), "add an example job (examples/jobs/) for these pools"


@pytest.mark.parametrize("path", JOBS, ids=[p.stem for p in JOBS])
def test_example_job_renders_for_its_stack(path, stack_facts, schemas):
    from workloads.jobspec import load_job_spec
    from workloads.karpenter import GPU_RESOURCE
    from workloads.trainingjob import render, resolve
    from tests.support.validation import validate_custom_resource, validate_pod_template

    stack = _stack_of(path)
    spec = load_job_spec(path)
    facts = stack_facts[stack]
    job = resolve(spec, facts)
    manifest = render(spec, facts)
    assert validate_custom_resource(manifest, schemas) == []
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert sum(r["replicas"] for r in replicas.values()) == spec.nodes
    for replica in replicas.values():
        pod = replica["template"]
        assert validate_pod_template(pod) == []
        assert pod["spec"]["nodeSelector"] == {k: job.pool.node_labels[k] for k in pod["spec"]["nodeSelector"]}
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        if spec.slice_resource:  # one slice, never a whole GPU (workloads.gpu_sharing)
            assert limits[spec.slice_resource] == "1" and GPU_RESOURCE not in limits
        else:
            assert int(limits[GPU_RESOURCE]) == spec.gpus_per_node
    if spec.pool:
        assert job.pool.name == spec.pool
    else:
        assert job.pool.gpu_type == spec.gpu_type
    # An example that cannot be admitted by its team's Kueue quota would wait forever.
    quota = facts.team(spec.team).gpu_quota.get(job.pool.kueue_flavor or job.pool.name, 0)
    assert spec.world_size <= quota, f"{path.name}: {spec.world_size} GPUs, team {spec.team} quota {quota}"


@pytest.mark.parametrize("path", JOBS, ids=[p.stem for p in JOBS])
def test_example_job_passes_submit_dry_run(path, stack_facts, tmp_path, capsys):
    """The command the examples' comments give: preflight must say the job fits (exit 0) and
    print the rendered PyTorchJob."""
    import json

    from jobs.__main__ import main

    stack = _stack_of(path)
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(stack_facts[stack].to_dict()))
    code = main(["submit", str(path), "--stack", stack, "--dry-run", "--facts", str(facts_file)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "OK: the job fits" in captured.err  # the preflight report
    rendered = [d for d in yaml.safe_load_all(captured.out) if d]
    assert rendered and rendered[0]["kind"] == "PyTorchJob"
    assert rendered[0]["metadata"]["name"] == yaml.safe_load(path.read_text())["name"]


OWN_CODE = sorted((ROOT / "examples" / "own-code").glob("*.yaml"))
DECLARED = sorted((ROOT / "workloads" / "declared").glob("*/jobs/*.yaml")) + sorted(
    (ROOT / "workloads" / "declared").glob("*/pipelines/jobs/*.yaml"))


@pytest.mark.parametrize("path", JOBS + OWN_CODE, ids=[p.stem for p in JOBS + OWN_CODE])
def test_example_job_preflights_clean_in_its_stack(path, stack_facts):
    """Every shipped example fits its stack with no problem and no refused name."""
    from jobs.preflight import preflight_file

    report = preflight_file(str(path), stack_facts[_stack_of(path)], repo_root=str(ROOT))
    assert report.problems == [], report.render()


@pytest.mark.parametrize("path", JOBS + DECLARED, ids=[f"{p.parent.parent.name}-{p.stem}" for p in JOBS + DECLARED])
def test_example_registers_its_model_under_its_teams_prefix(path):
    """Review jobs-ops-4 §3: the examples inherited `gpt2-124m` from trainer/configs/gpt2-124m.yaml;
    the team's MLflow login may create only `<namespace>.<name>` (docker/mlflow/mlflow_team_auth.py),
    so the export got a 403 and the job still Succeeded. The effective name (config file +
    overrides, the trainer's own parser) must be under the team's prefix."""
    from jobs.preflight import trainer_config
    from workloads.jobspec import load_job_spec, registered_model_prefix

    spec = load_job_spec(path)
    cfg, problems = trainer_config(spec.trainer, str(ROOT), dataset=spec.dataset, checkpoint_dir=spec.checkpoint_path)
    assert problems == []
    name = cfg.export.registered_model_name
    assert name and name.startswith(registered_model_prefix(spec.namespace)), f"{path.name}: registers {name!r}"


# -- pipeline parameters ------------------------------------------------------------------------------
PIPELINES = sorted((ROOT / "examples" / "pipelines").glob("*.yaml"))


@pytest.mark.parametrize("path", PIPELINES, ids=[p.stem for p in PIPELINES])
def test_example_pipeline_renders_a_valid_workflow_template(path, stack_facts, schemas):
    """The parameter file through the same functions `python -m workloads render` uses: the
    WorkflowTemplate and the PyTorchJob of its train step validate against the pinned CRDs, and
    the file's values are the template's parameter defaults."""
    from components.tracking import K8S_SECRET_NAME
    from jobs.render import cpu_node_selector, load_config
    from workloads import pipeline
    from workloads.fsx import CLAIM_NAME
    from workloads.jobspec import load_job_spec
    from workloads.trainingjob import render
    from tests.support.validation import validate_custom_resource, validate_pod_template

    stack = _stack_of(path)
    declaration = pipeline.parse_declaration(yaml.safe_load(path.read_text()), source=str(path))
    job_spec = load_job_spec(ROOT / declaration.job_spec)
    job = render(job_spec, stack_facts[stack])
    spec = pipeline.pipeline_spec(declaration, job, fsx_claim=CLAIM_NAME, tracking_secret=K8S_SECRET_NAME,
                                  cpu_node_selector=cpu_node_selector(load_config(stack)))
    template = pipeline.workflow_template(spec)
    assert validate_custom_resource(template, schemas) == []
    assert template["metadata"] == {**template["metadata"], "name": declaration.name, "namespace": job_spec.namespace}
    params = {p["name"]: p.get("value") for p in template["spec"]["arguments"]["parameters"]}
    assert params["dataset"] == declaration.dataset
    # Registered under the team's prefix, the only model names its MLflow login may create.
    assert params["model-name"] == f"{job_spec.namespace}.{declaration.model_name}"
    assert params["job-spec"] == declaration.job_spec
    steps = {t["name"] for t in template["spec"]["templates"]}
    assert set(pipeline.STEP_NAMES) <= steps
    train_job = embedded_job(template)
    assert validate_custom_resource(train_job, schemas) == []
    for replica in train_job["spec"]["pytorchReplicaSpecs"].values():
        assert validate_pod_template(replica["template"]) == []
        assert replica["template"]["spec"]["nodeSelector"] == job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"]


@pytest.mark.parametrize("path", PIPELINES, ids=[p.stem for p in PIPELINES])
def test_example_pipeline_runs_locally_to_a_registered_model(path, tmp_path):
    """The command in the file's header: the pipeline's steps on CPU, tiny, from raw text to a
    model version in a local MLflow registry."""
    import argparse
    import os
    import shutil
    import subprocess
    import sys

    texts = tmp_path / "texts"
    texts.mkdir()
    shutil.copy(argparse.__file__, texts / "argparse.txt")  # a corpus that ships with Python
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "workloads", "pipeline", str(path.relative_to(ROOT)), "--stack", _stack_of(path),
         "--local", "--dataset", str(texts), "--steps", "6", "--work-dir", str(tmp_path / "run")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    model_name = yaml.safe_load(path.read_text())["modelName"]
    assert "registered version 1" in result.stdout, result.stdout[-2000:]
    assert f"--registered-model-name {model_name}" in result.stdout
