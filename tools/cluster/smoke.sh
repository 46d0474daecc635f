#!/usr/bin/env bash
# Throwaway loopback control plane (etcd + kube-apiserver/controller-manager/scheduler from
# .cache/cluster-tools/bin) and a short run of each controller built by build.sh against it, with
# one sample object each. Evidence for tools/cluster/RUNNING.md; not part of the test suite.
#
# Usage: tools/cluster/smoke.sh [kwok karpenter kueue jobset training-operator trainer]
# Everything lives in one temp dir; every process is started here and killed here by PID.
# KEEP=1 leaves the temp dir (logs) behind.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
common="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
bin="${CLUSTER_TOOLS_BIN:-$(dirname "$common")/.cache/cluster-tools/bin}"
[[ -x "$bin/kube-apiserver" ]] || bin="$repo/.cache/cluster-tools/bin"
modcache="$(go env GOMODCACHE)"

# Debian's etcd 3.4.23 lacks what kube-apiserver needs for RequestWatchProgress ("feature is not
# supported by endpoint"), so streaming lists (WatchListClient, on by default in client-go 0.35+)
# end at once and the controllers' informers fall back to LIST after a warning, over and over.
# client-go reads its feature gates from KUBE_FEATURE_<name>.
export KUBE_FEATURE_WatchListClient="${KUBE_FEATURE_WatchListClient:-false}"

work="$(mktemp -d /tmp/cluster-smoke.XXXXXX)"
pids=()
fails=0
made_to_tmp=""
cleanup() {
  local p
  # controllers first, etcd last (reverse start order), each by its PID
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; wait "${pids[i]}" 2>/dev/null || true; done
  if [[ -n "$made_to_tmp" ]]; then rm -rf /tmp/k8s-webhook-server; fi
  [[ "${KEEP:-0}" == 1 ]] && echo "logs kept in $work" || rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # start NAME CMD...: background process logging to $work/NAME.log
  local name=$1; shift
  "$@" >"$work/$name.log" 2>&1 &
  pids+=("$!"); eval "pid_${name//-/_}=$!"
}
k() { kubectl --kubeconfig "$work/admin.kubeconfig" "$@"; }
wait_for() { # wait_for SECONDS DESCRIPTION CMD...
  local t=$1 what=$2; shift 2
  for ((i = 0; i < t; i++)); do "$@" >/dev/null 2>&1 && { echo "  ok: $what"; return 0; }; sleep 1; done
  echo "  FAIL: $what (after ${t}s)"; fails=$((fails + 1)); return 1
}
apply_retry() { # apply_retry SECONDS DESCRIPTION < manifest: retried until the webhooks answer
  local f; f="$(mktemp "$work/manifest.XXXXXX.yaml")"; cat >"$f"
  wait_for "$1" "$2" k apply -f "$f"
}
fatal_lines() { grep -E -i '"level":"(error|fatal|panic)"|^E[0-9]{4}|\bpanic:|level=ERROR|ERROR' "$work/$1.log" | head -"${2:-5}" || true; }
report() { # report NAME: alive? and first error lines
  local name=$1 pid; pid=$(eval echo "\$pid_${name//-/_}")
  if kill -0 "$pid" 2>/dev/null; then echo "  $name: running (pid $pid)"; else echo "  $name: EXITED"; tail -20 "$work/$name.log"; fi
  echo "  $name: error lines (first 5):"; fatal_lines "$name" 5 | cut -c1-400 | sed 's/^/    /'
}

# ---- PKI: cluster CA, apiserver serving cert, admin client cert, service-account key ----------
pki="$work/pki"; mkdir -p "$pki"; cd "$pki"
ossl() { openssl "$@" >/dev/null 2>&1; }
ossl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=smoke-cluster-ca
sign() { # sign NAME SUBJ EXT
  ossl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
  printf '%b' "$3" >"$1.ext"
  ossl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out "$1.crt" -extfile "$1.ext"
}
sign apiserver /CN=kube-apiserver 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth'
sign admin '/O=system:masters/CN=smoke-admin' 'extendedKeyUsage=clientAuth'
ossl genrsa -out sa.key 2048; ossl rsa -in sa.key -pubout -out sa.pub

# Webhook PKI shared by the controllers whose cert rotator (open-policy-agent/cert-controller)
# keeps a pre-seeded Secret when it is valid: the CA must be RSA PKCS#1 and valid for the
# rotator's CAName; the serving cert for <service>.<ns>.svc and for 127.0.0.1 (webhook URLs); both
# must outlive the rotator's 90-day lookahead (defaultLookaheadInterval) or it regenerates them.
openssl genrsa -traditional -out wh-ca.key 2048 2>/dev/null
ossl req -x509 -key wh-ca.key -out wh-ca.crt -days 365 -subj /CN=smoke-webhook-ca \
  -addext 'subjectAltName=DNS:kueue-ca,DNS:training-operator-ca,DNS:jobset-ca,DNS:trainer-ca,DNS:kubeflow-trainer-ca'
ossl req -newkey rsa:2048 -nodes -keyout wh.key -out wh.csr -subj /CN=smoke-webhooks
printf 'subjectAltName=IP:127.0.0.1,DNS:kueue-webhook-service.kueue-system.svc,DNS:training-operator.kubeflow.svc,DNS:jobset-webhook-service.jobset-system.svc,DNS:kubeflow-trainer-controller-manager.kubeflow-system.svc\nextendedKeyUsage=serverAuth\n' >wh.ext
ossl x509 -req -in wh.csr -CA wh-ca.crt -CAkey wh-ca.key -CAcreateserial -days 365 -out wh.crt -extfile wh.ext
cabundle="$(base64 -w0 wh-ca.crt)"
cd "$work"

# ---- control plane ------------------------------------------------------------------------------
etcd_port=$(port); etcd_peer=$(port); api_port=$(port); kcm_port=$(port); sched_port=$(port)
start etcd /usr/bin/etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" --initial-cluster "default=http://127.0.0.1:$etcd_peer" \
  --listen-metrics-urls "" --unsafe-no-fsync
start kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$pki" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/24 \
  --authorization-mode RBAC --allow-privileged=true
cat >"$work/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: smoke
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$pki/admin.crt", client-key: "$pki/admin.key"}
contexts:
- name: smoke
  context: {cluster: smoke, user: admin}
current-context: smoke
EOF
kc="$work/admin.kubeconfig"
echo "control plane in $work (apiserver https://127.0.0.1:$api_port)"
wait_for 90 "kube-apiserver /readyz" k get --raw /readyz || { tail -30 "$work/kube-apiserver.log"; exit 1; }
if [[ ! -x "$bin/kube-controller-manager" || ! -x "$bin/kube-scheduler" ]]; then
  echo "kube-controller-manager/kube-scheduler not built yet: no Job/ReplicaSet controllers, no scheduling"
  k create serviceaccount default -n default >/dev/null
else
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$kc" --bind-address 127.0.0.1 \
  --secure-port "$kcm_port" --leader-elect=false --service-account-private-key-file "$pki/sa.key" \
  --root-ca-file "$pki/ca.crt" --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$kc" --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false
wait_for 60 "default service account" k get serviceaccount default -n default
fi

# webhook_url PORT PATH
wh() { printf 'https://127.0.0.1:%s%s' "$1" "$2"; }
# seed_cert_secret NAMESPACE NAME: the cert-controller Secret, pre-filled with the smoke webhook PKI
seed_cert_secret() {
  k create namespace "$1" --dry-run=client -o yaml | k apply -f - >/dev/null
  k -n "$1" create secret generic "$2" --from-file=ca.crt="$pki/wh-ca.crt" --from-file=ca.key="$pki/wh-ca.key" \
    --from-file=tls.crt="$pki/wh.crt" --from-file=tls.key="$pki/wh.key" >/dev/null
}
# url_webhooks FILE PORT: rewrite a kubebuilder webhook manifest's service clientConfig to URL+caBundle
url_webhooks() {
  python3 - "$1" "$2" "$cabundle" <<'PY'
import sys, yaml
path, port, ca = sys.argv[1], sys.argv[2], sys.argv[3]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
for d in docs:
    for w in d.get("webhooks", []):
        svc = w["clientConfig"].pop("service")
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{svc['path']}", "caBundle": ca}
print(yaml.safe_dump_all(docs))
PY
}

run_kwok() {
  echo "== kwok"
  local d="$modcache/sigs.k8s.io/kwok@v0.8.0"
  cat "$d"/kustomize/stage/node/fast/node-initialize.yaml <(echo ---) \
      "$d"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml <(echo ---) \
      "$d"/kustomize/stage/pod/fast/pod-ready.yaml <(echo ---) "$d"/kustomize/stage/pod/fast/pod-complete.yaml <(echo ---) \
      "$d"/kustomize/stage/pod/fast/pod-delete.yaml >"$work/kwok-stages.yaml"
  start kwok "$bin/kwok" --kubeconfig "$kc" --config "$work/kwok-stages.yaml" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --server-address "127.0.0.1:$(port)" --node-ip 127.0.0.1 --node-lease-duration-seconds 40
  k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: kwok-smoke-0
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "8"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "8"}
EOF
  wait_for 30 "kwok node Ready" bash -c "kubectl --kubeconfig $kc get node kwok-smoke-0 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" || true
  k run smoke-pod --image=registry.invalid/none:0 --restart=Never --overrides='{"spec":{"tolerations":[{"operator":"Exists"}],"nodeSelector":{"type":"kwok"}}}' >/dev/null
  wait_for 40 "pod scheduled by kube-scheduler and Running via kwok" bash -c "kubectl --kubeconfig $kc get pod smoke-pod -o jsonpath='{.status.phase}' | grep -qx Running" || true
  report kwok
}


run_karpenter() {
  echo "== karpenter (kwok provider)"
  local d="$modcache/sigs.k8s.io/karpenter@v1.14.1"
  # NodePool/NodeClaim/NodeOverlay/CapacityBuffer CRDs from the kwok chart of the same release, and
  # the KWOKNodeClass CRD (karpenter.kwok.sh) that the kwok provider's NodePools must reference.
  k apply --server-side -f "$d/kwok/charts/crds/" -f "$d/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml" >/dev/null
  k wait --for condition=Established crd/nodepools.karpenter.sh crd/kwoknodeclasses.karpenter.kwok.sh >/dev/null
  start karpenter env KUBECONFIG="$kc" DISABLE_LEADER_ELECTION=true METRICS_PORT="$(port)" HEALTH_PROBE_PORT="$(port)" \
    LOG_LEVEL=info BATCH_IDLE_DURATION=1s BATCH_MAX_DURATION=3s "$bin/karpenter-kwok"
  k apply -f - >/dev/null <<'EOF'
apiVersion: karpenter.kwok.sh/v1alpha1
kind: KWOKNodeClass
metadata: {name: default}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: smoke}
spec:
  template:
    metadata: {labels: {smoke-pool: "true"}}
    spec:
      nodeClassRef: {group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}
      requirements:
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      - {key: kubernetes.io/os, operator: In, values: [linux]}
      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
      expireAfter: 720h
  limits: {cpu: "100"}
  disruption: {consolidationPolicy: WhenEmpty, consolidateAfter: 30s}
EOF
  # Nothing in the kwok provider sets the KWOKNodeClass status; core Karpenter keeps a NodePool
  # NotReady (NodeClassReadinessUnknown) until the NodeClass reports Ready=True.
  k patch kwoknodeclass default --subresource=status --type=merge -p \
    "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"Ready\",\"message\":\"\",\"lastTransitionTime\":\"$(date -u +%FT%TZ)\",\"observedGeneration\":1}]}}" >/dev/null || echo "  (status patch failed)"
  k run karp-pod --image=registry.invalid/none:0 --restart=Never \
    --overrides='{"spec":{"nodeSelector":{"smoke-pool":"true"},"containers":[{"name":"c","image":"registry.invalid/none:0","resources":{"requests":{"cpu":"2","memory":"1Gi"}}}]}}' >/dev/null
  wait_for 90 "NodeClaim launched for a pending pod" bash -c "kubectl --kubeconfig $kc get nodeclaims -o name | grep -q nodeclaim" || true
  wait_for 90 "Karpenter-created node Ready (kwok) and pod Running" bash -c "kubectl --kubeconfig $kc get pod karp-pod -o jsonpath='{.status.phase}' | grep -qx Running" || true
  k get nodeclaims -o wide 2>&1 | sed 's/^/    /'
  report karpenter
}

run_kueue() {
  echo "== kueue"
  local d="$modcache/sigs.k8s.io/kueue@v0.19.2" whp; whp=$(port)
  seed_cert_secret kueue-system kueue-webhook-server-cert
  mkdir -p "$work/kueue-certs"; cp "$pki/wh.crt" "$work/kueue-certs/tls.crt"; cp "$pki/wh.key" "$work/kueue-certs/tls.key"
  # CRDs from config/components/crd/bases; the five with a v1beta1<->v1beta2 conversion webhook in
  # upstream's kustomization (patches/webhook_in_*.yaml) get it as a loopback URL: the cert rotator
  # refuses to report ready unless it can inject its CA into their spec.conversion.webhook.
  python3 - "$d/config/components/crd/bases" "$whp" "$cabundle" >"$work/kueue-crds.yaml" <<'PY2'
import os, sys, yaml
base, port, ca = sys.argv[1:]
conv = {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}
out = []
for f in sorted(os.listdir(base)):
    crd = yaml.safe_load(open(os.path.join(base, f)))
    if crd["spec"]["names"]["plural"] in conv:
        crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
            "clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": ca},
            "conversionReviewVersions": ["v1"]}}
    out.append(crd)
print(yaml.safe_dump_all(out))
PY2
  k apply --server-side -f "$work/kueue-crds.yaml" >/dev/null
  # Webhook configurations named as the cert rotator expects (kueue-{mutating,validating}-webhook-
  # configuration), URL clientConfig, upstream's namespaceSelector, only the enabled integrations.
  python3 - "$d/config/components/webhook/manifests.yaml" "$whp" "$cabundle" >"$work/kueue-webhooks.yaml" <<'PY2'
import sys, yaml
path, port, ca = sys.argv[1:]
keep = ("job.kb.io", "jobset.kb.io", "pytorchjob.kb.io", "trainjob.kb.io", "clusterqueue.kb.io",
        "resourceflavor.kb.io", "workload.kb.io", "cohort.kb.io", "localqueue.kb.io")
sel = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}]}
docs = [d for d in yaml.safe_load_all(open(path)) if d]
for d in docs:
    d["metadata"]["name"] = "kueue-" + d["metadata"]["name"]
    d["webhooks"] = [w for w in d["webhooks"] if w["name"][1:] in keep]
    for w in d["webhooks"]:
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{w['clientConfig']['service']['path']}", "caBundle": ca}
        if not w["name"][1:].startswith(("clusterqueue", "resourceflavor", "workload", "cohort", "localqueue")):
            w["namespaceSelector"] = sel
print(yaml.safe_dump_all(docs))
PY2
  k apply -f "$work/kueue-webhooks.yaml" >/dev/null
  cat >"$work/kueue-config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:$(port)"}
metrics: {bindAddress: "127.0.0.1:$(port)"}
webhook: {port: $whp, host: 127.0.0.1, certDir: "$work/kueue-certs"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: true, webhookServiceName: kueue-webhook-service, webhookSecretName: kueue-webhook-server-cert}
integrations:
  frameworks: [batch/job, jobset.x-k8s.io/jobset, kubeflow.org/pytorchjob, trainer.kubeflow.org/trainjob]
EOF
  start kueue "$bin/kueue" --kubeconfig "$kc" --config "$work/kueue-config.yaml" --feature-gates VisibilityOnDemand=false --zap-log-level=info
  apply_retry 60 "kueue webhook answers (ResourceFlavor create)" <<'EOF' || true
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
EOF
  k apply -f - >/dev/null <<'EOF'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: "4"}
      - {name: memory, nominalQuota: 16Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: lq, namespace: default}
spec: {clusterQueue: cq}
EOF
  k apply -f - >/dev/null <<'EOF'
apiVersion: batch/v1
kind: Job
metadata: {name: queued, namespace: default, labels: {kueue.x-k8s.io/queue-name: lq}}
spec:
  template:
    spec:
      restartPolicy: Never
      tolerations: [{operator: Exists}]
      containers: [{name: c, image: registry.invalid/none:0, resources: {requests: {cpu: "1", memory: 1Gi}}}]
EOF
  # A Job for a LocalQueue that does not exist is never admitted: spec.suspend=true can only come
  # from Kueue's mutating webhook mjob.kb.io (ApplyDefaultForSuspend), not from a reconcile.
  k create job parked --image=registry.invalid/none:0 --dry-run=client -o json \
    | python3 -c 'import json,sys; j=json.load(sys.stdin); j["metadata"]["labels"]={"kueue.x-k8s.io/queue-name":"no-such-queue"}; print(json.dumps(j))' \
    | k apply -f - >/dev/null
  echo "  Job 'parked' (queue-name: no-such-queue) spec.suspend as stored: $(k get job parked -o jsonpath='{.spec.suspend}')"
  wait_for 30 "ClusterQueue Active" bash -c "kubectl --kubeconfig $kc get clusterqueue cq -o jsonpath='{.status.conditions[?(@.type==\"Active\")].status}' | grep -qx True" || true
  wait_for 60 "Workload for the Job admitted" bash -c "kubectl --kubeconfig $kc get workloads -n default -o jsonpath='{.items[*].status.conditions[?(@.type==\"Admitted\")].status}' | grep -q True" || true
  wait_for 30 "Job unsuspended by kueue and its pod created" bash -c "kubectl --kubeconfig $kc get pods -n default -l batch.kubernetes.io/job-name=queued -o name | grep -q pod" || true
  k get workloads -n default 2>&1 | sed 's/^/    /'
  report kueue
}

run_jobset() {
  echo "== jobset"
  local d="$modcache/sigs.k8s.io/jobset@v0.12.0" whp; whp=$(port)
  mkdir -p "$work/jobset-certs"; cp "$pki/wh.crt" "$work/jobset-certs/tls.crt"; cp "$pki/wh.key" "$work/jobset-certs/tls.key"
  k apply --server-side -f "$d/config/components/crd/bases/" >/dev/null
  url_webhooks "$d/config/components/webhook/manifests.yaml" "$whp" | sed 's/name: mutating-webhook-configuration/name: jobset-mutating-webhook-configuration/; s/name: validating-webhook-configuration/name: jobset-validating-webhook-configuration/' >"$work/jobset-webhooks.yaml"
  k apply -f "$work/jobset-webhooks.yaml" >/dev/null
  cat >"$work/jobset-config.yaml" <<EOF
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {port: $whp, host: 127.0.0.1, certDir: "$work/jobset-certs"}
metrics: {bindAddress: "127.0.0.1:$(port)"}
health: {healthProbeBindAddress: "127.0.0.1:$(port)"}
EOF
  start jobset "$bin/jobset" --kubeconfig "$kc" --config "$work/jobset-config.yaml"
  apply_retry 60 "JobSet accepted by its webhooks" <<'EOF' || true
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js, namespace: default}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 1
        completions: 1
        template:
          spec:
            restartPolicy: Never
            tolerations: [{operator: Exists}]
            containers: [{name: c, image: registry.invalid/none:0}]
EOF
  wait_for 30 "JobSet created its 2 Jobs" bash -c "test \$(kubectl --kubeconfig $kc get jobs -n default -l jobset.sigs.k8s.io/jobset-name=js -o name | wc -l) -eq 2" || true
  report jobset
}

run_training_operator() {
  echo "== training-operator"
  local d="$modcache/github.com/kubeflow/training-operator@v1.9.4" whp; whp=$(port)
  seed_cert_secret kubeflow training-operator-webhook-cert
  # The cert rotator only stat()s this hard-coded path (pkg/cert: certDir); the webhook server
  # itself reads $TMPDIR/k8s-webhook-server/serving-certs.
  if [[ ! -e /tmp/k8s-webhook-server/serving-certs/tls.crt ]]; then
    mkdir -p /tmp/k8s-webhook-server/serving-certs; cp "$pki/wh.crt" /tmp/k8s-webhook-server/serving-certs/tls.crt
    cp "$pki/wh.key" /tmp/k8s-webhook-server/serving-certs/tls.key; made_to_tmp=1
  fi
  mkdir -p "$work/to-tmp/k8s-webhook-server/serving-certs"
  cp "$pki/wh.crt" "$work/to-tmp/k8s-webhook-server/serving-certs/tls.crt"; cp "$pki/wh.key" "$work/to-tmp/k8s-webhook-server/serving-certs/tls.key"
  k apply --server-side -f "$d/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" >/dev/null
  url_webhooks "$d/manifests/base/webhook/manifests.yaml" "$whp" \
    | python3 -c 'import sys,yaml; d=[x for x in yaml.safe_load_all(sys.stdin) if x][0]; d["metadata"]["name"]="validator.training-operator.kubeflow.org"; d["webhooks"]=[w for w in d["webhooks"] if "pytorchjob" in w["name"]]; print(yaml.safe_dump(d))' \
    >"$work/to-webhooks.yaml"
  k apply -f "$work/to-webhooks.yaml" >/dev/null
  start training-operator env TMPDIR="$work/to-tmp" MY_POD_NAMESPACE=kubeflow "$bin/training-operator" --kubeconfig "$kc" \
    --enable-scheme pytorchjob --leader-elect=false --webhook-server-port "$whp" \
    --metrics-bind-address "127.0.0.1:$(port)" --health-probe-bind-address "127.0.0.1:$(port)"
  apply_retry 60 "PyTorchJob accepted by the validating webhook" <<'EOF' || true
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: pt, namespace: default}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          tolerations: [{operator: Exists}]
          containers: [{name: pytorch, image: registry.invalid/none:0}]
    Worker:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          tolerations: [{operator: Exists}]
          containers: [{name: pytorch, image: registry.invalid/none:0}]
EOF
  wait_for 40 "PyTorchJob pods and services created" bash -c "test \$(kubectl --kubeconfig $kc get pods,services -n default -l training.kubeflow.org/job-name=pt -o name | wc -l) -ge 4" || true
  echo "  PyTorchJob conditions: $(k get pytorchjob pt -o jsonpath='{range .status.conditions[*]}{.type}={.status} {end}')"
  echo "  MASTER_ADDR/WORLD_SIZE/RANK on the worker: $(k get pod pt-worker-0 -o jsonpath='{range .spec.containers[0].env[*]}{.name}={.value} {end}' | tr ' ' '\n' | grep -E '^(MASTER_ADDR|WORLD_SIZE|RANK|PET_NNODES)=' | tr '\n' ' ')"
  echo "  rejected as it should be (no pytorch container):"
  { k apply -f - 2>&1 || true; } <<'EOF' | sed 's/^/    /' | cut -c1-300
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: bad, namespace: default}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template: {spec: {containers: [{name: wrong, image: x}]}}
EOF
  report training-operator
}

run_trainer() {
  echo "== trainer (v2)"
  local d="$modcache/github.com/kubeflow/trainer/v2@v2.3.0" whp; whp=$(port)
  k apply --server-side $(printf -- '-f %s ' "$d"/manifests/base/crds/trainer.kubeflow.org_*.yaml) \
    -f "$modcache/sigs.k8s.io/jobset@v0.12.0/config/components/crd/bases/" >/dev/null
  k wait --for condition=Established crd/trainjobs.trainer.kubeflow.org crd/clustertrainingruntimes.trainer.kubeflow.org >/dev/null
  mkdir -p "$work/tr-tmp/k8s-webhook-server/serving-certs"
  cp "$pki/wh.crt" "$work/tr-tmp/k8s-webhook-server/serving-certs/tls.crt"; cp "$pki/wh.key" "$work/tr-tmp/k8s-webhook-server/serving-certs/tls.key"
  url_webhooks "$d/manifests/base/webhook/manifests.yaml" "$whp" | sed 's/name: mutating-webhook-configuration/name: defaulter.trainer.kubeflow.org/; s/name: validating-webhook-configuration/name: validator.trainer.kubeflow.org/' >"$work/trainer-webhooks.yaml"
  k apply -f "$work/trainer-webhooks.yaml" >/dev/null
  cat >"$work/trainer-config.yaml" <<EOF
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
health: {healthProbeBindAddress: "127.0.0.1:$(port)", readinessEndpointName: readyz, livenessEndpointName: healthz}
metrics: {bindAddress: "127.0.0.1:$(port)", secureServing: true}
webhook: {port: $whp, host: 127.0.0.1}
leaderElection: {leaderElect: false}
certManagement: {enable: false}
EOF
  start trainer env TMPDIR="$work/tr-tmp" "$bin/trainer-controller-manager" --kubeconfig "$kc" --config "$work/trainer-config.yaml"
  apply_retry 60 "ClusterTrainingRuntime accepted by the validating webhook" <"$d/manifests/base/runtimes/torch_distributed.yaml" || true
  # When Kueue runs too, its vtrainjob.kb.io webhook refuses TrainJobs ("unsupported runtime") until
  # Kueue has noticed the TrainJob CRD and started that integration (it polls; jobframework/setup.go).
  apply_retry 60 "TrainJob accepted (Trainer's webhooks, and Kueue's when running)" <<'EOF' || true
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: tj, namespace: default}
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {numNodes: 1}
EOF
  wait_for 40 "TrainJob reconciled into a JobSet" k get jobset tj -n default || true
  report trainer
}

for c in "${@:-kwok}"; do "run_${c//-/_}"; done
echo "smoke: $fails check(s) failed"
[[ $fails -eq 0 ]]
