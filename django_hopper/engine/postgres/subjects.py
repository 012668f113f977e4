"""Data-subject methods of the PostgreSQL engine; SQL in ``queries/subjects.sql``."""

from __future__ import annotations

from django_hopper.engine.params import SubjectEraseParams
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.types import CHANNEL_DONE, ErasureRow


class SubjectsMixin(PostgresSupport):
    """subject_erase."""

    def _subject_erase(self, params: SubjectEraseParams, digest: str) -> ErasureRow:
        """End the subject's live jobs, empty its history rows and ledgers, record it."""
        values = {"subject": params.subject, "now": params.now}
        with db_errors(), self._atomic():
            # Lock, then history, then live: each statement a later snapshot, so a
            # job moving between the tables meanwhile is erased where it lands.
            self._fetchall("subject_erase.lock", values)
            kept = self._fetchall("subject_erase.history", values)
            ended = self._fetchall("subject_erase", {**values, "done_channel": CHANNEL_DONE})
            ids = [r[0] for r in ended] + [r[0] for r in kept]
            steps, logs, results = 0, 0, 0
            if ids:
                counts = self._fetchone("subject_erase.ledger", {"ids": ids})
                assert counts is not None
                steps, logs, results = (int(n) for n in counts)
            fenced = [r[0] for r in ended if r[1]]
            record = self._fetchone(
                "subject_erase.record",
                {
                    "digest": digest,
                    "now": params.now,
                    "jobs": len(ids),
                    "running": len(fenced),
                    "steps": steps,
                    "logs": logs,
                    "results": results,
                },
            )
        assert record is not None
        return ErasureRow(
            id=record[0],
            subject_digest=digest,
            erased_at=record[1],
            jobs=len(ids),
            running=len(fenced),
            steps=steps,
            logs=logs,
            results=results,
            ended=[r[0] for r in ended],
            fenced=fenced,
            batches=sorted({r[2] for r in ended if r[2] is not None}),
        )
