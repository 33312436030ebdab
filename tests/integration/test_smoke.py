import zqsync
from tests.helpers import wait_for


def test_call_and_enqueue_reach_a_real_worker(zq_worker, tmp_path):
    worker = zq_worker()
    target = tmp_path / "out.txt"
    with zqsync.Client(worker.endpoint) as client:
        assert client.call("add", 2, 3) == 5
        client.enqueue("record", str(target), "hello")
    wait_for(lambda: target.exists() and target.read_text() == "hello\n", what="the job's line")
    assert worker.stats()["jobs_succeeded"] == 1
