"""docs/trainer-reference.md's bounds are torch's own, read from the installed torch, not restated.

After a worker fails, torchrun stops the node's other workers with a wait that is hard-coded in
`LocalElasticAgent._stop_workers` (`self._shutdown()`, whose default is `timeout: int = 30`);
only a signal to the agent uses TORCH_ELASTIC_SHUTDOWN_TIMEOUT (`api.py`: `self._shutdown(
e.sigval, timeout=self._shutdown_timeout)`). The docs said 90 s for both."""
import inspect
import os
import re

from trainer_helpers import REPO


def bounded_failure_rows() -> list[str]:
    with open(os.path.join(REPO, "docs", "trainer-reference.md")) as f:
        text = f.read()
    section = re.split(r"\n#{1,3} ", text.split("### Bounded failure times\n", 1)[1], maxsplit=1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")]


def test_the_documented_wait_after_a_worker_failure_is_torchruns_hard_coded_one():
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    default = inspect.signature(LocalElasticAgent._shutdown).parameters["timeout"].default
    assert "self._shutdown()" in inspect.getsource(LocalElasticAgent._stop_workers)
    assert "self._shutdown(e.sigval, timeout=self._shutdown_timeout)" in inspect.getsource(api.SimpleElasticAgent.run)
    rows = bounded_failure_rows()
    failure = [r for r in rows if "after one of them failed" in r]
    assert len(failure) == 1 and failure[0].rstrip(" |").endswith(f"| {default} s"), failure or rows
    signalled = [r for r in rows if "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in r]
    assert signalled and all("signal" in r for r in signalled), signalled
