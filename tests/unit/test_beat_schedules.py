"""Schedules and the beat loop's catch-up policy, on a fake clock."""

import pytest

from zqsync.beat import Beat, Periodic
from zqsync.errors import ConfigurationError, Unconfirmed
from zqsync.worker import Registry


class FakeClock:
    """Wall-clock seconds that move only when the beat waits (or a test says so)."""

    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def _beat(schedules, clock, sent, fail=()):
    def enqueue(task, args, kwargs, job_id):
        sent.append((task, job_id, clock.now))
        if job_id in fail:
            raise Unconfirmed(job_id, 1.0, "no worker")

    def wait(seconds):  # the loop's sleep: advance the clock; stop after 10 ticks were sent
        clock.now += seconds
        if len(sent) >= 10:
            beat.stop()

    beat = Beat(schedules, enqueue, clock=clock, wait=wait)
    return beat


def test_every_ticks_on_epoch_multiples_and_ids_are_the_same_for_every_beat():
    periodic = Periodic.build("t", every=2.5)
    assert periodic.next_after(10.0) == 12.5 and periodic.next_after(11.0) == 12.5
    assert periodic.latest_at(12.4) == 10.0 and periodic.latest_at(12.5) == 12.5
    assert periodic.job_id(12.5) == Periodic.build("t", every=9).job_id(12.5) != periodic.job_id(15.0)
    assert periodic.job_id(12.5) != Periodic.build("u", every=2.5).job_id(12.5)
    assert len(Periodic.build("x" * 200, every=1).job_id(1e10)) <= 64


def test_cron_is_parsed_by_cronsim_in_utc():
    periodic = Periodic.build("t", cron="*/5 * * * *")
    assert periodic.next_after(0.0) == 300.0 and periodic.next_after(300.0) == 600.0
    assert periodic.latest_at(300.0) == 300.0 and periodic.latest_at(299.0) == 0.0


@pytest.mark.parametrize("options", [{}, {"every": 1, "cron": "* * * * *"}, {"every": 0}, {"every": float("nan")},
                                     {"cron": "61 * * * *"}, {"every": 1, "catch_up": "all"}])
def test_bad_schedules_are_refused_at_registration(options):
    registry = Registry()
    with pytest.raises(ConfigurationError):
        registry.periodic(**options)(lambda: None)
    assert len(registry) == 0 and not registry.periodic_jobs


def test_skip_starts_at_the_next_tick_and_latest_sends_the_last_one_first():
    for catch_up, first in (("skip", 101.0), ("latest", 100.0)):
        sent, clock = [], FakeClock(100.5)
        _beat([Periodic.build("t", every=1, catch_up=catch_up)], clock, sent).run()
        assert [job_id for _, job_id, _ in sent] == [Periodic.build("t", every=1).job_id(first + n) for n in range(10)]


@pytest.mark.parametrize("catch_up, resumed_at", [("skip", 132.0), ("latest", 130.0)])
def test_a_late_beat_skips_the_ticks_that_passed_or_all_but_the_latest(catch_up, resumed_at):
    periodic = Periodic.build("t", every=1, catch_up=catch_up)
    sent, clock = [], FakeClock(100.5)

    def enqueue(task, args, kwargs, job_id):
        sent.append(job_id)
        if len(sent) == 2:
            clock.now += 29.0  # this send blocked for 29 s, past 29 ticks

    def wait(seconds):
        clock.now += seconds
        if len(sent) >= 4:
            beat.stop()

    beat = Beat([periodic], enqueue, clock=clock, wait=wait)
    beat.run()
    expected = [101.0 if catch_up == "skip" else 100.0]
    expected += [expected[0] + 1, resumed_at, resumed_at + 1]
    assert sent == [periodic.job_id(tick) for tick in expected]
    assert beat.counters["ticks_skipped"] == resumed_at - expected[1] - 1


def test_a_tick_that_is_not_confirmed_is_counted_and_the_beat_goes_on():
    periodic = Periodic.build("t", every=1)
    sent, clock = [], FakeClock(100.5)
    beat = _beat([periodic], clock, sent, fail={periodic.job_id(102.0)})
    beat.run()
    assert len(sent) == 10 and beat.counters == {"ticks_sent": 9, "ticks_failed": 1, "ticks_skipped": 0}


def test_a_beat_without_periodic_tasks_is_refused():
    with pytest.raises(ConfigurationError, match="no periodic tasks"):
        Beat([], lambda *args: None)


@pytest.mark.parametrize("jump", [3600.0, -3600.0])
@pytest.mark.parametrize("catch_up", ["skip", "latest"])
def test_a_clock_that_jumps_during_a_wait_sends_no_stale_tick(catch_up, jump):
    periodic = Periodic.build("t", every=300, catch_up=catch_up)  # every 5 minutes, like cron "*/5 * * * *"
    ten_ten = 10 * 3600 + 10 * 60  # 10:10 on the epoch's first day
    sent, clock, jumped = [], FakeClock(ten_ten - 180.0), []

    def enqueue(task, args, kwargs, job_id):
        sent.append((job_id, clock.now, bool(jumped)))

    def wait(seconds):
        clock.now += seconds
        if not jumped:
            jumped.append(True)
            clock.now += jump  # NTP, a suspended VM, an operator: the wall clock moves during the wait
        if sum(after for _, _, after in sent) >= 2:
            beat.stop()

    beat = Beat([periodic], enqueue, clock=clock, wait=wait)
    beat.run()
    ticks = {periodic.job_id(ten_ten + 300 * n): ten_ten + 300 * n for n in range(-20, 20)}
    for job_id, at, _ in sent:
        assert 0 <= at - ticks[job_id] < 300, f"a tick sent {at - ticks[job_id]:.0f} s after it was due"
    first_after = next(ticks[job_id] for job_id, _, after in sent if after)
    if jump > 0:  # 10:10 .. 11:10 passed during the wait: all skipped, or all but 11:10, sent once
        assert first_after == ten_ten + (3600 if catch_up == "latest" else 3900)
        assert beat.counters["ticks_skipped"] == (12 if catch_up == "latest" else 13)
    else:  # back an hour: 10:10 is sent once the clock reaches it again
        assert first_after == ten_ten and beat.counters["ticks_skipped"] == 0


@pytest.mark.parametrize("catch_up", ["skip", "latest"])
def test_a_restarted_beat_counts_and_logs_the_ticks_it_missed_while_down(catch_up, tmp_path, caplog):
    """The schedule file (Celery beat's ``celerybeat-schedule``) keeps each task's last handled tick, so
    a beat restarted after downtime knows which ticks passed while no beat ran."""
    periodic = Periodic.build("t", every=10, catch_up=catch_up)
    schedule = str(tmp_path / "beat-schedule.json")

    def run_until(clock, sent_count):
        sent = []

        def enqueue(task, args, kwargs, job_id):
            sent.append(job_id)

        def wait(seconds):
            clock.now += seconds
            if len(sent) >= sent_count:
                beat.stop()

        beat = Beat([periodic], enqueue, clock=clock, wait=wait, schedule_file=schedule)
        beat.run()
        return beat, sent

    clock = FakeClock(1000.5)
    first, sent = run_until(clock, 3)
    first_ticks = (1000.0, 1010.0, 1020.0) if catch_up == "latest" else (1010.0, 1020.0, 1030.0)
    assert sent == [periodic.job_id(t) for t in first_ticks] and first.counters["ticks_skipped"] == 0
    clock.now = 1065.0  # down until 1065: the ticks after the last one sent, up to 1060, passed unsent
    with caplog.at_level("WARNING", logger="zqsync.beat"):
        second, sent = run_until(clock, 1)
    if catch_up == "latest":  # 1030, 1040 and 1050 skipped; 1060, the latest, sent once
        assert (second.counters["ticks_skipped"], sent) == (3, [periodic.job_id(1060.0)])
    else:  # 1040, 1050 and 1060 skipped; the next, 1070, sent on time
        assert (second.counters["ticks_skipped"], sent) == (3, [periodic.job_id(1070.0)])
    assert "skipped" in caplog.text and "while the beat was late" in caplog.text


def test_ticks_are_utc_and_a_local_dst_change_moves_no_tick(monkeypatch):
    """Ticks are UTC instants: across Europe/Berlin's spring-forward and fall-back nights a daily
    ``cron`` tick is neither sent twice nor skipped, and stays at the same UTC time."""
    import time as time_module

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time_module.tzset()
    try:
        periodic = Periodic.build("t", cron="30 1 * * *")
        for night in (1774746000.0, 1792890000.0):  # 2026-03-29 01:00 UTC and 2026-10-25 01:00 UTC
            ticks, tick = [], night - 2 * 86400
            while tick < night + 2 * 86400:
                tick = periodic.next_after(tick)
                ticks.append(tick)
            assert all(later - earlier == 86400 for earlier, later in zip(ticks, ticks[1:])), ticks
            assert all(tick % 86400 == 1 * 3600 + 30 * 60 for tick in ticks)
    finally:
        monkeypatch.delenv("TZ")
        time_module.tzset()
