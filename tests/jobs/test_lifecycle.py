"""cancel, logs following restarts, checkpoints: the controllers' behaviour from their source."""
from __future__ import annotations

import json

import pytest

from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs.conftest import MULTINODE, operator_pods, raw_spec, set_conditions

NS = "team-research"


def client(kube, facts, store=None, **kwargs):
    return JobClient(stack=facts.stack, kube=kube, facts=facts, store=store or LocalStore(), **kwargs)


def complete_step(root, job: str, step: int) -> None:
    path = root / NS / job / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / "complete.json").write_text(json.dumps({"step": step}))


def test_cancel_lets_the_checkpoint_land_before_the_job_goes(kube, dev_facts, tmp_path):
    """Cancel is a foreground deletion of the job, never a suspend and never a forced delete.

    Training Operator v1.9.4 stops reconciling a job being deleted, so no pod is recreated after
    the trainer's 143 (pkg/controller.v1/pytorch/pytorchjob_controller.go:149-153):

        if !needReconcile || pytorchjob.GetDeletionTimestamp() != nil {
            logger.Info("reconcile cancelled, job does not need to do reconcile or has been deleted", ...)
            return ctrl.Result{}, nil

    Its own pod deletions (the suspend path: pkg/controller.v1/common/job.go:146-147
    ``if trainutil.IsJobSuspended(runPolicy) { if err = jc.CleanUpResources(...)``) use default
    options, i.e. the pod's terminationGracePeriodSeconds (pkg/controller.v1/control/pod_control.go:186):

        r.KubeClient.CoreV1().Pods(namespace).Delete(context.TODO(), podID, metav1.DeleteOptions{})

    and so does the garbage collector for a foreground deletion's dependents. The kubelet sends
    SIGTERM, waits the grace period, then SIGKILL; trainer.launch forwards the SIGTERM, the
    trainer saves at the step boundary and exits 143 (trainer/launch.py). Suspending is not a
    cancel under Kueue, which restarts an admitted job (kueue v0.19.2
    pkg/controller/jobframework/reconciler.go:621-625):

        // 7. handle job is suspended.
        if job.IsSuspended() {
            // start the job if the workload has been admitted, and the job is still suspended
            if workload.IsAdmitted(wl) {
    """
    store_root = tmp_path
    complete_step(store_root, "gpt2-ddp-a10g", 100)
    clock = [0.0]

    def kubelet(seconds):
        """The pods' grace period: the trainer saves step 130, every pod exits 143."""
        clock[0] += seconds
        if not (store_root / NS / "gpt2-ddp-a10g" / "step-000130").exists():
            complete_step(store_root, "gpt2-ddp-a10g", 130)
            for pod in kube.list("pods", NS):
                assert pod["metadata"]["deletionTimestamp"]
                assert kube.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS), "the job went before its pods"
                kube.terminate(pod["metadata"]["name"], NS, 143)

    jobs = client(kube, dev_facts, store=LocalStore(str(store_root)), clock=lambda: clock[0], sleep=kubelet)
    manifest = jobs.submit(raw_spec(MULTINODE)).manifest
    job = kube.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS)
    set_conditions(kube, job, "Created", "Running")
    operator_pods(kube, job)
    result = jobs.cancel("gpt2-ddp-a10g", "research", wait=True, poll_seconds=5)

    grace = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert ("delete", "pytorchjobs.kubeflow.org", NS, "gpt2-ddp-a10g", "Foreground") in kube.requests
    patches = [json.loads(r[4]) for r in kube.requests if r[0] == "patch"]
    # No suspend: the one patch says why the run ends (the run recorder's outcome), nothing in spec.
    assert patches == [{"metadata": {"annotations": {"mlplatform.io/cancelled-at": "1970-01-01T00:00:00Z"}}}], patches
    assert sorted(kube.graceful_deletions) == [("gpt2-ddp-a10g-master-0", grace), ("gpt2-ddp-a10g-worker-0", grace)]
    # The grace period covers the time budget: step + checkpoint + MLflow flush (workloads.trainingjob).
    from workloads.jobspec import parse_job_spec
    from workloads.trainingjob import resolve

    assert grace == resolve(parse_job_spec(raw_spec(MULTINODE)), dev_facts).budget.grace_seconds > 45
    assert (result.gone, result.newest_checkpoint, result.grace_seconds) == (True, 130, grace)
    assert kube.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS) is None


def test_cancel_without_wait_leaves_the_job_terminating_until_its_pods_exit(kube, dev_facts):
    jobs = client(kube, dev_facts)
    jobs.submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    operator_pods(kube, job)
    result = jobs.cancel("smoke-l4", "research")
    assert result.gone is False
    assert jobs.get("smoke-l4", "research").phase == "Terminating"
    kube.terminate("smoke-l4-master-0", NS, 143)
    assert kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS) is None


def test_logs_follow_one_rank_across_a_preemption_to_the_end(kube, dev_facts):
    """Under restartPolicy ExitCode the operator deletes a pod that exited 128-255 and creates a
    new one with the same name (kubeflow/trainer v1.9.4 pkg/controller.v1/common/pod.go:350-376):
    the follower must pick up the new pod (a new uid) and stop only when the job has finished."""
    jobs = client(kube, dev_facts, sleep=lambda s: None)
    jobs.submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    set_conditions(kube, job, "Created", "Running")
    operator_pods(kube, job, logs=lambda name: ["step 10", "SIGTERM: checkpoint step 12 saved", "exit 143"])
    attempts = []

    def controller(pod):
        attempts.append(pod["metadata"]["uid"])
        if len(attempts) == 1:  # preempted: the operator replaces the pod
            kube.terminate(pod["metadata"]["name"], NS, 143)
            kube.objects.pop(("pods", NS, pod["metadata"]["name"]))
            set_conditions(kube, job, "Created", "Restarting")
            operator_pods(kube, job, logs=lambda name: ["resumed from step 12", "step 20", "done"])
            set_conditions(kube, job, "Created", "Running")
        else:
            kube.terminate(pod["metadata"]["name"], NS, 0)
            set_conditions(kube, job, "Created", "Running", "Succeeded")

    kube.on_stream_end.append(controller)
    lines = list(jobs.logs("smoke-l4", "research", follow=True))
    assert [(l.attempt, l.text) for l in lines] == [
        (1, "step 10"), (1, "SIGTERM: checkpoint step 12 saved"), (1, "exit 143"),
        (2, "resumed from step 12"), (2, "step 20"), (2, "done")]
    assert len(set(attempts)) == 2
    assert [r[4] for r in kube.requests if r[0] == "logs"] == [True, True]  # streamed (-f)


def test_logs_of_every_rank_and_of_one(kube, dev_facts):
    jobs = client(kube, dev_facts)
    jobs.submit(raw_spec(MULTINODE))
    job = kube.find("pytorchjobs.kubeflow.org", "gpt2-ddp-a10g", NS)
    operator_pods(kube, job, logs=lambda name: [f"{name} line {i}" for i in range(3)])
    every = list(jobs.logs("gpt2-ddp-a10g", "research", rank=None))
    assert sorted((l.node_rank, l.text) for l in every) == [
        (0, f"gpt2-ddp-a10g-master-0 line {i}") for i in range(3)] + [(1, f"gpt2-ddp-a10g-worker-0 line {i}") for i in range(3)]
    assert {l.text for l in jobs.logs("gpt2-ddp-a10g", "research", rank=1)} == {f"gpt2-ddp-a10g-worker-0 line {i}" for i in range(3)}
    with pytest.raises(ValueError, match="node ranks 0-1"):
        list(jobs.logs("gpt2-ddp-a10g", "research", rank=2))


# -- checkpoints -------------------------------------------------------------------------------
def test_checkpoints_from_the_bucket_the_file_system_exports_to(dev_facts, tmp_path, monkeypatch):
    """/fsx/checkpoints/<ns>/<job>/step-N on FSx is s3://<checkpoints bucket>/<ns>/<job>/step-N
    (the /checkpoints association, prefix ""); only steps with complete.json count."""
    import boto3
    from moto import mock_aws

    from jobs.store import S3Store

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        for key in ("team-research/pre/step-000100/complete.json", "team-research/pre/step-000100/__0_0.distcp",
                    "team-research/pre/step-000200/__0_0.distcp",  # no marker: being written
                    "team-research/pre/step-000300/complete.json", "team-research/other/step-000900/complete.json",
                    "team-research/pre/attempts/node-0.jsonl"):
            body = b'{"exit_code": 143, "checkpoint_step_at_start": 100, "checkpoint_step_at_end": 300}\ncut-off' \
                if key.endswith("jsonl") else b"{}"
            s3.put_object(Bucket="ckpt", Key=key, Body=body)
        store = S3Store("ckpt", client=s3)
        jobs = JobClient(stack="dev", kube=None, facts=dev_facts, store=store)

        class NoCluster:
            def get(self, *a, **k):
                from jobs.kube import NoClusterAccess
                raise NoClusterAccess("no kubeconfig")

        jobs.kube = NoCluster()  # a finished job's checkpoints are readable without the cluster
        found = jobs.checkpoints("pre", "research")
        assert [(c.step, c.uri) for c in found] == [(100, "s3://ckpt/team-research/pre/step-000100/"),
                                                    (300, "s3://ckpt/team-research/pre/step-000300/")]
        history = store.attempts("/fsx/checkpoints/team-research/pre")
        assert [(a.node_rank, a.exit_code, a.step_at_end) for a in history] == [(0, 143, 300)]


def test_cancel_of_a_trainjob_deletes_it_in_the_foreground(kube, v2_facts):
    """The TrainJob owns its JobSet, which JobSet v0.12.0 leaves alone once it is being deleted
    (pkg/controllers/jobset_controller.go:118-121):

        // Don't reconcile JobSets marked for deletion.
        if jobSetMarkedForDeletion(&js) {
            return ctrl.Result{}, nil
    """
    jobs = client(kube, v2_facts)
    jobs.submit(raw_spec(MULTINODE, runtime="trainjob"))
    job = kube.find("trainjobs.trainer.kubeflow.org", "gpt2-ddp-a10g", NS)
    operator_pods(kube, job)
    result = jobs.cancel("gpt2-ddp-a10g", "research")
    assert ("delete", "trainjobs.trainer.kubeflow.org", NS, "gpt2-ddp-a10g", "Foreground") in kube.requests
    assert len(kube.graceful_deletions) == 2 and result.gone is False
    for pod in kube.list("pods", NS):
        kube.terminate(pod["metadata"]["name"], NS, 143, container="node")
    assert kube.find("trainjobs.trainer.kubeflow.org", "gpt2-ddp-a10g", NS) is None


def test_cancel_refuses_a_job_argo_cd_would_recreate(kube, dev_facts, capsys):
    """Argo CD 3.x tracks its resources by the `argocd.argoproj.io/tracking-id` annotation (the default
    method since 3.0): a declared job deleted by hand comes back on the next (self-heal) sync."""
    from jobs.client import GitOpsOwned

    jobs = client(kube, dev_facts)
    manifest = jobs.render(raw_spec())
    manifest["metadata"]["annotations"] = {
        "argocd.argoproj.io/tracking-id": "team-research:kubeflow.org/PyTorchJob:team-research/smoke-l4"}
    kube.apply(manifest)
    with pytest.raises(GitOpsOwned, match="declared in git .Argo CD application team-research.*workloads/declared/"):
        jobs.cancel("smoke-l4", "research")
    assert not [r for r in kube.requests if r[0] == "delete"]
    assert jobs.cancel("smoke-l4", "research", force=True).name == "smoke-l4"
    assert [r[0] for r in kube.requests].count("delete") == 1


def test_a_dropped_stream_is_re_attached_without_repeating_lines(kube, dev_facts):
    """`kubectl logs -f` can end while the container still runs (an idle timeout on the way to
    the API server): the follower attaches again and gives only the lines it had not given."""
    jobs = client(kube, dev_facts, sleep=lambda s: None)
    jobs.submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    set_conditions(kube, job, "Created", "Running")
    [pod] = operator_pods(kube, job, logs=lambda name: ["step 1", "step 2"])
    ends = []

    def connection(streamed):
        ends.append(streamed["metadata"]["uid"])
        if len(ends) == 1:  # dropped: the container goes on writing
            kube.pod_logs[pod["metadata"]["uid"]] += ["step 3", "step 4"]
        else:
            kube.terminate(streamed["metadata"]["name"], NS, 0)
            set_conditions(kube, job, "Created", "Running", "Succeeded")

    kube.on_stream_end.append(connection)
    assert [l.text for l in jobs.logs("smoke-l4", "research", follow=True)] == ["step 1", "step 2", "step 3", "step 4"]
    assert ends == [pod["metadata"]["uid"]] * 2
