"""A sweep as one bill and one queue (`submit --sweep`: cost, GPU-hours, the team's Kueue quota),
and `cancel --sweep NAME`: every active point in one command.

Review jobs-ops-4 §2 and top-10 #7: "no $ or GPU-hour total, no quota fit, `cancel` one by one"."""
from __future__ import annotations

import json
import re

import pytest

from jobs.__main__ import main
from jobs.client import JobClient
from jobs.store import LocalStore
from jobs.sweep import SWEEP_LABEL, expand, parse_sweeps, render_sweep
from tests.jobs.conftest import ROOT, SMOKE, raw_spec, use_fake_kubectl
from tests.jobs.fake_kube import FakeKubeApi

NS = "team-research"


@pytest.fixture
def facts_file(dev_facts, tmp_path):
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(dev_facts.to_dict()))
    return str(path)


def dollars(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


def test_the_sweep_total_is_the_sum_of_its_points_and_says_it_will_queue(facts_file, dev_facts, capsys):
    """Dev: team research holds 2 nominal GPUs on the l4 pool and may borrow (the cohort holds 4).
    Three 1-GPU points: 2 run on the team's quota, the third waits unless the cohort's GPUs idle.
    Old code: each point said "OK on g6.xlarge, ~0.0 h"; no total, no quota line."""
    assert main(["submit", str(SMOKE), "--stack", "dev", "--dry-run", "--facts", facts_file,
                 "--sweep", "optimizer.lr=1e-4,3e-4,1e-3"]) == 0
    err = capsys.readouterr().err
    points = re.findall(r"smoke-l4-\d \(optimizer\.lr=[^)]*\): OK on g6\.xlarge, ~[\d.]+ h, on-demand (\$[\d,.]+), "
                        r"spot ~(\$[\d,.]+)", err)
    assert len(points) == 3, err
    total = re.search(r"sweep total    3 job\(s\) x 1 GPU\(s\) = 3 GPUs at once; ([\d,.]+) GPU-hours; "
                      r"on-demand (\$[\d,.]+), spot ~(\$[\d,.]+)", err)
    assert total, err
    assert dollars(total.group(2)) == pytest.approx(sum(dollars(p[0]) for p in points), abs=0.011)
    assert dollars(total.group(3)) == pytest.approx(sum(dollars(p[1]) for p in points), abs=0.011)
    assert float(total.group(1)) > 0
    assert ("sweep quota    team research has 2 nominal GPUs on pool l4 (may borrow up to the cohort's 4): the sweep "
            "will queue. 2 run at once on the team's quota, the other 1 wait in Kueue until GPUs free up "
            "(up to 3 at once while the cohort's GPUs are idle)") in err


def test_a_sweep_within_the_quota_runs_at_once(facts_file, capsys):
    assert main(["submit", str(SMOKE), "--stack", "dev", "--dry-run", "--facts", facts_file,
                 "--sweep", "optimizer.lr=1e-4,3e-4"]) == 0
    assert "(may borrow up to the cohort's 4): all 2 run at once" in capsys.readouterr().err


@pytest.fixture
def sweep_running(kube, dev_facts, tmp_path, monkeypatch):
    """Sweep `lr` (3 points, created as `submit --sweep` creates them) and one job outside it."""
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    spec = jobs.load(raw_spec())
    points = expand(spec, parse_sweeps(["optimizer.lr=1e-4,3e-4,1e-3"], spec, repo_root=str(ROOT)), name="lr")
    jobs.create_jobs(render_sweep(points, dev_facts, sweep="lr"))
    jobs.submit(raw_spec())  # smoke-l4: not in the sweep
    kube.save(state)
    return state


def test_cancel_sweep_cancels_every_point_and_nothing_else(sweep_running, capsys):
    """Old code: `cancel --sweep` did not exist (argparse: the job name is required, exit 2)."""
    assert main(["cancel", "--sweep", "lr", "--team", "research"]) == 0
    out = capsys.readouterr().out
    assert "sweep lr: 3 job(s) cancelled (list --all keeps them as Cancelled)" in out
    kube = FakeKubeApi.load(sweep_running)
    deleted = sorted(r[3] for r in kube.requests if r[0] == "delete")
    assert deleted == ["lr-0", "lr-1", "lr-2"]
    assert kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)["metadata"].get("deletionTimestamp") is None
    records = kube.list("configmaps", NS, f"{SWEEP_LABEL}=lr")
    assert len(records) == 3  # the sweep label travels into the history records


def test_cancel_sweep_of_an_unknown_sweep_is_one_line_exit_6(sweep_running, capsys):
    assert main(["cancel", "--sweep", "lr-typo", "--team", "research"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep 'lr-typo' of team research has no active job" in err


def test_cancel_needs_a_name_or_a_sweep(sweep_running, capsys):
    assert main(["cancel", "--team", "research"]) == 2
    assert "a job name or --sweep NAME" in capsys.readouterr().err


def test_a_sweep_is_a_client_method_all_or_nothing(kube, dev_facts, capsys):
    """`submit --sweep` is `JobClient.submit_sweep`: every point preflighted, then created together;
    a point that does not preflight creates nothing (the CLI is a thin layer over the client)."""
    from jobs.client import SweepRefused

    kube.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    client = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    plan = client.plan_sweep(SMOKE, ["optimizer.lr=1e-4,3e-4"], sweep_name="lr")
    assert any(line.startswith("sweep total") for line in plan.lines())
    created = client.submit_sweep(SMOKE, ["optimizer.lr=1e-4,3e-4"], plan=plan)
    assert len({job.name for job, replaced in created if replaced is None}) == 2
    labelled = [o for (r, ns, _), o in kube.objects.items() if o["metadata"].get("labels", {}).get(SWEEP_LABEL) == "lr"]
    assert len(labelled) == 2

    before = dict(kube.objects)
    with pytest.raises(SweepRefused) as refused:
        client.submit_sweep(SMOKE, ["trainer.max_steps=10,-5"], sweep_name="bad")
    assert refused.value.exit_code in (2, 3)
    assert kube.objects == before, "a refused sweep created something"
