"""GPU capacity capability: config errors, and the recorded plan of both stacks."""
from __future__ import annotations

import json

import pytest

from infra.config import ConfigError, load_platform_config
from tests.conftest import stack_config
from tests.support.validation import validate_core, validate_custom_resource, validate_pod_template

CR_KINDS = ("NodePool", "EC2NodeClass", "ResourceFlavor", "ClusterQueue", "LocalQueue")


def _custom_resources(plan, kinds=CR_KINDS):
    out = []
    for r in plan.recording.resources:
        if r.type.startswith("kubernetes:") and r.inputs.get("kind") in kinds:
            out.append({k: r.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in r.inputs})
    return out


# -- config errors ----------------------------------------------------------------------
def _problems(raw):
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    return {p.path: p for p in info.value.problems}


def _pool(**overrides):
    pool = {"name": "p", "gpuType": "h100", "gpusPerNode": 8, "capacityTypes": ["spot", "on-demand"], "maxGpus": 16,
            "checkpointSeconds": 60, "terminationGracePeriodSeconds": 110}
    pool.update(overrides)
    return pool


def test_bad_pools_are_all_reported_at_once():
    raw = stack_config("dev")
    raw["gpuPools"] = [
        _pool(name="a", gpuType="h1000"),
        _pool(name="b", gpuType="l4", gpusPerNode=2),
        _pool(name="c", gpuType="h100", gpusPerNode=1, efa=True, maxGpus=4),
        _pool(name="d", gpuType="a10g", gpusPerNode=4, maxGpus=2),
        _pool(name="d", capacityTypes=["reserved"]),
        _pool(name="f", terminationGracePeriodSeconds=130),
    ]
    problems = _problems(raw)
    unknown = problems["gpuPools[0].gpuType"]
    assert unknown.value == "h1000" and "h100" in unknown.fix and "l40s" in unknown.fix
    assert problems["gpuPools[1].gpusPerNode"].value == 2 and "[1, 4, 8]" in problems["gpuPools[1].gpusPerNode"].fix
    assert "supports EFA" in problems["gpuPools[2].efa"].message
    assert problems["gpuPools[3].maxGpus"].value == 2 and "below one node" in problems["gpuPools[3].maxGpus"].message
    assert "duplicates" in problems["gpuPools[4].name"].message
    assert problems["gpuPools[4].capacityReservationIds"].value == []
    assert "spot" in problems["gpuPools[5].terminationGracePeriodSeconds"].message


def test_efa_on_a_type_without_efa_at_that_size():
    raw = stack_config("dev")
    raw["gpuPools"] = [_pool(gpuType="h100", gpusPerNode=1, efa=True, maxGpus=4)]
    problem = _problems(raw)["gpuPools[0].efa"]
    assert "no h100 instance with 1 GPU(s) supports EFA" in problem.message and "[8]" in problem.fix


def test_prod_must_pin_the_ami():
    raw = stack_config("prod")
    raw["gpuPools"][0]["amiAlias"] = "al2023@latest"
    raw["karpenter"]["amiAlias"] = "al2023@latest"
    problems = _problems(raw)
    assert problems["gpuPools[0].amiAlias"].value == "al2023@latest"
    assert problems["karpenter.amiAlias"].fix.startswith("pin a release")


def test_team_quota_rules():
    raw = stack_config("dev")
    raw["scheduling"]["teams"] = [
        {"name": "a", "gpuQuota": {"nope": 1}},
        {"name": "b", "gpuQuota": {"l4": 5}},  # the l4 pool launches at most 4
        {"name": "b"},
    ]
    problems = _problems(raw)
    assert "names no GPU pool" in problems["scheduling.teams[0].gpuQuota.nope"].message
    assert "exceeds the pool's maxGpus (4)" in problems["scheduling.teams[1].gpuQuota.l4"].message
    assert "twice" in problems["scheduling.teams[2].name"].message


def test_pool_zone_must_be_a_network_az():
    raw = stack_config("dev")
    raw["gpuPools"][0]["zones"] = ["us-west-2z"]
    assert _problems(raw)["gpuPools[0].zones"].value == "us-west-2z"


def test_stack_files_parse():
    for stack in ("dev", "prod"):
        config = load_platform_config(stack_config(stack))
        assert config.gpu_pools and config.scheduling.teams


# -- the recorded plan ------------------------------------------------------------------
def test_every_custom_resource_validates_against_pinned_crds(plan, schemas):
    objects = _custom_resources(plan)
    assert {o["kind"] for o in objects} == set(CR_KINDS)
    for obj in objects:
        assert validate_custom_resource(obj, schemas) == [], (obj["kind"], obj["metadata"]["name"])


def test_built_in_objects_validate_against_kubernetes_1_32(plan):
    kinds = ("Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "PriorityClass")
    found = 0
    for r in plan.recording.resources:
        if r.type.startswith("kubernetes:") and r.type.split(":")[-1] in kinds and "scheduling" in r.name:
            obj = {"apiVersion": r.type.split(":")[1].replace("core/", ""), "kind": r.type.split(":")[-1], **r.inputs}
            assert validate_core(obj) == [], r.name
            found += 1
    assert found >= 10


def test_daemonset_placement_from_helm_values_is_a_valid_pod_template(plan):
    # The charts' DaemonSets receive these affinity/tolerations verbatim.
    releases = [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if "gpu-enablement" in r.name]
    assert releases
    for release in releases:
        values = release.inputs["values"]
        if release.inputs["name"] == "gpu-operator":
            # The operator places its operands itself; they take these tolerations (daemonsets.tolerations).
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["daemonsets"]["tolerations"]
            continue
        if release.inputs["name"] == "efa-device-plugin":
            # aws-efa-k8s-device-plugin v0.5.6 templates/daemonset.yaml builds the node affinity from
            # supportedInstanceLabels (one `key In values` term per key) and reads no `affinity` value.
            assert "affinity" not in values
            assert values["supportedInstanceLabels"] == {"keys": ["mlplatform.io/efa"], "values": ["true"]}
            values = {**values, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In",
                                                             "values": values["supportedInstanceLabels"]["values"]}
                                                            for key in values["supportedInstanceLabels"]["keys"]]}]}}}}
        template = {"metadata": {"labels": {"app": release.inputs["name"]}},
                    "spec": {"affinity": values["affinity"], "tolerations": values["tolerations"],
                             "containers": [{"name": "c", "image": "example:1"}]}}
        assert validate_pod_template(template) == [], release.name
        terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["key"] in ("node.mlplatform.io/role", "mlplatform.io/efa")
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]


def test_interruption_rules_have_exact_patterns_and_target_the_queue(plan):
    queue = next(r for r in plan.recording.by_type("aws:sqs/queue:Queue") if "karpenter" in r.name)
    assert queue.inputs["messageRetentionSeconds"] == 300
    assert queue.inputs["sqsManagedSseEnabled"] is True
    rules = [r for r in plan.recording.by_type("aws:cloudwatch/eventRule:EventRule") if "karpenter" in r.name]
    patterns = sorted((json.loads(r.inputs["eventPattern"]) for r in rules), key=json.dumps)
    assert patterns == sorted([
        {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
        {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
        {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
        {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
        # Karpenter v1.14.1 reference CloudFormation: CapacityReservationInterruptionRule.
        {"source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]},
    ], key=json.dumps)
    targets = [r for r in plan.recording.by_type("aws:cloudwatch/eventTarget:EventTarget") if "karpenter" in r.name]
    assert len(targets) == 5 and all(t.inputs["arn"] == queue.outputs["arn"] for t in targets)
    assert {t.inputs["rule"] for t in targets} == {r.outputs["name"] for r in rules}
    policy = json.loads(plan.recording.one("aws:sqs/queuePolicy:QueuePolicy", queue.name + "-policy").inputs["policy"])
    allow, deny = policy["Statement"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"} and allow["Action"] == "sqs:SendMessage"
    # Only the stack's own rules may send (aws:SourceArn, as EventBridge documents for SQS targets).
    assert allow["Condition"] == {"ArnEquals": {"aws:SourceArn": sorted(r.outputs["arn"] for r in rules)}}
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_helm_values_carry_queue_name_and_run_on_system_nodes(plan):
    release = next(r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("name") == "karpenter")
    queue = next(r for r in plan.recording.by_type("aws:sqs/queue:Queue") if "karpenter" in r.name)
    values = release.inputs["values"]
    assert values["settings"]["interruptionQueue"] == queue.outputs["name"]
    assert not values["settings"]["interruptionQueue"].startswith(("arn:", "https:"))
    assert values["settings"]["clusterName"] == plan.config.cluster_name
    assert release.inputs["version"] == "1.14.1" and release.inputs["chart"] == "oci://public.ecr.aws/karpenter/karpenter"
    assert values["nodeSelector"] == {"node.mlplatform.io/role": "system"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    if plan.config.is_prod:
        assert values["replicas"] == 2 and values["podDisruptionBudget"]["maxUnavailable"] == 1
    else:
        assert values["replicas"] == 1


def test_controller_role_trusts_pod_identity_only_and_policy_is_scoped(plan):
    role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.name.endswith("karpenter-aws-controller-role"))
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert statement["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-namespace"] == "karpenter"
    association = next(r for r in plan.recording.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation") if "karpenter" in r.name)
    assert (association.inputs["namespace"], association.inputs["serviceAccount"]) == ("karpenter", "karpenter")
    # Only this association's session (its namespace and service account, on this cluster) may assume the role.
    tags = statement["Condition"]["StringEquals"]
    assert tags["aws:RequestTag/kubernetes-service-account"] == association.inputs["serviceAccount"]
    assert tags["aws:RequestTag/eks-cluster-arn"].endswith(f":cluster/{plan.config.cluster_name}")
    assert association.inputs["roleArn"] == role.outputs["arn"]
    policy = json.loads(plan.recording.one("aws:iam/rolePolicy:RolePolicy", role.name.removesuffix("-role") + "-policy").inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    cluster = plan.config.cluster_name
    node_role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.name.endswith("karpenter-aws-node-role"))
    assert by_sid["AllowPassingInstanceRole"]["Resource"] == node_role.outputs["arn"]
    assert by_sid["AllowScopedDeletion"]["Condition"]["StringEquals"] == {f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}
    assert by_sid["AllowScopedEC2InstanceActionsWithTags"]["Condition"]["StringLike"] == {"aws:RequestTag/karpenter.sh/nodepool": "*"}
    queue = next(r for r in plan.recording.by_type("aws:sqs/queue:Queue") if "karpenter" in r.name)
    assert by_sid["AllowInterruptionQueueActions"]["Resource"] == queue.outputs["arn"]
    assert by_sid["AllowAPIServerEndpointDiscovery"]["Resource"].endswith(f":cluster/{cluster}")
    wildcard = [s["Sid"] for s in policy["Statement"] if s["Resource"] == "*" and "Condition" not in s]
    # Upstream's only unconditioned "*" statements: pricing and listing instance profiles.
    assert wildcard == ["AllowPricingReadActions", "AllowUnscopedInstanceProfileListAction"]
    assert len(json.dumps(policy, separators=(",", ":"))) < 10240  # inline policy size limit


def test_node_role_has_ec2_linux_access_entry(plan):
    node_role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.name.endswith("karpenter-aws-node-role"))
    entry = next(r for r in plan.recording.by_type("aws:eks/accessEntry:AccessEntry") if "karpenter" in r.name)
    assert entry.inputs["type"] == "EC2_LINUX" and entry.inputs["principalArn"] == node_role.outputs["arn"]
    attached = {r.inputs["policyArn"].rsplit("/", 1)[-1] for r in plan.recording.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r.parent == node_role.urn}
    assert attached == {"AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryPullOnly", "AmazonSSMManagedInstanceCore"}
    node_classes = _custom_resources(plan, ("EC2NodeClass",))
    assert node_classes and all(nc["spec"]["role"] == node_role.outputs["name"] for nc in node_classes)


def test_gpu_node_pools_are_training_safe(plan):
    pools = [o for o in _custom_resources(plan, ("NodePool",)) if o["metadata"]["name"].startswith("gpu-")]
    assert len(pools) == len(plan.config.gpu_pools)
    for pool in pools:
        spec = pool["spec"]
        assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
        assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in spec["template"]["spec"]["taints"]
        # MIG pools also start with the MIG gate's taint (tests/workloads/test_gpu_sharing.py).
        mig = pool["spec"]["template"]["metadata"]["labels"].get("mlplatform.io/gpu-sharing") == "mig"
        # The storage mode's CSI taints only (aws-readiness-4 R1): fsx in prod, EFS + Mountpoint in dev.
        storage = {"fsx": [{"key": "fsx.csi.aws.com/agent-not-ready", "effect": "NoExecute"}],
                   "s3-mountpoint": [{"key": "efs.csi.aws.com/agent-not-ready", "effect": "NoExecute"},
                                     {"key": "s3.csi.aws.com/agent-not-ready", "effect": "NoExecute"}]}
        assert spec["template"]["spec"]["startupTaints"] == storage[plan.config.datasets.storage.value] + [
            {"key": "node.mlplatform.io/gpu-not-ready", "effect": "NoSchedule"}] + (
            [{"key": "mlplatform.io/mig-pending", "effect": "NoSchedule"}] if mig else [])
        assert int(spec["limits"]["nvidia.com/gpu"]) > 0
    for node_class in _custom_resources(plan, ("EC2NodeClass",)):
        assert node_class["spec"]["metadataOptions"]["httpPutResponseHopLimit"] == 1
        assert node_class["spec"]["metadataOptions"]["httpTokens"] == "required"
        if plan.config.is_prod:
            assert not node_class["spec"]["amiSelectorTerms"][0]["alias"].endswith("@latest")


def test_kubernetes_resources_use_the_cluster_provider(plan):
    mine = [r for r in plan.recording.resources if r.type.startswith("kubernetes:") and r.custom
            and any(s in r.name for s in ("karpenter", "node-pools", "gpu-enablement", "scheduling"))]
    assert mine and all(r.provider and "k8s" in r.provider for r in mine)


def _requirements(plan, pool_name):
    pool = next(o for o in _custom_resources(plan, ("NodePool",)) if o["metadata"]["name"] == f"gpu-{pool_name}")
    return pool["spec"]["template"]["spec"]["requirements"]


def test_switching_one_pools_gpu_type_changes_only_that_pool(dev_plan, plan_config):
    raw = stack_config("dev")
    first, second = raw["gpuPools"][0]["name"], raw["gpuPools"][1]["name"]
    raw["gpuPools"][0]["gpuType"] = "l40s"  # one line: l4 -> l40s
    changed = plan_config("dev", raw)
    before, after = _requirements(dev_plan, first), _requirements(changed, first)
    diff = {r["key"] for r in before if r not in after} | {r["key"] for r in after if r not in before}
    assert diff == {"karpenter.k8s.aws/instance-gpu-name", "karpenter.k8s.aws/instance-family"}
    assert {r["key"]: r["values"] for r in after}["karpenter.k8s.aws/instance-gpu-name"] == ["l40s"]
    assert _requirements(changed, second) == _requirements(dev_plan, second)


def test_plan_has_a_section_per_pool_and_no_eviction_warning(plan):
    titles = [title for title, _ in plan.sections]
    for pool in plan.config.gpu_pools:
        assert f"GPU pool {pool.name}" in titles
        lines = dict(plan.sections)[f"GPU pool {pool.name}"]
        assert any(line.startswith("instance types") for line in lines)
        assert any(f"nvidia.com/gpu {pool.max_gpus}" in line for line in lines)
    assert not [w for w in plan.warnings if w.startswith("GPU pool")]


def test_plan_warns_about_settings_that_evict_training(plan_config):
    raw = stack_config("prod")
    raw["gpuPools"][0]["consolidationPolicy"] = "WhenEmptyOrUnderutilized"
    raw["gpuPools"][2]["capacityTypes"] = ["spot"]
    raw["scheduling"]["teams"][1]["gpuQuota"]["l40s"] = 16
    warnings = [w for w in plan_config("prod", raw).warnings if w.startswith("GPU pool")]
    assert any("gpu-h100" in w and "consolidationPolicy WhenEmptyOrUnderutilized" in w for w in warnings)
    assert any("gpu-l40s" in w and "spot only in prod" in w for w in warnings)
    assert any("l40s" in w and "quotas sum to 24" in w for w in warnings)


def test_gpu_nodes_get_the_readiness_agent_that_lifts_their_startup_taint(plan):
    """Every GPU NodePool's nodes start tainted: the stack must deploy the agent that lifts it."""
    daemonsets = [r for r in plan.recording.resources if r.type.startswith("kubernetes:") and r.inputs.get("kind") == "DaemonSet"
                  and r.inputs["metadata"]["name"] == "gpu-node-health"]
    assert len(daemonsets) == 1
    image = daemonsets[0].inputs["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == plan.config.gpu_enablement.node_health_image


def _tolerates(tolerations, taint) -> bool:
    # Kubernetes' rule (k8s.io/api/core/v1 Toleration.ToleratesTaint): an empty effect matches
    # every effect; operator Exists matches any value of the key.
    return any(t.get("key") == taint["key"] and t.get("effect", taint["effect"]) in ("", taint["effect"])
               and (t.get("operator") == "Exists" or t.get("value") == taint.get("value")) for t in tolerations)


def test_the_readiness_agent_tolerates_every_taint_a_gpu_pool_starts_with(plan):
    """A shared or MIG pool's node carries its own taints besides the readiness taint; an agent
    that did not tolerate them would never run there, and the node would never take a job."""
    agent = next(r for r in plan.recording.resources if r.type.startswith("kubernetes:") and r.inputs.get("kind") == "DaemonSet"
                 and r.inputs["metadata"]["name"] == "gpu-node-health")
    tolerations = agent.inputs["spec"]["template"]["spec"]["tolerations"]
    for pool in _custom_resources(plan, ("NodePool",)):
        spec = pool["spec"]["template"]["spec"]
        for taint in spec.get("taints", []) + spec.get("startupTaints", []):
            assert _tolerates(tolerations, taint), (pool["metadata"]["name"], taint)


@pytest.mark.parametrize("stack, image, words", [
    ("dev", None, "no GPU node would ever take a job"),
    ("prod", "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-prod/node-health:4.2.3-1", "pinned by digest"),
])
def test_node_health_image_is_required_with_gpu_pools_and_pinned_in_prod(stack, image, words):
    raw = stack_config(stack)
    if image is None:
        raw["gpuEnablement"].pop("nodeHealthImage")
    else:
        raw["gpuEnablement"]["nodeHealthImage"] = image
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (problem,) = [p for p in info.value.problems if p.path == "gpuEnablement.nodeHealthImage"]
    assert problem.value == image and words in problem.message + problem.fix
    raw["gpuPools"] = []
    raw["gpuEnablement"].pop("nodeHealthImage", None)
    assert not [p for p in _all_problems(raw) if p.path == "gpuEnablement.nodeHealthImage"]


def _all_problems(raw):
    """The config's problems, or none (where _problems insists on some)."""
    try:
        load_platform_config(raw)
    except ConfigError as error:
        return error.problems
    return []


def test_every_deployment_the_gpu_operator_release_waits_for_fits_the_system_nodes(prod_plan):
    """aws-readiness-4 K1. The release's atomic wait needs the operator and NFD's master and gc
    Deployments Ready. gpu-operator v25.3.0 values.yaml gives node-feature-discovery (v0.17.2)
    master only control-plane tolerations and gc none (templates master.yaml / nfd-gc.yaml take
    .Values.<part>.nodeSelector and .tolerations); the system nodes carry CriticalAddonsOnly."""
    from workloads.placement import system_node_selector

    release = next(r for r in prod_plan.recording.resources
                   if r.type.startswith("kubernetes:helm.sh") and r.inputs.get("chart") == "gpu-operator")
    values = release.inputs["values"]
    system_taint = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}
    for part in (values["operator"], values["node-feature-discovery"]["master"], values["node-feature-discovery"]["gc"]):
        assert part["nodeSelector"] == system_node_selector()
        assert _tolerates(part["tolerations"], system_taint), part
