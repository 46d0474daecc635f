"""The GPU node readiness agent's checks, on nvidia-smi / dcgmi outputs (one per failure class),
and what it does to the node for each outcome."""
from __future__ import annotations

import ast
import datetime as dt
import os
import sys
from pathlib import Path

import pytest

from workloads import node_health_agent as agent

DATA = Path(__file__).parent / "data" / "node_health"
NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.timezone.utc)


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def fake_efa(root: Path, count: int, *, other: int = 0) -> str:
    """/sys/class/infiniband as the kernel lays it out: each device's ``device/driver`` links to its driver."""
    for driver, n in (("efa", count), ("mlx5_core", other)):
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            device = root / "class" / "infiniband" / f"{driver[:5]}{i}" / "device"
            device.mkdir(parents=True)
            os.symlink(drivers, device / "driver")
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    return str(root / "class" / "infiniband")


def runner(smi: str, diag: str, diag_code: int = 0):
    calls = []

    def run(argv, timeout_s):
        calls.append(list(argv))
        if argv[0] == "nvidia-smi":
            return 0, fixture(smi)
        if argv[0] == "dcgmi":
            return diag_code, fixture(diag)
        raise AssertionError(argv)

    run.calls = calls
    return run


def _imports(path) -> set[str]:
    tree = ast.parse(Path(path).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return modules | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}


def test_the_agent_is_stdlib_only_but_for_the_shared_fault_format():
    # It runs in the DCGM image with a bare python3: the standard library, plus the trainer's
    # GPU-fault format (one definition for writer and reader), itself standard library only.
    from trainer import gpu_faults

    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert {m for m in _imports(agent.__file__) if m.split(".")[0] not in stdlib} == {"trainer.gpu_faults"}
    assert {m.split(".")[0] for m in _imports(gpu_faults.__file__)} <= stdlib


def test_the_agent_runs_from_its_configmap_alone(tmp_path):
    """The DaemonSet mounts the ConfigMap's keys at their item paths and runs ``python3
    node_health_agent.py``: laid out the same way, outside the repository, with no site-packages
    and no PYTHONPATH (-S -E), the agent starts and the shared module finds the Xid table."""
    import subprocess

    from workloads import node_health

    data = node_health.config_map()["data"]
    for item in node_health.config_map_items():
        target = tmp_path / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]])
    assert set(data) == {item["key"] for item in node_health.config_map_items()}
    run = subprocess.run([sys.executable, "-S", "-E", str(tmp_path / node_health.AGENT_FILE), "--help"],
                         cwd="/", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "--xid-table" in run.stdout, run.stderr
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import trainer.gpu_faults as g; "
             "print(g.__file__, sorted(g.node_fault_xids()))")
    run = subprocess.run([sys.executable, "-S", "-E", "-c", probe, str(tmp_path)], cwd="/", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(str(tmp_path / "trainer" / "gpu_faults.py")) and "79" in run.stdout, run.stdout


def test_healthy_node_passes_every_check(tmp_path):
    run = runner("nvidia-smi-q.healthy.txt", "dcgmi-diag-r1.pass.txt")
    infiniband = fake_efa(tmp_path, 32, other=0)
    assert agent.run_checks(expected_gpus=8, expected_efa=32, diag_level=1, run=run, sys_class_infiniband=infiniband) == []
    assert ["dcgmi", "diag", "-r", "1"] in run.calls and ["nvidia-smi", "-q"] in run.calls


@pytest.mark.parametrize("smi, kind, detail", [
    ("nvidia-smi-q.gpu-count.txt", agent.GPU_COUNT, "expected 8 GPUs, nvidia-smi reports 7"),
    ("nvidia-smi-q.ecc-uncorrectable.txt", agent.ECC_UNCORRECTABLE, "GPU 00000000:86:00.0: 2 volatile uncorrectable"),
    ("nvidia-smi-q.ecc-disabled.txt", agent.ECC_DISABLED, "GPU 00000000:86:00.0: ECC mode is Disabled"),
    ("nvidia-smi-q.row-remap-pending.txt", agent.ROW_REMAP_PENDING, "GPU 00000000:86:00.0: a row remap is pending"),
    ("nvidia-smi-q.row-remap-failure.txt", agent.ROW_REMAP_FAILURE, "GPU 00000000:86:00.0: row remapping failed"),
])
def test_each_nvidia_smi_failure_class(smi, kind, detail):
    failures = agent.check_gpus(fixture(smi), 8)
    assert [f.kind for f in failures] == [kind]
    assert failures[0].detail.startswith(detail)


def test_recorded_g5_a10g_report_is_healthy():
    """A real ``nvidia-smi -q`` of a g5 (A10G, driver 535) from NVIDIA/DCGM issue 232: one aggregate
    (lifetime) correctable DRAM error and a running process are no reason to refuse the node."""
    report = agent.parse_nvidia_smi_q(fixture("nvidia-smi-q.a10g-recorded.txt"))
    assert report.attached == 1 and list(report.gpus) == ["00000000:00:1E.0"]
    assert report.gpus["00000000:00:1E.0"]["ECC Errors"]["Aggregate"]["DRAM Correctable"] == "1"
    assert agent.check_gpus(fixture("nvidia-smi-q.a10g-recorded.txt"), 1) == []
    assert [f.kind for f in agent.check_gpus(fixture("nvidia-smi-q.a10g-recorded.txt"), 4)] == [agent.GPU_COUNT]


def test_legacy_double_bit_layout_counts_as_uncorrectable():
    failures = agent.check_gpus(fixture("nvidia-smi-q.legacy-layout-dbe.txt"), 1)
    assert failures == [agent.Failure(agent.ECC_UNCORRECTABLE, "GPU 00000000:00:1E.0: 1 volatile uncorrectable ECC errors")]


def test_dcgmi_diag_failure_names_the_test_and_its_warning():
    # 8 x H100 with the fabric manager down (NVIDIA/nccl-tests#264): CUDA cannot initialise.
    failures = agent.check_dcgmi_diag(fixture("dcgmi-diag-r3.fail-cuda-init.txt"), 226, 3)
    assert [f.kind for f in failures] == [agent.DCGM_DIAG]
    assert "GPU Memory: Fail - All" in failures[0].detail and "Unable to initiali" in failures[0].detail
    assert "Persistence" not in failures[0].detail  # an Info row under a passing test is not a failure


@pytest.mark.parametrize("name", ["dcgmi-diag-r1.pass.txt", "dcgmi-diag-r2-verbose.pass.txt"])
def test_dcgmi_diag_pass_with_and_without_info_rows(name):
    assert agent.check_dcgmi_diag(fixture(name), 0, 1) == []
    rows = dict(agent.parse_dcgmi_diag(fixture("dcgmi-diag-r2-verbose.pass.txt")))
    assert rows["PCIe"].startswith("Pass - All; GPU 0 GPU to Host bandwidth:  13.13 GB/s, GPU 0 Host to GPU bandwidth")
    assert rows["GPU Memory"] == "Pass - All; GPU 0 Allocated 16435239282 bytes (97.1%)"
    assert rows["DCGM Version"] == "3.3.9" and rows["Inforom"] == "Pass"


def test_dcgmi_without_a_hostengine_is_a_tool_error_not_a_hardware_failure():
    failures = agent.check_dcgmi_diag(fixture("dcgmi-diag.no-hostengine.txt"), 255, 1)
    assert [f.kind for f in failures] == [agent.TOOL_ERROR]
    assert not agent.hardware_failed(failures)
    # A clean table with a non-zero exit still fails: dcgmi said something was wrong.
    assert [f.kind for f in agent.check_dcgmi_diag(fixture("dcgmi-diag-r1.pass.txt"), 226, 1)] == [agent.DCGM_DIAG]


def test_efa_count_reads_only_efa_driven_devices(tmp_path):
    infiniband = fake_efa(tmp_path, 31, other=2)
    assert agent.count_efa_devices(infiniband) == 31
    failures = agent.run_checks(expected_gpus=8, expected_efa=32, diag_level=1,
                                run=runner("nvidia-smi-q.healthy.txt", "dcgmi-diag-r1.pass.txt"), sys_class_infiniband=infiniband)
    assert failures == [agent.Failure(agent.EFA_COUNT, "expected 32 EFA devices, /sys/class/infiniband has 31")]
    assert agent.count_efa_devices(str(tmp_path / "absent")) == 0


def test_a_non_efa_pool_does_not_count_efa(tmp_path):
    failures = agent.run_checks(expected_gpus=8, expected_efa=0, diag_level=1,
                                run=runner("nvidia-smi-q.healthy.txt", "dcgmi-diag-r1.pass.txt"),
                                sys_class_infiniband=str(tmp_path / "absent"))
    assert failures == []


def test_several_failures_are_all_reported(tmp_path):
    failures = agent.run_checks(expected_gpus=8, expected_efa=32, diag_level=2,
                                run=runner("nvidia-smi-q.row-remap-pending.txt", "dcgmi-diag-r3.fail-cuda-init.txt", 226),
                                sys_class_infiniband=fake_efa(tmp_path, 30))
    assert {f.kind for f in failures} == {agent.ROW_REMAP_PENDING, agent.DCGM_DIAG, agent.EFA_COUNT}
    assert agent.failure_label_value(failures) == "dcgm-diag.efa-count.row-remap-pending"


# ---------------------------------------------------------------- what happens to the node

class FakeApi:
    """Records the agent's requests; the node is a dict the patches are applied to."""

    def __init__(self, node):
        self.node_obj = node
        self.requests = []

    def node(self, name):
        return self.node_obj

    def patch_node(self, name, patch, *, json_patch=False):
        self.requests.append(("patch_node", patch, json_patch))
        if json_patch:
            for op in patch:
                if op["op"] == "test":
                    assert self.node_obj["spec"]["taints"] == op["value"]
                else:
                    self.node_obj["spec"]["taints"] = op["value"]
        else:
            labels = self.node_obj["metadata"].setdefault("labels", {})
            for key, value in patch.get("metadata", {}).get("labels", {}).items():
                labels.pop(key, None) if value is None else labels.__setitem__(key, value)
            self.node_obj["spec"].update(patch.get("spec", {}))

    def patch_node_status(self, name, patch):
        self.requests.append(("patch_node_status", patch, False))

    def create_event(self, event):
        self.requests.append(("create_event", event, False))


def new_node():
    return {"metadata": {"name": "ip-10-0-1-2", "uid": "u-1", "labels": {agent.INSTANCE_TYPE_LABEL: "p5.48xlarge", agent.EFA_LABEL: "true"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}, dict(agent.READINESS_TAINT)]}}


def test_pass_lifts_only_the_readiness_taint_and_reports_healthy():
    api = FakeApi(new_node())
    agent.report(api, "ip-10-0-1-2", [], 1)
    assert api.node_obj["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert "unschedulable" not in api.node_obj["spec"]
    status = [p for kind, p, _ in api.requests if kind == "patch_node_status"]
    assert status[0]["status"]["conditions"][0]["type"] == "AcceleratedHardwareReady"
    assert status[0]["status"]["conditions"][0]["status"] == "True"
    assert not [r for r in api.requests if r[0] == "create_event"]


def test_hardware_failure_cordons_labels_keeps_the_taint_and_marks_the_node_for_repair(capsys):
    api = FakeApi(new_node())
    failures = agent.check_gpus(fixture("nvidia-smi-q.ecc-uncorrectable.txt"), 8)
    agent.report(api, "ip-10-0-1-2", failures, 1)
    node = api.node_obj
    assert node["spec"]["unschedulable"] is True
    assert agent.READINESS_TAINT in node["spec"]["taints"]
    assert node["metadata"]["labels"][agent.FAILURE_LABEL] == "ecc-uncorrectable"
    condition = next(p for kind, p, _ in api.requests if kind == "patch_node_status")["status"]["conditions"][0]
    assert (condition["type"], condition["status"]) == ("AcceleratedHardwareReady", "False")
    event = next(p for kind, p, _ in api.requests if kind == "create_event")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "ip-10-0-1-2", "uid": "u-1"}
    assert event["type"] == "Warning" and "2 volatile uncorrectable" in event["message"]
    line = capsys.readouterr().out
    assert '"result": "fail"' in line and "ecc-uncorrectable" in line


def test_tool_error_cordons_but_never_asks_karpenter_to_replace_the_node():
    api = FakeApi(new_node())
    agent.report(api, "ip-10-0-1-2", agent.check_dcgmi_diag(fixture("dcgmi-diag.no-hostengine.txt"), 255, 1), 1)
    assert api.node_obj["spec"]["unschedulable"] is True
    assert api.node_obj["metadata"]["labels"][agent.FAILURE_LABEL] == "tool-error"
    assert not [r for r in api.requests if r[0] == "patch_node_status"]


def test_taint_patch_is_guarded_and_idempotent():
    node = new_node()
    patch = agent.taint_patch(node, present=False)
    assert patch[0] == {"op": "test", "path": "/spec/taints", "value": node["spec"]["taints"]}
    assert patch[1]["value"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert agent.taint_patch(node, present=True) is None
    bare = {"metadata": {"name": "n"}, "spec": {}}
    assert agent.taint_patch(bare, present=False) is None
    assert agent.taint_patch(bare, present=True) == [{"op": "add", "path": "/spec/taints", "value": [agent.READINESS_TAINT]}]


def test_expectations_come_from_the_instance_table():
    instances = {"p5.48xlarge": {"gpus": 8, "efa_devices": 32}}
    assert agent.expectations(new_node(), instances) == (8, 32)
    node = new_node()
    node["metadata"]["labels"].pop(agent.EFA_LABEL)
    assert agent.expectations(node, instances) == (8, 0)
    with pytest.raises(SystemExit, match="'p5.48xlarge' .* not in the agent's table"):
        agent.expectations(new_node(), {})


def test_deep_check_taints_first_and_backs_off_when_a_job_holds_a_gpu(tmp_path):
    node = new_node()
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]  # in service
    api = FakeApi(node)
    order = []

    def busy(argv, timeout_s):
        order.append((argv[0], list(api.node_obj["spec"]["taints"])))
        return (0, "4242\n") if "--query-compute-apps=pid" in argv else (0, "")

    assert agent.deep_check(api, "ip-10-0-1-2", 8, 0, run=busy, sys_class_infiniband=str(tmp_path)) is False
    # The idle check saw the readiness taint already in place; afterwards it is gone again.
    assert agent.READINESS_TAINT in order[0][1]
    assert api.node_obj["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert not [r for r in api.requests if r[0] == "patch_node_status"]


def test_deep_check_on_idle_gpus_runs_level_2_and_reports(tmp_path):
    node = new_node()
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    api = FakeApi(node)
    inner = runner("nvidia-smi-q.healthy.txt", "dcgmi-diag-r2-verbose.pass.txt")

    def idle(argv, timeout_s):
        return (0, "") if "--query-compute-apps=pid" in argv else inner(argv, timeout_s)

    assert agent.deep_check(api, "ip-10-0-1-2", 8, 0, run=idle, sys_class_infiniband=str(tmp_path)) is True
    assert ["dcgmi", "diag", "-r", "2"] in inner.calls
    assert api.node_obj["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]


def test_deep_check_waits_for_idle_gpus():
    assert agent.gpus_busy(lambda argv, t: (0, "12345\n")) is True
    assert agent.gpus_busy(lambda argv, t: (0, "")) is False
    assert agent.gpus_busy(lambda argv, t: (9, "")) is True  # unknown: assume busy


# ---------------------------------------------------------------- on the wire (a fake API server on loopback)

class ApiServer:
    """A loopback HTTP server standing in for the Kubernetes API: serves one Node, applies JSON
    patches to its taints (honouring ``test``, 422 otherwise, as the API server does) and records
    every request with its content type and bearer token."""

    def __init__(self, node):
        import http.server
        import json
        import threading

        self.node, self.requests = node, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                server.requests.append(("GET", self.path, None, None, self.headers["Authorization"]))
                self._reply(200, server.node)

            def _body(self):
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def do_PATCH(self):
                body = self._body()
                server.requests.append(("PATCH", self.path, self.headers["Content-Type"], body, self.headers["Authorization"]))
                if self.headers["Content-Type"] == "application/json-patch+json":
                    for op in body:
                        if op["op"] == "test" and server.node["spec"].get("taints") != op["value"]:
                            return self._reply(422, {"kind": "Status", "reason": "Invalid"})
                        if op["op"] == "add":
                            server.node["spec"]["taints"] = op["value"]
                self._reply(200, server.node)

            def do_POST(self):
                server.requests.append(("POST", self.path, self.headers["Content-Type"], self._body(), self.headers["Authorization"]))
                self._reply(201, {})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api_server():
    server = ApiServer(new_node())
    yield server
    server.close()


def test_startup_pass_on_the_wire(api_server, tmp_path):
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    api = agent.KubeApi(base_url=api_server.url, token_path=str(token))
    counts = agent.startup(api, "ip-10-0-1-2", {"p5.48xlarge": {"gpus": 8, "efa_devices": 32}},
                           run=runner("nvidia-smi-q.healthy.txt", "dcgmi-diag-r1.pass.txt"),
                           sys_class_infiniband=fake_efa(tmp_path, 32))
    assert counts == (8, 32)
    assert api_server.node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    writes = [(m, p, ct) for m, p, ct, _, _ in api_server.requests if m != "GET"]
    assert writes == [("PATCH", "/api/v1/nodes/ip-10-0-1-2", "application/json-patch+json"),
                      ("PATCH", "/api/v1/nodes/ip-10-0-1-2/status", "application/strategic-merge-patch+json")]
    assert {auth for *_, auth in api_server.requests} == {"Bearer sa-token"}


def test_startup_failure_on_the_wire(api_server, tmp_path):
    token = tmp_path / "token"
    token.write_text("sa-token")
    api = agent.KubeApi(base_url=api_server.url, token_path=str(token))
    agent.startup(api, "ip-10-0-1-2", {"p5.48xlarge": {"gpus": 8, "efa_devices": 32}},
                  run=runner("nvidia-smi-q.gpu-count.txt", "dcgmi-diag-r1.pass.txt"), sys_class_infiniband=fake_efa(tmp_path, 32))
    writes = {(m, p, ct): body for m, p, ct, body, _ in api_server.requests if m != "GET"}
    cordon = writes[("PATCH", "/api/v1/nodes/ip-10-0-1-2", "application/merge-patch+json")]
    assert cordon == {"metadata": {"labels": {agent.FAILURE_LABEL: "gpu-count"}}, "spec": {"unschedulable": True}}
    status = writes[("PATCH", "/api/v1/nodes/ip-10-0-1-2/status", "application/strategic-merge-patch+json")]
    assert status["status"]["conditions"][0]["status"] == "False"
    event = writes[("POST", "/api/v1/namespaces/default/events", "application/json")]
    assert event["reason"] == "GpuReadinessFailed" and "expected 8 GPUs" in event["message"]
    assert agent.READINESS_TAINT in api_server.node["spec"]["taints"]  # never lifted


def test_a_concurrent_taint_change_is_retried_not_overwritten(api_server, tmp_path):
    """Someone adds a taint between the agent's read and its patch: the guarded patch gets 422,
    the agent re-reads and the other taint survives."""
    token = tmp_path / "token"
    token.write_text("t")
    api = agent.KubeApi(base_url=api_server.url, token_path=str(token))
    original_node = api.node
    calls = {"n": 0}

    def racing_node(name):
        node = original_node(name)
        calls["n"] += 1
        if calls["n"] == 1:  # after the agent read, another controller adds a taint
            api_server.node["spec"]["taints"] = api_server.node["spec"]["taints"] + [{"key": "other", "effect": "NoSchedule"}]
        return node

    api.node = racing_node
    agent.set_taint(api, "ip-10-0-1-2", present=False)
    assert api_server.node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}, {"key": "other", "effect": "NoSchedule"}]
    assert [ct for m, _, ct, _, _ in api_server.requests if m == "PATCH"] == ["application/json-patch+json"] * 2
