"""``--log-format json`` and ``--log-config FILE`` (dictConfig from .json, fileConfig from .ini) on real workers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import zqsync
from tests.helpers import wait_for

STARTED = "zqsync worker pid"


def test_json_format_writes_one_object_per_line(zq_worker):
    worker = zq_worker(extra_args=["--log-format", "json"])
    with zqsync.Client(worker.endpoint) as client:
        with pytest.raises(zqsync.RemoteError):
            client.call("fail", "boom")
    records = [json.loads(line) for line in worker.output().splitlines() if line.strip()]
    started = [record for record in records if record["message"].startswith(STARTED)]
    assert len(started) == 1, records
    assert started[0]["levelname"] == "INFO" and started[0]["name"] == "zqsync.worker.server"
    assert started[0]["process"] == worker.pid and "asctime" in started[0]


DICT_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "CUSTOM %(levelname)s %(name)s | %(message)s"}},
    "handlers": {"file": {"class": "logging.FileHandler", "formatter": "plain", "filename": "FILE"}},
    "root": {"level": "INFO", "handlers": ["file"]},
}

INI_CONFIG = """\
[loggers]
keys=root

[handlers]
keys=file

[formatters]
keys=plain

[logger_root]
level=INFO
handlers=file

[handler_file]
class=FileHandler
formatter=plain
args=({path!r},)

[formatter_plain]
format=CUSTOM %(levelname)s %(name)s | %(message)s
"""


@pytest.mark.parametrize("suffix", [".json", ".ini"])
def test_log_config_file_routes_the_workers_lines(zq_worker, tmp_path, suffix):
    log_file = tmp_path / "worker.log"
    config = tmp_path / f"logging{suffix}"
    if suffix == ".json":
        DICT_CONFIG["handlers"]["file"]["filename"] = str(log_file)  # type: ignore[index]
        config.write_text(json.dumps(DICT_CONFIG))
    else:
        config.write_text(INI_CONFIG.format(path=str(log_file)))
    worker = zq_worker(extra_args=["--log-config", str(config)])
    wait_for(lambda: log_file.exists() and "CUSTOM INFO zqsync.worker.server | " + STARTED in log_file.read_text(),
             what="the startup line in the configured file")
    assert STARTED not in worker.output(), "the configured handler replaces the default one"


@pytest.mark.parametrize("name, content, message", [
    ("logging.yaml", "version: 1", "expected a .json, .ini, .conf or .cfg file"),
    ("logging.json", "{not json", "is not a usable logging configuration: JSONDecodeError"),
    ("logging.json", '{"version": 1, "root": {"handlers": ["nosuch"]}}', "is not a usable logging configuration"),
    ("logging.ini", "[loggers]\n", "is not a usable logging configuration"),
])
def test_a_bad_log_config_is_a_clear_error(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    result = subprocess.run([sys.executable, "-m", "zqsync", "worker", "zqsync.demo.tasks", "--log-config",
                             str(tmp_path / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and message in result.stderr, result.stderr
