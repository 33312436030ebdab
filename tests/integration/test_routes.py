"""Client routes: each task goes to the workers of its route, seen from the workers' counters and identities."""

import pytest

from tests.helpers import wait_for
from zqsync import Client

pytestmark = pytest.mark.timeout(60)


def test_each_task_reaches_only_its_route_s_worker_through_its_own_sockets(zq_peer):
    mail, default = zq_peer(), zq_peer()
    with Client(routes={"ech*": [mail.endpoint], "*": [default.endpoint]}) as client:
        assert [client.call("echo", n) for n in range(5)] == list(range(5))
        assert client.call("delay", 0.0, "late") == "late"
        for n in range(3):
            client.enqueue("echo", n)
        client.enqueue("delay", 0.0)
        wait_for(lambda: mail.stats()["jobs_received"] == 3 and default.stats()["jobs_received"] == 1,
                 what="each job at its route's worker")
    mail_stats, default_stats = mail.stats(), default.stats()
    assert (mail_stats["calls_received"], default_stats["calls_received"]) == (5, 1)
    # Each route has its own pool: the sockets that reached one worker never reached the other.
    assert mail.identities() and default.identities()
    assert not mail.identities() & default.identities()


def test_a_routed_job_s_status_result_and_cancel_are_found_on_its_route_s_worker(zq_worker, tmp_path):
    """``job``, ``result`` and ``cancel`` know no task name: they look on the route's workers too."""
    routed = zq_worker("tests.integration.job_tasks:registry", extra_args=["--state-dir", str(tmp_path / "a")])
    default = zq_worker("tests.integration.job_tasks:registry", extra_args=["--state-dir", str(tmp_path / "b")])
    with Client(routes={"add": [routed.endpoint], "*": [default.endpoint]}) as client:
        job_id = client.enqueue_with_options("add", args=(2, 3), confirm=True)
        assert client.result(job_id, timeout=30) == 5
        status = client.job(job_id)
        assert (status.state, status.worker) == ("done", routed.endpoint)
        later = client.enqueue_with_options("add", args=(1, 1), delay=60)
        assert client.cancel(later).state == "cancelled"
    assert default.stats()["confirmed_received"] == 0
