"""`python -m workloads list | describe | logs | cancel` through the production transport: a fake
`kubectl` on PATH (tests/jobs/fake_kubectl.py) serves the fake API's state, so the argv that
jobs.kube.KubectlApi builds is what gets parsed."""
from __future__ import annotations

import pytest

from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs import fake_kubectl
from tests.jobs.conftest import MULTINODE, operator_pods, raw_spec, set_conditions, use_fake_kubectl
from jobs.__main__ import main

NS = "team-research"


@pytest.fixture
def cluster(kube, dev_facts, tmp_path, monkeypatch):
    """A kubeconfig, the fake kubectl first on PATH, and a state file it reads and writes."""
    state = use_fake_kubectl(tmp_path, monkeypatch)
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    jobs.submit(raw_spec(MULTINODE))
    job = kube.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS)
    set_conditions(kube, job, "Created", "Running")
    operator_pods(kube, job, logs=lambda name: [f"{name}: step {i}" for i in (1, 2)])
    kube.save(state)
    return state


def test_list_describe_logs_through_kubectl(cluster, capsys):
    assert main(["list", "--team", "research"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "TEAM", "KIND", "PHASE", "NODES", "x", "GPUS", "POOL", "CREATED"]
    assert out[1].split()[:5] == ["gpt2-ddp-a10g", "research", "PyTorchJob", "Running", "2"]

    assert main(["describe", "gpt2-ddp-a10g", "--team", "research"]) == 0
    text = capsys.readouterr().out
    assert "PyTorchJob team-research/gpt2-ddp-a10g: Running" in text
    assert "rank 0  gpt2-ddp-a10g-master-0  Running" in text and "rank 1  gpt2-ddp-a10g-worker-0  Running" in text
    assert "no Kueue Workload yet" in text

    assert main(["logs", "gpt2-ddp-a10g", "--team", "research", "--rank", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["gpt2-ddp-a10g-worker-0: step 1", "gpt2-ddp-a10g-worker-0: step 2"]
    assert main(["logs", "gpt2-ddp-a10g", "--team", "research", "--all"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == sorted(
        [f"[rank 0 #1] gpt2-ddp-a10g-master-0: step {i}" for i in (1, 2)]
        + [f"[rank 1 #1] gpt2-ddp-a10g-worker-0: step {i}" for i in (1, 2)])
    assert main(["logs", "gpt2-ddp-a10g", "--team", "research", "--worker", "0"]) == 0  # the old flag: worker 0 = rank 1
    assert capsys.readouterr().out.splitlines()[0] == "gpt2-ddp-a10g-worker-0: step 1"


def test_cancel_through_kubectl_deletes_in_the_foreground(cluster, capsys):
    from tests.jobs.fake_kube import FakeKubeApi

    assert main(["cancel", "gpt2-ddp-a10g", "--team", "research"]) == 0
    assert "SIGTERM" in capsys.readouterr().out
    state = FakeKubeApi.load(cluster)
    assert ["delete", "pytorchjobs.kubeflow.org", NS, "gpt2-ddp-a10g", "Foreground"] in [list(r) for r in state.requests]
    assert state.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS)["metadata"]["deletionTimestamp"]
    assert len(state.graceful_deletions) == 2


def test_a_missing_job_is_one_line_and_exit_6(cluster, capsys):
    assert main(["describe", "nope", "--team", "research"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no job 'nope' in namespace team-research" in err


COMMANDS = [["list"], ["describe", "j", "--team", "research"], ["logs", "j", "--team", "research", "-f"],
            ["cancel", "j", "--team", "research"], ["status", "j", "--team", "research"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_without_kubectl_or_kubeconfig_each_command_says_so_in_one_line(argv, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: kubectl is not installed")
    fake_kubectl.install(empty)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(argv) == 4
    err = capsys.readouterr().err
    # The team's way in (aws eks update-kubeconfig --role-arn), never the platform's admin kubeconfig.
    assert err.count("\n") == 1 and err.startswith("error: no kubeconfig") and "aws eks update-kubeconfig" in err
    assert "pulumi stack output kubeconfig" not in err


@pytest.mark.parametrize("argv", COMMANDS[:4], ids=lambda a: a[0])
def test_an_unreachable_cluster_is_one_line_never_kubectls_output(argv, cluster, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_KUBE_UNREACHABLE", "1")
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not reachable" in err and "memcache.go" not in err


def test_the_cli_exit_codes_are_the_one_table():
    import jobs.cli
    from jobs import exit_codes

    assert (jobs.cli.EXIT_SPEC, jobs.cli.EXIT_NO_CLUSTER, jobs.cli.EXIT_NOT_FOUND, jobs.cli.EXIT_EXISTS) == (
        exit_codes.BAD_INPUT, exit_codes.NO_CLUSTER, exit_codes.NOT_FOUND, exit_codes.EXISTS)
    # One definition: the entry point keeps no table of its own.
    import jobs.__main__ as entry

    assert not [name for name in vars(entry) if name.startswith("EXIT_")]


def test_submit_applies_through_the_client_transport(cluster, dev_facts, tmp_path, capsys):
    """`submit` (no --dry-run/--local) server-side applies through jobs.kube.KubectlApi: the fake
    kubectl accepts only `apply --server-side --field-manager=... -f - -o json`, and the fake API
    validates the PyTorchJob against the pinned CRD."""
    import json

    from tests.jobs.conftest import SMOKE
    from tests.jobs.fake_kube import FakeKubeApi

    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(dev_facts.to_dict()))
    assert main(["submit", str(SMOKE), "--stack", "dev", "--facts", str(facts_file)]) == 0
    assert "submitted PyTorchJob team-research/smoke-l4" in capsys.readouterr().out
    assert FakeKubeApi.load(cluster).find("pytorchjobs.kubeflow.org", "smoke-l4", NS)["spec"]["nprocPerNode"] == "1"


def test_client_constants_match_the_renderer():
    import jobs.records as client
    from workloads import trainingjob, trainjob_runtime

    assert client.PYTORCH_CONTAINER == trainingjob.CONTAINER_NAME
    assert client.TRAINJOB_CONTAINER == client.TRAINJOB_REPLICATED_JOB == trainjob_runtime.CONTAINER


def test_list_sweep_shows_each_point_with_its_values(kube, dev_facts, tmp_path, monkeypatch, capsys):
    """`list --sweep NAME` through the fake kubectl: the jobs `submit --sweep` labels, with the
    swept values from their point annotation, finished points included."""
    import copy
    import json

    from jobs.sweep import POINT_ANNOTATION, SWEEP_LABEL

    use_fake_kubectl(tmp_path, monkeypatch)
    JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore()).submit(raw_spec(MULTINODE))
    base = kube.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS)
    for index, lr in enumerate(("1e-4", "3e-4")):
        point = copy.deepcopy(base)
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            point["metadata"].pop(key, None)
        point["metadata"]["name"] = f"lr-sweep-{index}"
        point["metadata"]["labels"][SWEEP_LABEL] = "lr-sweep"
        point["metadata"].setdefault("annotations", {})[POINT_ANNOTATION] = json.dumps({"optimizer.lr": lr})
        kube.apply(point)
    set_conditions(kube, kube.find("pytorchjobs.kubeflow.org", "lr-sweep-0", NS), "Created", "Running", "Succeeded")
    kube.save(tmp_path / "state.json")

    assert main(["list", "--team", "research", "--sweep", "lr-sweep"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["sweep", "lr-sweep:", "2", "job(s)"]
    assert rows[1][:3] == ["job", "phase", "optimizer.lr"]
    assert sorted(r[:3] for r in rows[2:-1]) == [
        ["lr-sweep-0", "Succeeded", "1e-4"], ["lr-sweep-1", "Pending", "3e-4"]]
    assert rows[-1][0] == "results:"  # no MLflow here: test_sweep_results.py has the results


def test_status_is_describe_through_the_client(cluster, capsys):
    """Design review 4 §6.1: `status` shelled out to kubectl (`get ... -o wide`, raw output) beside
    the client's `describe`; now it is the same command, through JobClient."""
    assert main(["status", "gpt2-ddp-a10g", "--team", "research"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PyTorchJob team-research/gpt2-ddp-a10g: Running") and "$ kubectl" not in out
    assert "rank 1  gpt2-ddp-a10g-worker-0  Running" in out
