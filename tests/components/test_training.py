"""Training capability in the recorded plans: operators, per-team trainer identity, the cluster
fixes jobs need (Kueue covers EFA, no default limits, Pod Identity + S3 egress), TrainingJob."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from catalog.versions import TRAINER_CHART, TRAINER_VERSION, TRAINING_OPERATOR_OVERLAY_DIR
from workloads.jobspec import JobSpecError, parse_job_spec
from workloads.placement import system_node_selector
from workloads.trainingjob import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml").read_text())


def _k8s(plan, kind):
    return [r for r in plan.recording.resources if r.type.startswith("kubernetes:") and r.inputs.get("kind") == kind]


def test_training_operator_pinned_kustomize_on_system_nodes(plan):
    (directory,) = plan.recording.by_type("kubernetes:kustomize/v2:Directory")
    # the local overlay (tests/infra/test_first_deploy.py builds it with kustomize: system nodes)
    # relative to the program's working directory, Pulumi.yaml `main: infra/` (the provider's too)
    assert (ROOT / "infra" / directory.inputs["directory"]).resolve() == (ROOT / TRAINING_OPERATOR_OVERLAY_DIR).resolve()
    # Trainer v2 is off unless the stack asks for it.
    assert not [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("chart") == TRAINER_CHART]


def test_trainer_v2_behind_the_config_flag(plan_config):
    from jobs.facts import facts_from_plan
    from tests.conftest import stack_config

    raw = stack_config("dev")
    raw["training"] = {"trainerV2": True}
    plan = plan_config("dev", raw)
    (release,) = [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("chart") == TRAINER_CHART]
    assert release.inputs["version"] == TRAINER_VERSION
    values = release.inputs["values"]
    assert values["runtimes"]["torchDistributed"]["enabled"] is True
    assert values["manager"]["nodeSelector"] == system_node_selector()
    # TrainJobs reference the platform's runtime (its failure policy: tests/workloads/test_trainjob_runtime.py).
    from workloads import trainjob_runtime

    assert facts_from_plan(plan).trainer_v2_runtime == trainjob_runtime.RUNTIME_NAME
    (runtime,) = [r for r in plan.recording.resources if r.inputs.get("kind") == "ClusterTrainingRuntime"]
    assert runtime.inputs["metadata"]["name"] == trainjob_runtime.RUNTIME_NAME
    assert runtime.inputs["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["action"] == "FailJobSet"
    # With Trainer v2, each team's TrainJob pods get their PodMonitor; without it (the stacks'
    # default) none is declared: no TrainJob pod can exist, so it would select nothing
    # (tests/cluster/test_selectors_live.py decides the selector on the real API server).
    def trainjob_monitors(p):
        return sorted(r.inputs["metadata"]["namespace"] for r in p.recording.resources
                      if r.inputs.get("kind") == "PodMonitor" and r.inputs["metadata"]["name"].endswith("-trainjob"))

    assert trainjob_monitors(plan) == sorted(plan.config.team_namespaces)
    assert trainjob_monitors(plan_config("dev", stack_config("dev"))) == []


def test_kueue_manager_integrates_both_job_kinds(plan):
    (kueue,) = [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("name") == "kueue"]
    config = yaml.safe_load(kueue.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert {"kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob"} <= set(config["integrations"]["frameworks"])


def test_each_team_trainer_role_reaches_only_its_checkpoint_prefix(plan):
    from jobs.facts import facts_from_plan

    facts = facts_from_plan(plan)
    bucket = next(r for r in plan.recording.by_type("aws:s3/bucket:Bucket") if r.name.endswith("datasets-checkpoints-bucket"))
    associations = plan.recording.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    namespaces = [t.namespace for t in facts.teams]
    assert namespaces
    for ns in namespaces:
        sa = next(r for r in _k8s(plan, "ServiceAccount") if r.inputs["metadata"] == {**r.inputs["metadata"], "namespace": ns})
        assert sa.inputs["metadata"]["name"] == "trainer"
        role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.name.endswith(f"trainer-access-{ns}-role"))
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
        assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert trust["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-namespace"] == ns
        assert trust["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-service-account"] == "trainer"
        policy = json.loads(next(r for r in plan.recording.by_type("aws:iam/rolePolicy:RolePolicy")
                                 if r.name.endswith(f"trainer-access-{ns}-checkpoints")).inputs["policy"])
        by_sid = {s["Sid"]: s for s in policy["Statement"]}
        assert by_sid["TeamObjects"]["Resource"] == f"{bucket.outputs['arn']}/{ns}/*"
        assert by_sid["ListTeamPrefix"]["Resource"] == bucket.outputs["arn"]
        assert by_sid["ListTeamPrefix"]["Condition"]["StringLike"]["s3:prefix"] == [f"{ns}/", f"{ns}/*"]
        assert by_sid["BucketKeyThroughS3"]["Condition"]["StringEquals"]["kms:ViaService"] == f"s3.{plan.config.region}.amazonaws.com"
        others = [o for o in namespaces if o != ns]
        assert not any(o in json.dumps(policy) for o in others)
        association = next(a for a in associations if a.inputs.get("namespace") == ns)
        assert association.inputs["serviceAccount"] == "trainer" and association.inputs["roleArn"] == role.outputs["arn"]


def test_network_policies_allow_pod_identity_and_exactly_the_gateway_prefix_list(plan):
    endpoint = next(r for r in plan.recording.by_type("aws:ec2/vpcEndpoint:VpcEndpoint") if r.inputs.get("vpcEndpointType") == "Gateway")
    policies = {(r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs for r in _k8s(plan, "NetworkPolicy")}
    # Every team namespace (where training pods run); system namespaces have policies of their own.
    namespaces = set(plan.config.team_namespaces)
    assert namespaces
    for ns in namespaces:
        agent = policies[(ns, "allow-pod-identity-agent")]["spec"]["egress"]
        assert agent == [{"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}], "ports": [{"protocol": "TCP", "port": 80}]}]
        s3 = policies[(ns, "allow-s3-gateway-endpoint")]["spec"]["egress"]
        assert sorted(p["ipBlock"]["cidr"] for p in s3[0]["to"]) == sorted(endpoint.outputs["cidrBlocks"])
        assert s3[0]["ports"] == [{"protocol": "TCP", "port": 443}]


def test_empty_prefix_list_is_refused_not_opened():
    from workloads.scheduling import ip_block_peers

    with pytest.raises(ValueError, match="every destination"):
        ip_block_peers([])


def test_limit_range_sets_no_default_limits(plan):
    for r in _k8s(plan, "LimitRange"):
        for limit in r.inputs["spec"]["limits"]:
            assert "default" not in limit and limit["defaultRequest"]


def test_kueue_covers_every_resource_the_example_job_requests(prod_plan):
    from jobs.facts import facts_from_plan

    facts = facts_from_plan(prod_plan)
    job = render(parse_job_spec(EXAMPLE), facts)
    requests = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    team = facts.team("foundation-models")
    cq = next(r.inputs for r in _k8s(prod_plan, "ClusterQueue")
              if r.inputs["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == team.namespace)
    (group,) = cq["spec"]["resourceGroups"]
    assert set(requests) <= set(group["coveredResources"])
    flavor = next(f for f in group["flavors"] if f["name"] == facts.pool("h100").kueue_flavor)
    quota = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    nodes = EXAMPLE["nodes"]
    assert int(quota["vpc.amazonaws.com/efa"]) >= nodes * int(requests["vpc.amazonaws.com/efa"])
    assert int(quota["nvidia.com/gpu"]) >= nodes * int(requests["nvidia.com/gpu"])
    assert int(quota["cpu"]) >= nodes * int(requests["cpu"])


def test_training_job_component_applies_with_the_cluster_provider(prod_plan):
    from infra.config import PROJECT
    from infra.plan.mock_engine import run_recorded
    from infra.plan import read_stack_file, stack_file
    from jobs.facts import facts_from_plan
    from components.training import TrainingJob, TrainingJobArgs

    facts = facts_from_plan(prod_plan)
    values, _ = read_stack_file(stack_file("prod", ROOT))

    def program():
        from infra import program as platform_program

        platform = platform_program.main()
        TrainingJob("gpt2-pretrain", TrainingJobArgs(spec=parse_job_spec(EXAMPLE), facts=facts, cluster=platform.cluster))

    recording = run_recorded(program, project=PROJECT, stack="prod", config=values)
    (job,) = recording.by_type("kubernetes:kubeflow.org/v1:PyTorchJob")
    provider = recording.by_urn(job.provider)
    assert provider.type == "pulumi:providers:kubernetes" and provider.name.endswith("cluster-k8s")
    assert job.inputs["spec"] == render(parse_job_spec(EXAMPLE), facts)["spec"]


def test_training_job_component_refuses_a_bad_spec_before_registering(prod_plan):
    from jobs.facts import facts_from_plan
    from components.training import TrainingJob, TrainingJobArgs

    facts = facts_from_plan(prod_plan)
    with pytest.raises(JobSpecError):
        TrainingJob("bad", TrainingJobArgs(spec=parse_job_spec({**EXAMPLE, "team": "nobody"}), facts=facts, cluster=None))


def test_each_team_gets_its_directory_owned_by_its_uid_without_a_root_pod(plan):
    """The team directory is an S3 directory object with POSIX metadata, imported by the
    /checkpoints association (FSx for Lustre User Guide, "POSIX metadata support for data
    repositories": a key ending in "/" maps to a directory; x-amz-meta-file-owner, -group and
    -permissions "<octal file type><octal permission mask>" as st_mode). No Job runs as root.
    Dev (storage s3-mountpoint): the team's EFS access point creates the directory with the
    same owner and mode (EFS User Guide, access points "CreationInfo")."""
    objects = {r.inputs["key"]: r for r in plan.recording.by_type("aws:s3/bucketObjectv2:BucketObjectv2")}
    teams = {t.namespace: t.uid for t in plan.config.scheduling.teams}
    assert teams
    if plan.config.datasets.fsx is None:
        points = {a.inputs["rootDirectory"]["path"]: a.inputs for a in plan.recording.by_type("aws:efs/accessPoint:AccessPoint")}
        for namespace, uid in teams.items():
            assert points[f"/checkpoints/{namespace}"]["rootDirectory"]["creationInfo"] == {
                "ownerUid": uid, "ownerGid": uid, "permissions": "0750"}
            assert f"{namespace}/" not in objects
        return
    for namespace, uid in teams.items():
        obj = objects[f"{namespace}/"]
        assert obj.inputs["metadata"] == {"file-owner": str(uid), "file-group": str(uid), "file-permissions": "040750"}
        mode = int(obj.inputs["metadata"]["file-permissions"], 8)
        assert mode & 0o170000 == 0o040000 and mode & 0o777 == 0o750  # a directory; others get nothing
    assert not [r for r in _k8s(plan, "Job") if r.inputs["metadata"]["name"] == "checkpoint-root"]
    assert len(set(teams.values())) == len(teams)  # one uid per team


def test_checkpoint_dir_outside_the_team_directory_is_refused(prod_plan):
    from jobs.facts import facts_from_plan
    from workloads.trainingjob import resolve

    with pytest.raises(JobSpecError) as info:
        resolve(parse_job_spec({**EXAMPLE, "checkpointDir": "/fsx/checkpoints/team-research/steal"}), facts_from_plan(prod_plan))
    (problem,) = [p for p in info.value.problems if p.path == "checkpointDir"]
    assert "/fsx/checkpoints/team-foundation-models/" in problem.fix
