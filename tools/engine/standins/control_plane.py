"""The test control plane the stand-ins point an EKS cluster at: ``$MLP_STANDIN_KUBECONFIG`` names
an admin kubeconfig (``python -m tools.cluster.controlplane up`` prints one); its server and CA
become the ``aws:eks/cluster:Cluster``'s endpoint and certificate authority, its credentials the
kubeconfig pulumi-eks returns, so the real Kubernetes provider and Helm apply there."""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Mapping, Optional

KUBECONFIG_ENV = "MLP_STANDIN_KUBECONFIG"


def control_plane() -> Optional[dict]:
    """Endpoint, CA and admin credentials of the test control plane's kubeconfig, files inlined."""
    path = os.environ.get(KUBECONFIG_ENV)
    if not path:
        return None
    import yaml

    config = yaml.safe_load(Path(path).read_text())
    base = Path(path).parent

    def data(entry: Mapping[str, Any], key: str) -> Optional[str]:
        if entry.get(f"{key}-data"):
            return entry[f"{key}-data"]
        if entry.get(key):
            file = Path(entry[key]) if Path(entry[key]).is_absolute() else base / entry[key]
            return base64.b64encode(file.read_bytes()).decode()
        return None

    context = next(c for c in config["contexts"] if c["name"] == config.get("current-context", c["name"]))["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    user = next(u for u in config["users"] if u["name"] == context["user"])["user"]
    credentials = {key: value for key, value in user.items()
                   if key not in ("client-certificate", "client-key", "client-certificate-data", "client-key-data")}
    for key in ("client-certificate", "client-key"):
        value = data(user, key)
        if value:
            credentials[f"{key}-data"] = value
    return {"server": cluster["server"], "ca": data(cluster, "certificate-authority"), "user": credentials}
