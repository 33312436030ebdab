"""No stale words: the user's docs name the sockets of the job wire that exists (issue 27, item 2).

Clients send jobs on DEALER sockets to a worker's ROUTER; PUSH and PULL remain only inside a prefork
worker (the supervisor's private backends, ``docs/design.md``) and in the benchmarks' raw peer loops.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The pages a user reads to use zqsync (design.md describes the prefork internals, where PUSH/PULL exist).
USER_DOCS = ["README.md", *(str(path.relative_to(ROOT)) for path in sorted((ROOT / "docs").rglob("*.md"))
                            if path.name not in ("design.md", "changelog.md"))]
STALE = re.compile(r"\b(PUSH|PULL)\b")


def test_the_user_docs_name_no_socket_type_the_job_wire_no_longer_has():
    stale = [f"{name}:{number}: {line.strip()}" for name in USER_DOCS
             for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
             if STALE.search(line) and "raw" not in line.lower()]
    assert stale == [], "\n".join(stale)


def test_the_client_stats_name_the_job_pool_jobs_and_keep_push_as_an_alias():
    import zqsync

    with zqsync.Client("tcp://127.0.0.1:9") as client:
        stats = client.stats()
    assert stats["jobs"] is stats["push"] and "opened" in stats["jobs"]
