"""Job lists whose rows the engine decodes: one stored value that does not decode
never fails the page.

Django's ORM converts every column of a row as it reads it, and a value it cannot
convert (a UUID or a time SQLite stores as text that does not parse) raises for
the whole page. The job lists therefore read only the IDs of a page through the
ORM (filters, ordering and pagination stay the ORM's), and the rows through the
engine, which decodes tolerantly (``engine/decode.py``): a bad value reads as its
empty value and the row carries ``decode_error`` naming it.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model, QuerySet
from django.http import HttpRequest

from django_hopper.admin.common import request_alias
from django_hopper.admin.pagination import HopperChangeList
from django_hopper.engine import get_engine
from django_hopper.engine.params import JobListParams
from django_hopper.types import JobRow

#: The attribute of a listed model instance holding the row the engine decoded.
DECODED = "_hopper_row"


def decoded_row(obj: Model) -> JobRow | None:
    """Return the engine's row of a listed job (None outside a decoded list)."""
    return getattr(obj, DECODED, None)


def _stored(row: JobRow, name: str) -> Any:
    """Return a JobRow field as the model stores it (JSON shapes for the JSON columns)."""
    value = getattr(row, name)
    if name == "errors":
        return [e.to_json() for e in value]
    if name == "progress" and value is not None:
        return value.to_json()
    return value


class DecodedChangeList(HopperChangeList):
    """A job list that reads the page's IDs through the ORM and its rows through the engine."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        """Read only the ID of each row: nothing the ORM could fail to convert."""
        return super().get_queryset(request, exclude_parameters).only("id")

    def get_results(self, request: HttpRequest) -> None:
        """Fill the page's rows from the engine's tolerant read, in the page's order."""
        super().get_results(request)
        page: list[Any] = list(self.result_list)  # type: ignore[has-type]
        ids = tuple(obj.pk for obj in page)
        decoded: dict[Any, JobRow] = {}
        if ids:
            engine = get_engine(request_alias(request))
            rows = engine.job_list(JobListParams(ids=ids, limit=len(ids)))
            decoded = {row.id: row for row in rows}
        names = [f.attname for f in self.model._meta.concrete_fields if f.attname != "id"]
        # A job deleted between the two reads is left out; one that moved between
        # the live table and history is shown as it is now.
        page = [obj for obj in page if obj.pk in decoded]
        for obj in page:
            row = decoded[obj.pk]
            for name in names:
                if hasattr(row, name):
                    setattr(obj, name, _stored(row, name))
            setattr(obj, DECODED, row)
        self.result_list = page
