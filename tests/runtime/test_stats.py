"""``stats()`` counts completions whether or not they are kept in history."""

from __future__ import annotations

from django.test import override_settings

from django_hopper import stats
from tests.support.runtime import insert
from tests.testapp import jobs


def test_stats__counts_completions_deleted_instead_of_archived(tx_engine, make_worker):
    with override_settings(HOPPER={"ARCHIVE_COMPLETED": False}):
        done = [insert(tx_engine, jobs.add, 2, 3), insert(tx_engine, jobs.add, 4, 5)]
        worker = make_worker()
        assert worker.run_once() == 2
        assert [tx_engine.job_get(job.id) for job in done] == [None, None]  # deleted
        worker.heartbeat.run_once()
        assert stats().queues["default"].completed_last_minute == 2
