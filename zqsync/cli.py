"""The ``zqsync`` command: worker, call, enqueue, demo, bench.

Each subcommand is a small function; ``main`` only parses and dispatches.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from . import __version__, fdlimit, settings
from ._cli_endpoints import add_endpoint, fill_endpoints, json_or_str
from ._worker_cli import (
    add_metrics_options,
    add_reload_option,
    listening,
    metrics_address,
    prometheus,
    run_with_reload,
    serve_metrics,
    supervisor_metrics,
)
from .errors import ConfigurationError
from .logs import add_logging_options, configure_logging

EPILOG = ("Endpoints are tcp://HOST:PORT: a worker takes jobs on PORT and calls on PORT+1. A HOST that is a DNS "
          "name stands for every worker it resolves to; srv://NAME for the SRV records of _zqsync._tcp.NAME.")


def _kwargs(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--kwargs must be a JSON object")
    return value


def _checked(check: Callable[[str, Any], Any]) -> Callable[[str], Any]:
    """An argparse type that runs one of the settings' own validators."""

    def parse(text: str) -> Any:
        try:
            return check("value", text)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("value ", "", 1)) from None

    parse.__name__ = check.__name__.strip("_")
    return parse


_positive_int = _checked(settings._positive_int)
_seconds = _checked(settings.check_seconds)
_timeout = _checked(settings._deadline)


CLIENT_COMMANDS = (
    ("call", "call a task and print its result as JSON", "Call a task and print its result as JSON."),
    ("enqueue", "enqueue a job (at most once) and print its job id",
     "Enqueue a job and print its job id. Without --confirm it is at most once and fire-and-forget: a worker "
     "that has no task of that name drops the job (counted in 'zqsync stats' as unknown_task, and logged), "
     "and this command still exits 0. With --confirm the worker answers, so an unknown task fails here."),
)
TIMEOUT_HELP = {
    "call": "seconds to wait for the task's result (default: ZQSYNC_CALL_TIMEOUT, 10)",
    "enqueue": "seconds to wait for the worker to take the job (default: ZQSYNC_SEND_TIMEOUT, 1), or with "
    "--confirm for its acknowledgement (default: ZQSYNC_CONFIRM_TIMEOUT, 10)",
}

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _age(text: str) -> float:
    """Seconds, or a number with a unit: ``90``, ``30m``, ``12h``, ``7d``."""
    unit = _UNITS.get(text[-1:].lower())
    try:
        value = float(text[:-1] if unit else text) * (unit or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or a number with s/m/h/d, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


class _PrintCompletion(argparse.Action):
    """``--print-completion SHELL``: the completion script shtab generates from the whole parser."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        try:
            import shtab
        except ImportError:
            parser.exit(1, "zqsync: --print-completion needs shtab: pip install 'zqsync[completion]'\n")
        print(shtab.complete(parser, shell=values))
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand (one ``_add_*`` function each)."""
    parser = argparse.ArgumentParser(
        prog="zqsync",
        description="Pooled ZeroMQ job enqueue and RPC for gevent and synchronous Python.",
        epilog=EPILOG,
    )
    parser.add_argument("-V", "--version", action="version", version=f"zqsync {__version__}")
    parser.add_argument("--print-completion", choices=("bash", "zsh", "tcsh"), action=_PrintCompletion,
                        help="print a shell completion script and exit (needs shtab: pip install 'zqsync[completion]'); "
                             "for bash: zqsync --print-completion bash > /etc/bash_completion.d/zqsync")
    common = argparse.ArgumentParser(add_help=False)
    add_logging_options(common)
    curve_client = argparse.ArgumentParser(add_help=False)
    curve_client.add_argument("--curve-server-key", metavar="FILE", help="the worker's public key (NAME.key), for CURVE")
    curve_client.add_argument("--curve-secret-key", metavar="FILE", help="this client's secret key (NAME.key_secret)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_worker(commands, common)
    _add_jobs(commands, common)
    _add_beat(commands, common, curve_client)
    _add_client_commands(commands, common, curve_client)
    _add_job(commands, common, curve_client)
    _add_stats(commands, common, curve_client)
    _add_ping(commands, common, curve_client)
    _add_dashboard(commands, common, curve_client)
    _add_keygen(commands, common)
    _add_demo(commands, common)
    _add_bench(commands, common)
    return parser


def _add_worker(commands: Any, common: argparse.ArgumentParser) -> None:
    """``zqsync worker``: serve a registry (every flag maps to a WorkerSettings field)."""
    worker = commands.add_parser(
        "worker", parents=[common], help="serve the tasks of a Registry",
        description="Serve the tasks registered in MODULE:ATTR. The current directory is put on "
        "sys.path (as gunicorn does) and gevent monkey-patches the process before the module is "
        "imported, so blocking calls in tasks cooperate.",
        epilog=EPILOG,
    )
    worker.add_argument("app", metavar="MODULE[:ATTR]", help="module and Registry attribute (ATTR defaults to 'registry')")
    worker.add_argument("--bind", default=settings.BIND,
                        help=f"base endpoint; port 0 picks a free pair (default: {settings.BIND})")
    worker.add_argument("--concurrency", type=_positive_int, default=settings.CONCURRENCY,
                        help=f"task slots (greenlets) per worker process (default: {settings.CONCURRENCY})")
    worker.add_argument("--graceful-timeout", type=_seconds, default=settings.GRACEFUL_TIMEOUT,
                        help="seconds a TERM/INT waits for in-flight tasks and queued jobs; then it kills "
                        "the tasks and counts and logs the jobs it discards "
                        f"(default: {settings.GRACEFUL_TIMEOUT})")
    worker.add_argument("--queue", action="append", dest="queues", default=[], metavar="NAME[:N]=ENDPOINT",
                        help="a named queue of plain jobs with its own jobs socket and N task slots (default: "
                        "--concurrency); repeat it, highest priority first: a queue takes a job only when none "
                        "above it has one waiting that it could start, and the --bind jobs socket ranks last. "
                        "Calls and confirmed jobs use --bind. Not with --processes")
    worker.add_argument("--ready-file", metavar="PATH", help="write the bound endpoint to PATH once listening")
    worker.add_argument("--processes", type=_positive_int, default=None, metavar="N",
                        help="run N worker processes under a prefork supervisor that restarts crashed ones; "
                        "kill -HUP replaces them one at a time, losing no job. Each child binds the --bind pair "
                        "itself (shared: the kernel spreads new connections) and a pair of its own on the ports "
                        "after it (child i: PORT+2+2i, PORT+3+2i; keep them free), announced by zqsync.endpoints "
                        "to clients with expand_prefork (ZQSYNC_EXPAND_PREFORK=1), which then spread every "
                        "message over the children. On 2 cores, 2 children ran 0.85-1.17x one process's plain "
                        "jobs and 0.88-1.11x its calls. A child whose hub is blocked for 50 ms has its work taken "
                        "by a free sibling, and the plain jobs a SIGKILLed child had read are counted (what libzmq "
                        "and the kernel buffered for it is not); see docs/guides/prefork.md "
                        "(default: a single process, no supervisor)")
    worker.add_argument("--router", action="store_true",
                        help="with --processes: the supervisor alone listens, on the --bind pair only, and a "
                        "router thread hands every call and job to a child with a free slot; for hosts whose "
                        "ports after the bind port cannot be opened. Every message crosses the supervisor: "
                        "on 2 cores, 2 children ran 0.34-0.45x one process's throughput")
    worker.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)  # deprecated: the default now
    worker.add_argument("--state-dir", metavar="DIR",
                        help="directory of the journal (SQLite, WAL) of confirmed jobs; without it the worker "
                        "refuses enqueue(confirm=True)")
    worker.add_argument("--journal", metavar="URL",
                        help="the journal's URL: sqlite:///PATH (the same as --state-dir PATH) or "
                        "postgresql://USER@HOST:PORT/DB, one database shared by every worker of a fleet, "
                        "whose workers take over the jobs of a worker that is gone (needs zqsync[postgresql])")
    worker.add_argument("--journal-sync", choices=["normal", "full"], default="normal",
                        help="SQLite synchronous level: 'normal' survives any process kill, but a power loss or "
                        "kernel crash may lose the last acknowledged jobs; 'full' also survives power loss, "
                        "at an fsync per group commit (default: normal)")
    worker.add_argument("--keep-done", type=_age, default=settings.KEEP_DONE, metavar="SECONDS",
                        help="how long finished confirmed jobs stay in the journal, which recognises a resent "
                        "job id as a duplicate only while its row is kept (default: 3600; 7d, 12h, 30m also work)")
    worker.add_argument("--keep-dead", type=_age, default=settings.KEEP_DEAD, metavar="SECONDS",
                        help="how long dead-lettered jobs stay in the journal (default: 604800, 7 days)")
    worker.add_argument("--journal-busy-timeout", type=_seconds, default=settings.JOURNAL_BUSY_TIMEOUT, metavar="SECONDS",
                        help="how long a journal write waits for another process's lock before it fails, "
                        "is logged and retried (default: 30)")
    worker.add_argument("--journal-lease", type=_seconds, default=settings.JOURNAL_LEASE, metavar="SECONDS",
                        help="PostgreSQL journal: how long this process's ownership of its jobs lasts unless "
                        "renewed (every third of it); once it expires (host or network gone), other workers "
                        "take its pending and running jobs over (default: 10)")
    worker.add_argument("--curve-secret-key", metavar="FILE",
                        help="this worker's secret key (NAME.key_secret from 'zqsync keygen'): accept only CURVE "
                        "clients listed in --allow-client-keys; traffic is encrypted")
    worker.add_argument("--allow-client-keys", metavar="DIR",
                        help="directory of the public keys (*.key) of the clients allowed to connect")
    add_metrics_options(worker)
    worker.add_argument("--hwm", type=_positive_int, default=settings.WORKER_HWM,
                        help="receive high-water mark of the jobs and rpc sockets, messages "
                        f"(default: {settings.WORKER_HWM})")
    worker.add_argument("--hard-grace", type=_seconds, default=settings.HARD_GRACE, metavar="SECONDS",
                        help="seconds past a task's time limit before a worker process whose hub is still "
                        "blocked (a C call that never returns) dumps its threads' tracebacks and exits with "
                        f"status 1, to be restarted (default: {settings.HARD_GRACE})")
    worker.add_argument("--keepalive-idle", type=_seconds, default=settings.KEEPALIVE_IDLE, metavar="SECONDS",
                        help="seconds a client connection may stay silent before the worker's kernel probes it "
                        "(TCP keepalive; a connection left by a client across a cut is closed after 3 unanswered "
                        f"probes) (default: {settings.KEEPALIVE_IDLE:g})")
    worker.add_argument("--keepalive-interval", type=_seconds, default=settings.KEEPALIVE_INTERVAL, metavar="SECONDS",
                        help=f"seconds between those probes (default: {settings.KEEPALIVE_INTERVAL:g})")
    worker.add_argument("--no-remote-tracebacks", dest="remote_tracebacks", action="store_false",
                        help="send a failed call's error type and message only, not its traceback (which shows "
                        "the worker's file paths and code); the worker logs the traceback instead")
    worker.add_argument("--parent-pid", type=int, metavar="PID",
                        help="shut down when process PID stops being this worker's parent (for test harnesses)")
    add_reload_option(worker)
    worker.set_defaults(handler=cmd_worker)


def _add_jobs(commands: Any, common: argparse.ArgumentParser) -> None:
    """``zqsync jobs``: list, requeue, purge or cancel journaled jobs."""
    jobs = commands.add_parser(
        "jobs", parents=[common], help="list, requeue, purge or cancel the confirmed jobs in a worker's journal",
        description="list (default): show the confirmed jobs a worker's journal holds, with their arguments: "
        "pending (to run), dead (attempts exhausted: the dead-letter table), done. requeue ID... | --all-dead: "
        "make jobs pending again with their attempts reset; a live worker that has the task runs them (within "
        "a second), or the next one to start. purge --state dead --older-than 7d: delete old done/dead rows. "
        "cancel ID...: a pending or delayed job never runs; with --endpoint (the worker's, over rpc) a running "
        "one is also interrupted where it yields. Safe while the worker runs. recover: rebuild a damaged "
        "journal (\"database disk image is malformed\") from every row still readable, keeping the damaged "
        "file aside; only with the worker stopped.",
    )
    jobs.add_argument("action", nargs="?", choices=["list", "requeue", "purge", "cancel", "recover"], default="list")
    jobs.add_argument("ids", nargs="*", metavar="ID", help="job ids to requeue or cancel")
    jobs.add_argument("--state-dir", metavar="DIR", help="the worker's --state-dir (needed except for cancel "
                      "with --endpoint, or with --journal)")
    jobs.add_argument("--journal", metavar="URL", help="the workers' --journal URL instead (sqlite:///PATH or "
                      "postgresql://USER@HOST:PORT/DB: the whole fleet's jobs)")
    jobs.add_argument("--endpoint", action="append", dest="endpoints", metavar="ENDPOINT",
                      help="cancel: a worker base endpoint (tcp://HOST:PORT) to ask over rpc; repeat for several")
    jobs.add_argument("--state", action="append", choices=["pending", "dead", "done", "cancelled", "expired"],
                      help="states to list or purge; repeat for several (default: list pending and dead)")
    jobs.add_argument("--id", action="append", dest="job_ids", metavar="ID", help="list only this job (any state)")
    jobs.add_argument("--limit", type=_positive_int, default=100, help="most jobs to list (default: 100)")
    jobs.add_argument("--json", action="store_true", help="print one JSON object per job instead of a table")
    jobs.add_argument("--all-dead", action="store_true", help="requeue every dead job")
    jobs.add_argument("--older-than", type=_age, metavar="AGE", help="purge: rows last updated before AGE ago (7d)")
    jobs.set_defaults(handler=cmd_jobs)


def _add_beat(commands: Any, common: argparse.ArgumentParser, curve_client: argparse.ArgumentParser) -> None:
    """``zqsync beat``: enqueue a registry's periodic tasks on their schedules."""
    beat = commands.add_parser(
        "beat", parents=[common, curve_client], help="enqueue the periodic tasks of a registry on their schedules",
        description="A scheduler that is only a client: for each tick of every @registry.periodic task it "
        "enqueues a confirmed job whose id is derived from the task name and the tick, so the workers' journals "
        "run each tick once even with two beats running, or after a restart. Workers need a journal: with "
        "--state-dir every beat must list the same endpoints; with one shared --journal postgresql://... any "
        "workers of the fleet will do. Stops on TERM or INT.",
        epilog=EPILOG,
    )
    beat.add_argument("app", metavar="MODULE[:ATTR]", help="the task module and its Registry (ATTR default: registry)")
    add_endpoint(beat, many=True)
    beat.add_argument("--schedule-file", default="zqsync-beat-schedule.json", metavar="PATH",
                      help="where the beat keeps each task's last handled tick, so that after a restart the ticks "
                           "that passed while no beat ran are counted (ticks_skipped) and logged, like Celery "
                           "beat's celerybeat-schedule (default: %(default)s; '' for none)")
    beat.set_defaults(handler=cmd_beat)


def _add_client_commands(commands: Any, common: argparse.ArgumentParser, curve_client: argparse.ArgumentParser) -> None:
    """``zqsync call`` and ``zqsync enqueue``."""
    for name, verb, description in CLIENT_COMMANDS:
        sub = commands.add_parser(name, parents=[common, curve_client], help=verb,
                                  description=description, epilog=EPILOG)
        add_endpoint(sub)
        sub.add_argument("task", metavar="TASK", help="registered task name")
        sub.add_argument("args", metavar="ARG", nargs="*", type=json_or_str,
                         help="positional task arguments, each parsed as JSON, else taken as a string")
        sub.add_argument("--kwargs", type=_kwargs, default={}, metavar="JSON", help="keyword arguments as a JSON object")
        sub.add_argument("--timeout", type=_seconds, default=None, help=TIMEOUT_HELP[name])
        sub.set_defaults(handler=cmd_call if name == "call" else cmd_enqueue)
        if name == "enqueue":
            sub.add_argument("--confirm", action="store_true",
                             help="wait until the worker has journaled the job (it then runs at least once); an "
                             "unknown task or a worker without --state-dir fails with a non-zero exit")
            sub.add_argument("--delay", type=_seconds, metavar="SECONDS",
                             help="run the job no earlier than SECONDS from now (journaled: implies --confirm)")
            sub.add_argument("--store-result", action="store_true",
                             help="ask the worker to keep a plain job's status and result ('zqsync job')")


def _add_job(commands: Any, common: argparse.ArgumentParser, curve_client: argparse.ArgumentParser) -> None:
    """``zqsync job``: the status or result of one job id."""
    job = commands.add_parser(
        "job", parents=[common, curve_client], help="show a job's status, or wait for its result",
        description="Ask the workers (the job id's preferred one first) for a job's status: pending, scheduled, "
        "running, done, failed, dead, cancelled, expired, or unknown (no worker that answered holds it). With --wait, "
        "wait up to SECONDS for it to finish and print its result as JSON; a failed job exits 1 with its error.",
        epilog=EPILOG,
    )
    add_endpoint(job, many=True)
    job.add_argument("job_id", metavar="ID", help="the job id")
    job.add_argument("--wait", type=_seconds, metavar="SECONDS", help="wait for the result (long-poll)")
    job.set_defaults(handler=cmd_job)


def _add_stats(commands: Any, common: argparse.ArgumentParser, curve_client: argparse.ArgumentParser) -> None:
    """``zqsync stats``: a live worker's counters."""
    stats = commands.add_parser(
        "stats", parents=[common, curve_client], help="show a live worker's counters, task durations and pool stats",
        description="Ask a worker (over rpc) for its counters: jobs received, succeeded, failed and dropped, "
        "calls, tasks in flight, task duration percentiles, and the pools of the clients its tasks use. "
        "Under --processes, the answer covers every child: totals, then one line per child.",
    )
    add_endpoint(stats)
    stats.add_argument("--json", action="store_true", help="print the raw JSON")
    stats.add_argument("--timeout", type=_seconds, default=5.0, help="seconds to wait for the answer (default: 5)")
    stats.set_defaults(handler=cmd_stats)


def _add_ping(commands: Any, common: argparse.ArgumentParser, curve_client: argparse.ArgumentParser) -> None:
    """``zqsync ping``: a liveness probe."""
    ping = commands.add_parser(
        "ping", parents=[common, curve_client], help="check that a worker answers (a liveness probe; exit 0 or 1)",
        description="Send zqsync.ping to a worker. It is answered outside the task pool, so a worker whose "
        "task slots are all busy still answers. Prints 'pong from ENDPOINT in X ms' and exits 0, or prints "
        "why there was no pong and exits 1.",
    )
    add_endpoint(ping)
    ping.add_argument("--timeout", type=_timeout, default=1.0, help="seconds to wait for the pong (default: 1)")
    ping.set_defaults(handler=cmd_ping)


def _add_dashboard(commands: Any, common: argparse.ArgumentParser, curve_client: argparse.ArgumentParser) -> None:
    """``zqsync dashboard``: the fleet's web page."""
    dashboard = commands.add_parser(
        "dashboard", parents=[common, curve_client], help="serve a web page showing and steering the workers",
        description="Serve a web page (Flask under gevent; needs the web extra) with each worker's state, "
        "throughput and latency charts, and its journal: dead jobs, lookup by id, requeue, cancel, purge. "
        "It only makes the workers' admin calls; it stores nothing. It binds loopback unless given "
        "--token-file, whose token the page then asks for.",
    )
    add_endpoint(dashboard, many=True)
    dashboard.add_argument("--bind", default="127.0.0.1:8008", metavar="HOST:PORT",
                           help="address to serve on (default: 127.0.0.1:8008; port 0 picks a free one)")
    dashboard.add_argument("--token-file", metavar="FILE", help="file holding the login token; required off loopback")
    dashboard.add_argument("--metrics-url", metavar="URL", help="the Prometheus endpoint to link to from the page")
    dashboard.add_argument("--interval", type=_seconds, default=1.0, help="seconds between polls of each worker (default: 1)")
    dashboard.add_argument("--ready-file", metavar="FILE", help="write the page's URL into FILE once listening")
    dashboard.set_defaults(handler=cmd_dashboard)


def _add_keygen(commands: Any, common: argparse.ArgumentParser) -> None:
    """``zqsync keygen``: a CURVE keypair."""
    keygen = commands.add_parser(
        "keygen", parents=[common], help="write a CURVE keypair",
        description="Write NAME.key (public: give it to peers) and NAME.key_secret (secret, mode 0600) into "
        "--dir. A worker needs its own .key_secret and a directory of allowed clients' .key files; a "
        "client needs its .key_secret and the worker's .key.",
    )
    keygen.add_argument("name", metavar="NAME", help="base name of the key files, e.g. worker or web1")
    keygen.add_argument("--dir", default=".", help="directory to write into (default: the current one)")
    keygen.set_defaults(handler=cmd_keygen)


def _add_demo(commands: Any, common: argparse.ArgumentParser) -> None:
    """``zqsync demo``: the main job on loopback."""
    demo = commands.add_parser(
        "demo", parents=[common], help="run the main job end to end on loopback",
        description="Start a worker and gunicorn -k gevent on the example Flask app, drive HTTP "
        "requests that each enqueue a job and make a call, and print what the worker saw.",
    )
    demo.add_argument("--requests", type=_positive_int, default=2000, help="HTTP requests to send (default: 2000)")
    demo.add_argument("--concurrency", type=_positive_int, default=50, help="requests in flight at once (default: 50)")
    demo.add_argument("--web-workers", type=_positive_int, default=2, help="gunicorn worker processes (default: 2)")
    demo.add_argument("--no-preload", action="store_true", help="start gunicorn without --preload")
    demo.add_argument("--timeout", type=_seconds, default=120.0, help="seconds the whole demo may take (default: 120)")
    demo.set_defaults(handler=cmd_demo)


def _add_bench(commands: Any, common: argparse.ArgumentParser) -> None:
    """``zqsync bench``: the benchmark suite, from a checkout."""
    bench = commands.add_parser(
        "bench", parents=[common], help="run the side-by-side benchmark suite (from a checkout)",
        description="Run benchmarks/ from the zqsync checkout: each comparison against its peer (raw pyzmq, "
        "per-request sockets, zerorpc, RQ, gunicorn without zqsync) measured in the same run, reported as "
        "one markdown table. Peers that are not installed are reported as skipped, with how to install them.",
    )
    add_bench_arguments(bench)
    bench.set_defaults(handler=cmd_bench)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark suite's options, shared by ``zqsync bench`` and ``python -m benchmarks``."""
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="smaller counts: the whole suite in under 2 minutes")
    sizes.add_argument("--smoke", action="store_true", help="tiny counts: checks every scenario runs; no real figures")
    parser.add_argument("--json", metavar="FILE", type=os.path.abspath,
                        help="also write every scenario's rows and the machine to FILE")
    parser.add_argument("--plot", metavar="FILE.png", type=os.path.abspath,
                        help="also draw latency distributions and ratios (needs matplotlib)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this scenario; repeat for several "
                             "(pool, worker, zerorpc, congestion, rq, endtoend, fork, prefork, gunicorn)")


def bench_argv(args: argparse.Namespace) -> list[str]:
    """Parsed benchmark options back to ``python -m benchmarks`` arguments."""
    argv = ["--quick"] if args.quick else ["--smoke"] if args.smoke else []
    argv += [*(["--json", args.json] if args.json else []), *(["--plot", args.plot] if args.plot else [])]
    return argv + [item for name in args.only or [] for item in ("--only", name)]


def load_registry(app: str, command: str = "worker") -> Any:
    """Import ``MODULE[:ATTR]`` (ATTR defaults to ``registry``) with the cwd on ``sys.path``.

    :param command: the subcommand that the error messages name.
    :raises SystemExit: with a clear message if the module or attribute is missing
        or is not a `zqsync.worker.Registry`.
    """
    from .worker import Registry

    module_name, _, attr = app.partition(":")
    attr = attr or "registry"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"zqsync {command}: cannot import {module_name!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise SystemExit(f"zqsync {command}: module {module_name!r} has no attribute {attr!r}")
    registry = getattr(module, attr)
    if not isinstance(registry, Registry):
        raise SystemExit(f"zqsync {command}: {module_name}.{attr} is {type(registry).__name__}, not a zqsync.worker.Registry")
    return registry


def worker_settings(args: argparse.Namespace) -> settings.WorkerSettings:
    """The worker's settings from its flags, built (and checked) once.

    :raises SystemExit: a flag combination that cannot work, naming the flags.
    """
    if bool(args.curve_secret_key) != bool(args.allow_client_keys):
        raise SystemExit("zqsync worker: --curve-secret-key and --allow-client-keys go together")
    fields = {field.name for field in dataclasses.fields(settings.WorkerSettings)}
    try:
        config = settings.WorkerSettings(**{name: value for name, value in vars(args).items() if name in fields})
    except ConfigurationError as exc:
        flag = {"endpoint": "bind"}.get(exc.setting, exc.setting)  # the bind check names what it checks
        raise SystemExit(f"zqsync worker: --{flag.replace('_', '-')}: {exc}") from None
    if config.state_dir:  # here, before any child starts: each would fail on it, with a traceback
        try:
            os.makedirs(config.state_dir, exist_ok=True)
        except OSError as exc:
            raise SystemExit(f"zqsync worker: cannot open the journal in {config.state_dir}: "
                             f"{exc.strerror or exc} (--state-dir must name a directory this user can write)") from None
    return config


def cmd_worker(args: argparse.Namespace) -> int:
    """``zqsync worker``: serve until stopped; returns the exit status."""
    if args.reload:
        return run_with_reload(args, args.argv)
    if args.direct and args.router:
        raise SystemExit("zqsync worker: --direct and --router are two prefork modes: give one "
                         "(direct is the default; --direct is deprecated)")
    if (args.router or args.direct) and not args.processes:
        raise SystemExit(f"zqsync worker: --{'router' if args.router else 'direct'} goes with --processes N")
    if args.processes:
        if args.queues:
            raise SystemExit("zqsync worker: --queue needs a single process (no --processes)")
        return _run_supervisor(args)
    from gevent import monkey

    monkey.patch_all()
    from .worker.server import Worker

    registry = load_registry(args.app)
    worker = Worker(registry, settings=worker_settings(args), ready_file=args.ready_file, parent_pid=args.parent_pid)
    fdlimit.raise_soft_limit()  # every connection costs a descriptor; once the app loaded, so errors come alone
    serve_metrics(args, worker)
    return worker.serve()


def _run_supervisor(args: argparse.Namespace) -> int:
    from .worker.supervisor import Supervisor

    config = worker_settings(args)

    def serve_child(slot: int, backend: Any, ready_file: str, parent_pid: int) -> int:
        from gevent import monkey

        monkey.patch_all()
        from .worker.server import Worker

        registry = load_registry(args.app)
        # Router: CURVE ends at the supervisor's public sockets; the children listen on private ipc:// backends.
        # Direct: each child serves its clients itself, CURVE included.
        child_config = dataclasses.replace(config, curve_secret_key=None, allow_client_keys=None) if args.router \
            else config
        worker = Worker(registry, settings=child_config, backend=backend, ready_file=ready_file, parent_pid=parent_pid)
        if metrics_address(args):
            prometheus().MetricsSync(worker).start()
        return worker.serve()

    fdlimit.raise_soft_limit()  # the supervisor holds every client connection; its children inherit the limit
    with supervisor_metrics(args) as on_child_exit:
        supervisor = Supervisor(serve_child, bind=config.bind, processes=args.processes, parent_pid=args.parent_pid,
                                graceful_timeout=config.graceful_timeout, ready_file=args.ready_file,
                                on_child_exit=on_child_exit, curve_secret_key=config.curve_secret_key,
                                allow_client_keys=config.allow_client_keys if args.router else None,
                                keepalive=config.keepalive, direct=not args.router)
        return supervisor.run()


def cmd_jobs(args: argparse.Namespace) -> int:
    """``zqsync jobs``: list, requeue, purge or cancel a journal's jobs; returns the exit status."""
    from .worker.journal_api import open_journal

    if args.action == "cancel" and args.endpoints:
        return _cancel_remote(args)
    kind, target = _jobs_journal(args)
    if args.action == "recover":
        if kind != "sqlite":
            raise SystemExit("zqsync jobs recover: only a SQLite journal is recovered (PostgreSQL has its own tools)")
        return _recover(target)
    journal = open_journal(f"sqlite:///{target}" if kind == "sqlite" else target)
    try:
        if args.action == "requeue":
            return _requeue(journal, args)
        if args.action == "purge":
            return _purge(journal, args)
        if args.action == "cancel":
            return _cancel_local(journal, args)
        _list_jobs(journal, args)
    finally:
        journal.close()
    return 0


def _list_jobs(journal: Any, args: argparse.Namespace) -> None:
    """Print the jobs ``zqsync jobs`` lists, as read: ``--job-id``s at once, a state's jobs ``batch`` rows at a
    time (``iter_rows``), so memory stays flat however many there are."""
    if args.job_ids:
        rows: Iterable[Any] = journal.rows(ids=args.job_ids, limit=args.limit)
    else:
        rows = itertools.islice(journal.iter_rows(args.state or ("pending", "dead")), args.limit)
    if args.json:
        for row in rows:
            print(json.dumps(_job_json(row, journal), default=repr))
        return
    print(f"{'id':32}  {'task':20}  {'state':9}  {'tries':>5}  {'error':30}  body")
    for row in rows:
        body = _job_json(row, journal)
        call = json.dumps({"args": body["args"], "kwargs": body["kwargs"]}, default=repr)
        print(f"{row.id:32}  {row.task[:20]:20}  {body['state']:9}  {row.attempts:>5}  {(row.error or '')[:30]:30}  {call}")
    counts = journal.counts()
    print("totals: " + ", ".join(f"{state} {count}" for state, count in sorted(counts.items())) if counts else "totals: none")


def _jobs_journal(args: argparse.Namespace) -> tuple[str, str]:
    """The journal ``zqsync jobs`` acts on: ``("sqlite", state dir)`` or ``("postgresql", URL)``."""
    from .errors import ConfigurationError
    from .worker.journal import journal_path
    from .worker.journal_api import parse_journal_url

    if args.state_dir is None and args.journal is None:
        raise SystemExit(f"zqsync jobs {args.action}: needs --state-dir DIR or --journal URL"
                         + (" or --endpoint ENDPOINT" if args.action == "cancel" else ""))
    try:
        kind, target = parse_journal_url(args.journal) if args.journal else ("sqlite", args.state_dir)
    except ConfigurationError as exc:
        raise SystemExit(f"zqsync jobs: --journal: {exc}") from None
    if kind == "sqlite" and not os.path.exists(journal_path(target)):
        raise SystemExit(f"zqsync jobs: no journal in {target!r} (is it the worker's --state-dir?)")
    return kind, target


def _job_json(row: Any, journal: Any) -> dict[str, Any]:
    """A row as ``zqsync jobs --json`` prints it: ``state`` named as ``client.job()`` names it (``running``,
    ``scheduled``, ``failed``: `row_state`), the journal's in ``stored_state``."""
    from .errors import ProtocolError
    from .wire.envelope import decode_request
    from .worker.journal_calls import row_state

    fields = {key: value for key, value in row._asdict().items() if key != "body"}
    fields.update(state=row_state(row, time.time(), journal.owner_alive), stored_state=row.state)
    try:
        request = decode_request(row.body)
    except ProtocolError as exc:
        return {**fields, "args": None, "kwargs": None, "body_error": str(exc)}
    return {**fields, "args": list(request.args), "kwargs": request.kwargs}


def _recover(state_dir: str) -> int:
    from .errors import ConfigurationError
    from .worker.journal import recover

    try:
        copied, aside = recover(state_dir)
    except ConfigurationError as exc:
        raise SystemExit(f"zqsync jobs recover: {exc}") from None
    print(f"recovered {copied} job(s) into a new journal; the damaged file is kept as {aside}")
    return 0


def _requeue(journal: Any, args: argparse.Namespace) -> int:
    if bool(args.ids) == args.all_dead:
        raise SystemExit("zqsync jobs requeue: give job ids or --all-dead (not both)")
    changed = journal.requeue(args.ids, all_dead=args.all_dead)
    print(f"requeued {changed} job(s)")
    return 0 if args.all_dead or changed == len(set(args.ids)) else 1


def _cancel_ids(args: argparse.Namespace) -> list[str]:
    if not args.ids:
        raise SystemExit("zqsync jobs cancel: give the ids of the jobs to cancel")
    return list(args.ids)


def _cancel_local(journal: Any, args: argparse.Namespace) -> int:
    """Cancel pending or delayed jobs in the journal file (a running one needs --endpoint)."""
    missed = [job_id for job_id in _cancel_ids(args) if not journal.cancel(job_id)]
    for job_id in missed:
        print(f"{job_id}: not cancelled (not pending: unknown, finished, or running: use --endpoint to "
              f"interrupt a running job)")
    print(f"cancelled {len(args.ids) - len(missed)} job(s)")
    return 1 if missed else 0


def _cancel_remote(args: argparse.Namespace) -> int:
    """Cancel jobs over rpc (``Client.cancel``): pending, delayed, or running."""
    from .client.client import Client

    missed = 0
    with Client(args.endpoints) as client:
        for job_id in _cancel_ids(args):
            status = client.cancel(job_id)
            missed += status.state != "cancelled"
            print(f"{job_id}: {status.state}" + (f" (on {status.worker})" if status.worker else ""))
    return 1 if missed else 0


def _purge(journal: Any, args: argparse.Namespace) -> int:
    states = args.state or []
    if not states or "pending" in states or args.older_than is None:
        raise SystemExit("zqsync jobs purge: needs --state dead, done, cancelled and/or expired, and --older-than AGE "
                         "(pending jobs are never purged)")
    print(f"purged {journal.purge(states, args.older_than)} job(s)")
    return 0


def _curve(args: argparse.Namespace) -> Any:
    from .wire.curve import Curve

    if bool(args.curve_server_key) != bool(args.curve_secret_key):
        raise SystemExit(f"zqsync {args.command}: --curve-server-key and --curve-secret-key go together")
    return Curve.from_files(args.curve_server_key, args.curve_secret_key) if args.curve_server_key else None


def _client(args: argparse.Namespace, endpoints: Any = None) -> Any:
    from .client.client import Client

    return Client(endpoints or args.endpoint, curve=_curve(args))


def cmd_beat(args: argparse.Namespace) -> int:
    """``zqsync beat``: send ticks until TERM or INT; blocks. :raises ZqsyncError: a bad schedule or endpoint."""
    import signal

    from .beat import Beat

    registry = load_registry(args.app, "beat")
    with _client(args, args.endpoints) as client:
        def enqueue(task: str, task_args: tuple, kwargs: dict, job_id: str) -> None:
            client.enqueue_with_options(task, args=task_args, kwargs=kwargs, confirm=True, job_id=job_id)

        beat = Beat(list(registry.periodic_jobs.values()), enqueue, schedule_file=args.schedule_file or None)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: beat.stop())
        logging.getLogger(__name__).info("beat: %d periodic task(s) to %s", len(beat.schedules), ", ".join(args.endpoints))
        beat.run()
    logging.getLogger(__name__).info("beat stopped: %s", beat.counters)
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    """``zqsync call``: print the task's result as JSON. :raises ZqsyncError: the call failed."""
    with _client(args) as client:
        result = client.call_with_options(args.task, args=args.args, kwargs=args.kwargs, timeout=args.timeout)
    print(json.dumps(result, default=repr))
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    """``zqsync enqueue``: print the job id. :raises ZqsyncError: not sent, or (``--confirm``) refused."""
    with _client(args) as client:
        job_id = client.enqueue_with_options(args.task, args=args.args, kwargs=args.kwargs, send_timeout=args.timeout,
                                             confirm=args.confirm, delay=args.delay, store_result=args.store_result)
    print(job_id)
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    """``zqsync job``: print a job's status as JSON, or (``--wait``) its result.

    :raises ZqsyncError: no answer in time; with ``--wait``, the job's error (exit status 1).
    """
    args.endpoint = args.endpoints
    with _client(args) as client:
        if args.wait is not None:
            print(json.dumps(client.result(args.job_id, timeout=args.wait), default=repr))
            return 0
        status = client.job(args.job_id)
    fields = dataclasses.asdict(status)
    fields["error"] = None if status.error is None else f"{status.error.remote_type}: {status.error.remote_message}"
    print(json.dumps(fields, default=repr))
    return 0 if status.state != "unknown" else 1


def cmd_stats(args: argparse.Namespace) -> int:
    """``zqsync stats``: print a live worker's counters (a prefork worker's summed over its children).

    :raises ZqsyncError: no answer in time.
    """
    with _client(args) as client:
        stats = client.call_with_options("zqsync.stats", timeout=args.timeout)
        used = client.endpoints
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    if used != (args.endpoint,):  # a DNS name (client/discovery.py): say which workers it stands for
        print(f"{args.endpoint} resolves to {', '.join(used)}; one of them answered:")
    _print_header(stats)
    for group in ("jobs", "plain", "confirmed", "calls"):
        fields = {key[len(group) + 1:]: value for key, value in stats.items() if key.startswith(group + "_")}
        print(f"  {group:10} " + "  ".join(f"{key} {value}" for key, value in fields.items()))
    print(f"  {'other':10} in_flight {stats['in_flight']}  dropped: malformed {stats['malformed']}  "
          f"unknown_task {stats['unknown_task']}  timed_out {stats['timed_out']}")
    _print_fds(stats)
    for task, summary in sorted(stats["durations"].items()):
        print(f"  duration {task:20} n={summary['count']:<6} p50 {summary['p50'] * 1e3:.2f} ms  "
              f"p90 {summary['p90'] * 1e3:.2f} ms  p99 {summary['p99'] * 1e3:.2f} ms")
    for index, client in enumerate(stats["clients"]):
        pools = "  ".join(f"{name}: opened {client[name]['opened']} reused {client[name]['reused']}"
                          for name in ("jobs", "dealer"))
        print(f"  client {index} in tasks, to {', '.join(client.get('endpoints', ())) or '(none yet)'}: {pools}")
    return 0


def cmd_ping(args: argparse.Namespace) -> int:
    """``zqsync ping``: 0 if the worker answered within ``--timeout`` seconds, else 1 with the reason on stderr.

    :raises ConfigurationError: a malformed endpoint or CURVE key option.
    """
    from .errors import ZqsyncError

    with _client(args) as client:
        started = time.perf_counter()
        try:
            client.call_with_options("zqsync.ping", timeout=args.timeout)
        except ZqsyncError as exc:
            print(f"zqsync ping: no pong from {args.endpoint} within {args.timeout:g} s: {_error_text(exc)}",
                  file=sys.stderr)
            return 1
        elapsed = time.perf_counter() - started
    print(f"pong from {args.endpoint} in {elapsed * 1e3:.1f} ms")
    return 0


def _bind(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise SystemExit(f"zqsync dashboard: --bind must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _token(path: Optional[str]) -> Optional[str]:
    if path is None:
        return None
    with open(path) as handle:
        token = handle.read().strip()
    if len(token) < 16:
        raise SystemExit(f"zqsync dashboard: the token in {path} is shorter than 16 characters")
    return token


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``zqsync dashboard``: serve the page until interrupted. :raises ConfigurationError: off loopback without a token."""
    try:
        import flask  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"zqsync dashboard needs the web extra (pip install 'zqsync[web]'): {exc}") from exc
    from .dashboard import serve

    host, port = _bind(args.bind)
    with listening((host, port)):  # the page's bind, before it serves until interrupted
        serve(args.endpoints, host=host, port=port, token=_token(args.token_file), curve=_curve(args),
              metrics_url=args.metrics_url, interval=args.interval, ready=args.ready_file)
    return 0


def _print_fds(stats: dict[str, Any]) -> None:
    nofile = stats.get("nofile") or {}
    if nofile:  # a worker of an older release says nothing of its descriptors
        print(f"  {'fds':10} nofile soft {nofile['soft']} hard {nofile['hard']}  "
              f"fd_exhausted {stats.get('fd_exhausted', 0)}")


def _print_header(stats: dict[str, Any]) -> None:
    tasks = ", ".join(stats["tasks"])
    supervisor = stats.get("supervisor")
    if supervisor is None:
        print(f"worker pid {stats['pid']}, up {stats['uptime']:.0f} s, tasks: {tasks}")
        return
    print(f"prefork worker: supervisor pid {supervisor.get('pid')}, up {supervisor.get('uptime', 0):.0f} s, "
          f"{len(stats['children'])} children ({stats['unreachable']} unreachable), "
          f"{supervisor.get('restarts', 0)} restarts, tasks: {tasks}; totals:")
    for child in stats["children"]:
        if child["state"] == "unreachable":
            print(f"  child pid {child['pid']}: unreachable")
            continue
        counters = child["counters"]
        print(f"  child pid {child['pid']}: {child['state']}, up {child['uptime']:.0f} s, in_flight "
              f"{child['in_flight']}, jobs succeeded {counters.get('jobs_succeeded', 0)}, "
              f"calls succeeded {counters.get('calls_succeeded', 0)}")


def cmd_keygen(args: argparse.Namespace) -> int:
    """``zqsync keygen``: write a CURVE keypair. :raises ConfigurationError: the files exist."""
    from .wire.curve import keygen

    public, secret = keygen(args.dir, args.name)
    print(f"public key: {public}\nsecret key: {secret} (mode 0600; keep it private)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``zqsync demo``: run the main job on loopback; returns 0 if nothing was lost or failed."""
    from .demo import run_demo

    return run_demo(
        requests=args.requests, concurrency=args.concurrency, web_workers=args.web_workers,
        preload=not args.no_preload, timeout=args.timeout,
    )


def find_checkout(start: Optional[str] = None) -> Optional[str]:
    """The zqsync checkout holding ``benchmarks/suite.py``: ``start`` (default: cwd) or a parent; ``None`` if none."""
    here = os.path.abspath(start or os.getcwd())
    while not os.path.isfile(os.path.join(here, "benchmarks", "suite.py")):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return here


def cmd_bench(args: argparse.Namespace) -> int:
    """``zqsync bench``: run ``python -m benchmarks`` in the checkout; returns its exit status."""
    root = find_checkout()
    if root is None:
        raise SystemExit("zqsync bench: run it from a zqsync checkout (it runs benchmarks/, which is not "
                         "installed with the package): git clone the repository, then zqsync bench there")
    # A separate interpreter in the checkout: the installed package never imports benchmark code.
    return subprocess.call([sys.executable, "-m", "benchmarks", *bench_argv(args)], cwd=root)


def _error_text(exc: BaseException) -> str:
    """``Type: message``, naming the type once: a remote error's text already starts with its remote type."""
    text, name = str(exc), type(exc).__name__
    return text if text.startswith(name + ":") else f"{name}: {text}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``zqsync`` console script; returns the exit status."""
    from .errors import ZqsyncError

    args = build_parser().parse_args(argv)
    fill_endpoints(args)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_level, args.log_format, args.log_config)
    try:
        return int(args.handler(args) or 0)
    except ZqsyncError as exc:
        print(f"zqsync {args.command}: {_error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
