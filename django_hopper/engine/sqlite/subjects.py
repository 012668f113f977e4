"""Data-subject methods of the SQLite engine; SQL in ``queries/subjects.sql``."""

from __future__ import annotations

import json
import uuid

from django_hopper.engine.params import SubjectEraseParams
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.types import ErasureRow


class SubjectsMixin(SQLiteSupport):
    """subject_erase."""

    @translate_errors
    def _subject_erase(self, params: SubjectEraseParams, digest: str) -> ErasureRow:
        """End the subject's live jobs, empty its history rows and ledgers, record it."""
        now, now_s = self._now(params.now)
        values = {"subject": params.subject, "now": now_s}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["subject_erase"], values)
            ended = c.fetchall()
            if ended:
                c.execute(Q["subject_erase.progress"], values)
                c.execute(Q["subject_erase.archive"], values)
                c.execute(Q["subject_erase.delete"], values)
            c.execute(Q["subject_erase.history"], values)
            ids = [r[0] for r in ended] + [r[0] for r in c.fetchall()]
            counts = {"steps": 0, "logs": 0, "results": 0}
            if ids:
                for name in counts:
                    c.execute(Q[f"subject_erase.{name}"], {"ids": json.dumps(ids)})
                    counts[name] = c.rowcount
            fenced = [r[0] for r in ended if r[1]]
            c.execute(
                Q["subject_erase.record"],
                {
                    "digest": digest,
                    "now": now_s,
                    "jobs": len(ids),
                    "running": len(fenced),
                    **counts,
                },
            )
            record = c.fetchone()
        return ErasureRow(
            id=record[0],
            subject_digest=digest,
            erased_at=now,
            jobs=len(ids),
            running=len(fenced),
            ended=[uuid.UUID(r[0]) for r in ended],
            fenced=[uuid.UUID(i) for i in fenced],
            batches=sorted({uuid.UUID(r[2]) for r in ended if r[2] is not None}),
            **counts,
        )
