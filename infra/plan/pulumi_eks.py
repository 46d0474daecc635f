"""What pulumi-eks 4.4.0's ``eks:index:Cluster`` registers and returns, for the options the platform
uses: one home for the offline plan (``infra.plan.mock_engine`` records these children) and the
``eks`` stand-in provider plugin (``tools/engine/standins/eks.py`` registers them with the engine).

Source: pulumi/pulumi-eks ``nodejs/eks/cluster/cluster.ts`` (``createCore``, ``createCluster``,
``Cluster``, ``generateKubeconfig``), ``nodejs/eks/servicerole.ts`` and
``nodejs/eks/cmd/provider/cluster.ts`` (the state ``Construct`` returns), read at commit 7bf0c1b
(v4.3.0 and later; ``cluster.ts`` unchanged since fcb18588, 2026-07-24). The 4.4.0 Python SDK's
``ClusterArgs`` declares the same 57 inputs as that commit's schema.

With the platform's options (``components/cluster.py``: no default node group or security groups,
access entries only, no managed kube-proxy/CoreDNS/VPC CNI from the component, no OIDC provider)
the component registers, in order:

* ``eks:index:ServiceRole`` ``<name>-eksRole`` with ``aws:iam/role:Role`` ``<name>-eksRole-role``
  and one ``aws:iam/rolePolicyAttachment:RolePolicyAttachment`` ``<name>-eksRole-<sha1(policy id)[:8]>``
  for AmazonEKSClusterPolicy (after an ``aws:index/getPartition`` invoke);
* ``aws:eks/cluster:Cluster`` ``<name>-eksCluster``, with ``ignoreChanges`` on
  ``accessConfig.bootstrapClusterCreatorAdminPermissions`` and ``bootstrapSelfManagedAddons`` and a
  dependency on the role and its attachment;
* ``pulumi:providers:kubernetes`` ``<name>-eks-k8s`` with the cluster's kubeconfig.

Options that would register anything else (a default node group, the default security groups,
Fargate, Auto Mode, the managed kube-proxy/CoreDNS add-ons, the VPC CNI add-on, an OIDC provider,
aws-auth, storage classes, access entries given to the component, instance roles, a creation role
provider, a service role given by the caller, the default VPC) are refused by
``unsupported_options`` with their names: this model does not register those children.

Values: the functions take a ``Resolver``, so one description serves plain values (the offline
plan: fabricated outputs) and values not known yet (the stand-in: ``pulumi.Output``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

VERSION = "4.4.0"
CLUSTER_TYPE = "eks:index:Cluster"
SERVICE_ROLE_TYPE = "eks:index:ServiceRole"
GET_KUBECONFIG = "eks:index:Cluster/getKubeconfig"

# cluster.ts createCore: `const managedPolicies = ["AmazonEKSClusterPolicy"]` (no Auto Mode).
CLUSTER_ROLE_POLICIES = ("AmazonEKSClusterPolicy",)
# cluster.ts: ignoreChanges of the aws.eks.Cluster child.
CLUSTER_IGNORE_CHANGES = ("accessConfig.bootstrapClusterCreatorAdminPermissions", "bootstrapSelfManagedAddons")


class UnsupportedOptions(ValueError):
    """Component options that would make pulumi-eks register children this model does not."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("eks:index:Cluster options this stand-in does not model (it registers only the "
                         "children the platform's options give): " + "; ".join(problems))


class Resolver(Protocol):
    """Where values come from: plain values (offline plan) or outputs (stand-in)."""

    def ref(self, key: str, path: Optional[str] = None) -> Any:
        """A child registered earlier (``path`` None: the resource itself, which an input turns
        into its id), or one of its outputs by wire path (``identities.0.oidcs.0.issuer``)."""

    def combine(self, fn: Callable[..., Any], *values: Any) -> Any:
        """``fn`` applied to ``values`` once they are known."""

    def partition(self) -> Any:
        """``aws:index/getPartition:getPartition``'s ``partition`` (an invoke under the component)."""

    def endpoint(self) -> Any:
        """cluster.ts ``endpoint``: the eksCluster child's endpoint, once its ``/healthz`` answers
        when the endpoint is public and this is not a preview."""

    def kubeconfig_user(self) -> Optional[Mapping[str, Any]]:
        """Credentials to write instead of the ``aws eks get-token`` exec plugin, or None."""


@dataclass(frozen=True)
class Child:
    key: str                      # this model's handle, for references between children
    type: str
    name: str
    parent: Optional[str]         # key of the parent child; None: the component itself
    inputs: dict
    custom: bool = True
    depends_on: tuple[str, ...] = ()
    ignore_changes: tuple[str, ...] = ()
    reads: tuple[str, ...] = field(default=())  # component inputs the child's inputs come from


def _is_set(value: Any) -> bool:
    return value is not None and value is not False and value != [] and value != {}


def unsupported_options(args: Mapping[str, Any]) -> list[str]:
    """Each option whose value makes cluster.ts register a child this model does not have."""
    problems = []

    def need(condition: bool, what: str) -> None:
        if not condition:
            problems.append(what)

    need(args.get("skipDefaultNodeGroup") is True, "skipDefaultNodeGroup must be true (the default node group)")
    need(args.get("skipDefaultSecurityGroups") is True,
         "skipDefaultSecurityGroups must be true (the cluster and node security groups)")
    need(args.get("useDefaultVpcCni") is True, "useDefaultVpcCni must be true (the VpcCniAddon child)")
    need((args.get("kubeProxyAddonOptions") or {}).get("enabled", True) is False,
         "kubeProxyAddonOptions.enabled must be false (the kube-proxy Addon child)")
    coredns = args.get("corednsAddonOptions") or {}
    need(coredns.get("enabled") is not True and not coredns.get("configurationValues"),
         "corednsAddonOptions must not enable CoreDNS (the coredns Addon child)")
    need(not args.get("createOidcProvider"), "createOidcProvider must be false (the OpenIdConnectProvider child)")
    need(args.get("authenticationMode") == "API", "authenticationMode must be API (CONFIG_MAP adds the aws-auth ConfigMap)")
    need(bool(args.get("vpcId")), "vpcId must be set (without it the component looks up the default VPC)")
    if (args.get("autoMode") or {}).get("enabled"):
        problems.append("autoMode.enabled must not be set (the Auto Mode node role)")
    for option in ("fargate", "accessEntries", "storageClasses", "instanceRole", "instanceRoles",
                   "createInstanceRole", "creationRoleProvider", "serviceRole", "nodeGroupOptions",
                   "customInstanceRolePolicy", "roleMappings", "userMappings"):
        if _is_set(args.get(option)):
            problems.append(f"{option} must not be set")
    return problems


def _compact_json(value: Any) -> str:
    # JSON.stringify: no spaces, keys in insertion order.
    return json.dumps(value, separators=(",", ":"))


def _drop_none(values: Mapping[str, Any]) -> dict:
    # An `undefined` property is not sent (the Node SDK drops it when serializing).
    return {key: value for key, value in values.items() if value is not None}


def service_role_children(name: str, args: Mapping[str, Any], r: Resolver) -> Iterator[Child]:
    """servicerole.ts ServiceRole(`${name}-eksRole`, {service: "eks.amazonaws.com", ...})."""
    role_name = f"{name}-eksRole"
    yield Child("eksRole", SERVICE_ROLE_TYPE, role_name, None, {}, custom=False)
    assume_role_policy = _compact_json({"Version": "2012-10-17", "Statement": [{
        "Action": ["sts:AssumeRole", "sts:TagSession"], "Effect": "Allow",
        "Principal": {"Service": ["eks.amazonaws.com"]}}]})
    yield Child("eksRole-role", "aws:iam/role:Role", f"{role_name}-role", "eksRole", _drop_none({
        "description": "Allows EKS to manage clusters on your behalf.",
        "assumeRolePolicy": assume_role_policy,
        "tags": args.get("tags"),
    }), reads=("tags",))
    partition = r.partition()
    for policy in CLUSTER_ROLE_POLICIES:
        policy_id = f"arn:aws:iam::aws:policy/{policy}"
        yield Child(f"eksRole-{policy}", "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                    f"{role_name}-{hashlib.sha1(policy_id.encode()).hexdigest()[:8]}", "eksRole", {
                        "policyArn": r.combine(lambda p, policy=policy: f"arn:{p}:iam::aws:policy/{policy}", partition),
                        "role": r.ref("eksRole-role"),
                    })


def _subnet_ids(args: Mapping[str, Any], r: Resolver) -> Any:
    if args.get("subnetIds") is not None:
        return args["subnetIds"]
    return r.combine(lambda public, private: [*(public or []), *(private or [])],
                     args.get("publicSubnetIds"), args.get("privateSubnetIds"))


def _public_access_cidrs(cidrs: Any, public: Any) -> Any:
    if public is False and cidrs:
        raise ValueError("`publicAccessCidrs` can only be set when `endpointPublicAccess` is true")
    return cidrs


def eks_cluster_child(name: str, args: Mapping[str, Any], r: Resolver) -> Child:
    """cluster.ts createCore: `new aws.eks.Cluster(`${name}-eksCluster`, {...})`."""
    kubernetes_network_config = None
    if args.get("kubernetesServiceIpAddressRange") or args.get("ipFamily"):
        kubernetes_network_config = r.combine(
            lambda cidr, family: _drop_none({"serviceIpv4Cidr": cidr if (family or "ipv4") == "ipv4" else None,
                                             "ipFamily": family or "ipv4"}),
            args.get("kubernetesServiceIpAddressRange"), args.get("ipFamily"))
    public_cidrs = args.get("publicAccessCidrs")
    vpc_config = _drop_none({
        "subnetIds": _subnet_ids(args, r),
        "endpointPrivateAccess": args.get("endpointPrivateAccess"),
        "endpointPublicAccess": args.get("endpointPublicAccess"),
        "publicAccessCidrs": (r.combine(_public_access_cidrs, public_cidrs,
                                        True if args.get("endpointPublicAccess") is None else args.get("endpointPublicAccess"))
                              if public_cidrs else None),
    })
    encryption = args.get("encryptionConfigKeyArn")
    inputs = _drop_none({
        "name": args.get("name"),
        "roleArn": r.ref("eksRole-role", "arn"),
        "kubernetesNetworkConfig": kubernetes_network_config,
        "bootstrapSelfManagedAddons": True if args.get("bootstrapSelfManagedAddons") is None else args["bootstrapSelfManagedAddons"],
        "vpcConfig": vpc_config,
        "version": args.get("version"),
        "enabledClusterLogTypes": args.get("enabledClusterLogTypes"),
        "tags": r.combine(lambda tags, cluster_tags: {"Name": f"{name}-eksCluster", **(cluster_tags or {}), **(tags or {})},
                          args.get("tags"), args.get("clusterTags")),
        "encryptionConfig": {"provider": {"keyArn": encryption}, "resources": ["secrets"]} if encryption else None,
        "accessConfig": ({"authenticationMode": args["authenticationMode"], "bootstrapClusterCreatorAdminPermissions": True}
                         if args.get("authenticationMode") else None),
        "upgradePolicy": args.get("upgradePolicy"),
        "deletionProtection": args.get("deletionProtection"),
    })
    reads = tuple(key for key in (
        "name", "kubernetesServiceIpAddressRange", "ipFamily", "subnetIds", "publicSubnetIds", "privateSubnetIds",
        "endpointPrivateAccess", "endpointPublicAccess", "publicAccessCidrs", "version", "enabledClusterLogTypes",
        "tags", "clusterTags", "encryptionConfigKeyArn", "authenticationMode", "upgradePolicy", "deletionProtection",
        "bootstrapSelfManagedAddons") if args.get(key) is not None)
    return Child("eksCluster", "aws:eks/cluster:Cluster", f"{name}-eksCluster", None, inputs,
                 depends_on=("eksRole-role", *(f"eksRole-{p}" for p in CLUSTER_ROLE_POLICIES)),
                 ignore_changes=CLUSTER_IGNORE_CHANGES, reads=reads)


def region_from_arn(arn: str) -> str:
    # utils.ts getRegionFromArn: the fourth field.
    return arn.split(":")[3]


def generate_kubeconfig(cluster_name: str, endpoint: str, region: str, include_profile: bool, ca_data: Optional[str],
                        opts: Optional[Mapping[str, Any]] = None, user: Optional[Mapping[str, Any]] = None) -> dict:
    """cluster.ts generateKubeconfig. ``user``: the credentials to put instead of the
    ``aws eks get-token`` exec plugin (the stand-in's control plane has no IAM authenticator)."""
    token_args = ["--region", region, "eks", "get-token", "--cluster-name", cluster_name, "--output", "json"]
    opts = opts or {}
    if opts.get("roleArn"):
        token_args += ["--role", opts["roleArn"]]
    if include_profile and opts.get("profileName"):
        token_args += ["--profile", opts["profileName"]]
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws", "args": token_args,
                          "env": [{"name": "KUBERNETES_EXEC_INFO",
                                   "value": '{"apiVersion": "client.authentication.k8s.io/v1beta1"}'}]}}
    return {
        "apiVersion": "v1",
        "clusters": [{"cluster": _drop_none({"server": endpoint, "certificate-authority-data": ca_data}), "name": "kubernetes"}],
        "contexts": [{"context": {"cluster": "kubernetes", "user": "aws"}, "name": "aws"}],
        "current-context": "aws",
        "kind": "Config",
        "users": [{"name": "aws", "user": dict(user) if user is not None else exec_user}],
    }


def kubeconfig(args: Mapping[str, Any], r: Resolver, include_profile: bool) -> Any:
    """cluster.ts genKubeconfig(useProfileName) over the eksCluster child's outputs."""
    user = r.kubeconfig_user()
    return r.combine(
        lambda name, endpoint, ca, opts, arn: generate_kubeconfig(name, endpoint, region_from_arn(arn), include_profile,
                                                                  (ca or {}).get("data"), opts, user),
        r.ref("eksCluster", "name"), r.endpoint(), r.ref("eksCluster", "certificateAuthority"),
        args.get("providerCredentialOpts"), r.ref("eksCluster", "arn"))


def kubernetes_provider_child(name: str, args: Mapping[str, Any], r: Resolver, config: Any) -> Child:
    """cluster.ts: `new k8s.Provider(`${name}-eks-k8s`, {kubeconfig: kubeconfig.apply(JSON.stringify),
    enableConfigMapMutable}, {parent})`."""
    return Child("eks-k8s", "pulumi:providers:kubernetes", f"{name}-eks-k8s", None, _drop_none({
        "kubeconfig": r.combine(_compact_json, config),
        "enableConfigMapMutable": args.get("enableConfigMapMutable"),
    }), reads=("providerCredentialOpts",))


def cluster_children(name: str, args: Mapping[str, Any], r: Resolver) -> Iterator[Child]:
    """Every child, in registration order. ``r.ref`` may only name children yielded before."""
    problems = unsupported_options(args)
    if problems:
        raise UnsupportedOptions(problems)
    yield from service_role_children(name, args, r)
    yield eks_cluster_child(name, args, r)
    yield kubernetes_provider_child(name, args, r, kubeconfig(args, r, True))


# What each output of ``cluster_outputs`` is computed from: (children keys, component input keys).
# A consumer of the output depends on those resources (the engine's ``propertyDependencies`` of the
# Construct response: the stand-in's outputs carry them as any ``pulumi.Output`` does; the offline
# plan returns them to the SDK from this table). The engine tests compare both graphs.
OUTPUT_DEPENDENCIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kubeconfig": (("eksCluster",), ("providerCredentialOpts",)),
    "kubeconfigJson": (("eksCluster",), ("providerCredentialOpts",)),
    "eksCluster": (("eksCluster",), ()),
    "core": (("eksCluster", "eks-k8s", "eksRole-role"),
             ("vpcId", "subnetIds", "publicSubnetIds", "privateSubnetIds", "tags", "providerCredentialOpts")),
    "clusterSecurityGroupId": (("eksCluster",), ()),
    "nodeSecurityGroupId": (("eksCluster",), ()),
    "oidcProviderUrl": (("eksCluster",), ()),
    "oidcIssuer": (("eksCluster",), ()),
}


def cluster_outputs(name: str, args: Mapping[str, Any], r: Resolver) -> dict:
    """The state cmd/provider/cluster.ts returns from Construct, as createCluster computes it with
    these options (no security groups, node groups, Fargate profile or OIDC provider)."""
    config = kubeconfig(args, r, False)
    issuer_url = r.combine(
        lambda identities: ((identities or [{}])[0].get("oidcs") or [{}])[0].get("issuer", "") if identities else "",
        r.ref("eksCluster", "identities"))
    cluster_security_group_id = r.combine(lambda vpc: (vpc or {}).get("clusterSecurityGroupId"),
                                          r.ref("eksCluster", "vpcConfig"))
    subnet_ids = _subnet_ids(args, r)
    return {
        "kubeconfig": config,
        "kubeconfigJson": r.combine(_compact_json, config),
        "clusterSecurityGroup": None,
        "instanceRoles": [],
        "nodeSecurityGroup": None,
        "eksClusterIngressRule": None,
        "defaultNodeGroup": None,
        "eksCluster": r.ref("eksCluster"),
        "core": _drop_none({
            "vpcId": args.get("vpcId"),
            "subnetIds": subnet_ids,
            "publicSubnetIds": args.get("publicSubnetIds"),
            "privateSubnetIds": args.get("privateSubnetIds"),
            "cluster": r.ref("eksCluster"),
            "endpoint": r.endpoint(),
            "kubeconfig": config,
            "provider": r.ref("eks-k8s"),
            "instanceRoles": [],
            "tags": args.get("tags"),
            "clusterIamRole": r.ref("eksRole-role"),
            "accessEntries": [],
            "autoModeNodeRoleName": "",
        }),
        "clusterSecurityGroupId": cluster_security_group_id,
        "nodeSecurityGroupId": cluster_security_group_id,
        "clusterIngressRuleId": "",
        "defaultNodeGroupAsgName": "",
        "fargateProfileId": "",
        "fargateProfileStatus": "",
        "oidcProviderArn": "",
        "oidcProviderUrl": issuer_url,
        "oidcIssuer": r.combine(lambda url: (url or "").replace("https://", ""), issuer_url),
        "autoModeNodeRoleName": "",
    }
