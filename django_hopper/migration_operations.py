"""Migration operations for what Django's own cannot express.

* History is a time-partitioned table on engines that support it (PostgreSQL),
  so retention drops partitions instead of deleting rows. The model state is
  Django's ordinary ``CreateModel``; only the DDL differs.
* Some indexes only make sense on one engine (GIN on jsonb); they are gated by
  the engine's capability flags, never by a vendor check here.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, router
from django.utils.module_loading import import_string

from django_hopper.engine import ENGINES, get_engine
from django_hopper.engine.params import HistoryIndexDeclareParams


def _features(schema_editor: Any) -> Any:

    path = ENGINES.get(schema_editor.connection.vendor)
    if path is None:
        return None
    return import_string(path).features


class CreatePartitionedModel(migrations.CreateModel):
    """``CreateModel`` that builds a range-partitioned table (with a DEFAULT
    partition) where the engine supports history partitions."""

    def __init__(self, *args: Any, partition_key: str, **kwargs: Any) -> None:
        self.partition_key = partition_key
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        name, args, kwargs = super().deconstruct()
        kwargs["partition_key"] = self.partition_key
        return name, args, kwargs

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        features = _features(schema_editor)
        if not (features and features.supports_history_partitions):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return None
        qn = schema_editor.quote_name
        table = model._meta.db_table
        columns = []
        all_params: list[Any] = []
        for f in model._meta.local_fields:
            definition, params = schema_editor.column_sql(model, f, include_default=False)
            if definition is None:
                continue
            definition = definition.replace(" PRIMARY KEY", "")
            columns.append(f"{qn(f.column)} {definition}")
            all_params.extend(params or [])
        pk = model._meta.pk.column
        columns.append(f"PRIMARY KEY ({qn(pk)}, {qn(self.partition_key)})")
        schema_editor.execute(
            f"CREATE TABLE {qn(table)} ({', '.join(columns)}) "
            f"PARTITION BY RANGE ({qn(self.partition_key)})",
            all_params or None,
        )
        schema_editor.execute(
            f"CREATE TABLE {qn(table + '_default')} PARTITION OF {qn(table)} DEFAULT"
        )
        for index in model._meta.indexes:
            schema_editor.add_index(model, index)
        for constraint in model._meta.constraints:
            schema_editor.add_constraint(model, constraint)
        return None

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        super().database_backwards(app_label, schema_editor, from_state, to_state)


class RunSQLIf(migrations.RunSQL):
    """``RunSQL`` applied only where the engine has the named capability."""

    def __init__(self, feature: str, sql: Any, reverse_sql: Any = None, **kwargs: Any) -> None:
        self.feature = feature
        super().__init__(sql, reverse_sql, **kwargs)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        name, args, kwargs = super().deconstruct()
        kwargs["feature"] = self.feature
        return name, args, kwargs

    def _applies(self, schema_editor: Any) -> bool:
        features = _features(schema_editor)
        return bool(features and getattr(features, self.feature))

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._applies(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._applies(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)


def _concurrently(schema_editor: Any) -> bool:
    """Whether index DDL should run concurrently: where writers run side by side.

    A single-writer engine (SQLite) has no concurrent writers to keep going
    and no concurrent build.
    """
    features = _features(schema_editor)
    return bool(features and not features.single_writer)


class AddIndexConcurrently(migrations.AddIndex):
    """``AddIndex`` that builds without blocking writes where writers run concurrently.

    ``CREATE INDEX CONCURRENTLY`` takes a SHARE UPDATE EXCLUSIVE lock, which
    inserts, claims and finalizes never wait for; a plain ``CREATE INDEX`` holds
    a SHARE lock, which stops every write to the table until the build ends.
    It cannot run in a transaction: the migration says ``atomic = False``.

    A build that fails, or a ``migrate`` killed during it, leaves the index
    behind, invalid, and the migration unrecorded. Run again, the operation
    rebuilds an invalid index of its name (dropping it concurrently first),
    and keeps a valid one: an earlier run built it and stopped before
    recording the migration.
    """

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if not _concurrently(schema_editor):
            schema_editor.add_index(model, self.index)
            return
        left = get_engine(schema_editor.connection.alias).index_valid(self.index.name)
        if left is True:
            return
        if left is False:
            schema_editor.remove_index(model, self.index, concurrently=True)
        schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if _concurrently(schema_editor):
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


class RemoveIndexConcurrently(migrations.RemoveIndex):
    """``RemoveIndex`` as ``DROP INDEX CONCURRENTLY`` where writers run concurrently.

    A plain ``DROP INDEX`` takes an ACCESS EXCLUSIVE lock on the table, and
    while it waits for one every later query queues behind it.
    """

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if _concurrently(schema_editor):
            schema_editor.remove_index(model, index, concurrently=True)
        else:
            schema_editor.remove_index(model, index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if _concurrently(schema_editor):
            schema_editor.add_index(model, index, concurrently=True)
        else:
            schema_editor.add_index(model, index)


class RequireCode(migrations.operations.base.Operation):
    """Declare that code built for schema versions below ``version`` must not run.

    Put it in a migration that removes or changes what earlier code relies on
    (a dropped column, a changed meaning). Workers of older code then refuse
    to start against the migrated database, naming both versions, instead of
    failing job by job. Migrating backwards removes the declaration.
    """

    reversible = True
    reduces_to_sql = False

    def __init__(self, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"RequireCode needs a positive schema version, not {version!r}")
        self.version = version

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__name__, [self.version], {}

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Change no model state: the declaration is a row."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        floor = to_state.apps.get_model("django_hopper", "SchemaFloor")
        if self.allow_migrate_model(schema_editor.connection.alias, floor):
            floor.objects.using(schema_editor.connection.alias).get_or_create(
                code_version=self.version
            )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        floor = from_state.apps.get_model("django_hopper", "SchemaFloor")
        if self.allow_migrate_model(schema_editor.connection.alias, floor):
            floor.objects.using(schema_editor.connection.alias).filter(
                code_version=self.version
            ).delete()

    def describe(self) -> str:
        return f"Require code built for hopper schema {self.version} or later"


class AddHistoryIndex(migrations.AddIndex):
    """``AddIndex`` on partitioned history without building it in the migration.

    Where history is partitioned, ``CREATE INDEX ... ON ONLY`` declares the
    index on the parent alone: a catalog change that waits for no build (a
    partitioned table cannot build concurrently). The leader's
    ``HistoryIndexer`` then builds each partition's index concurrently and
    attaches it; the parent's index is valid once every partition has one.
    Elsewhere (one history table) it is an ordinary ``AddIndex``.
    """

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        features = _features(schema_editor)
        if not (features and features.supports_history_partitions):
            schema_editor.add_index(model, self.index)
            return
        sql = str(self.index.create_sql(model, schema_editor))
        table = schema_editor.quote_name(model._meta.db_table)
        schema_editor.execute(sql.replace(f" ON {table} ", f" ON ONLY {table} ", 1))


class IndexSQL(migrations.operations.base.Operation):
    """Create (``drop=False``) or drop (``drop=True``) one index written as SQL,
    where the engine has ``feature``; the reverse does the opposite.

    For indexes Django's model state cannot express on every engine (GIN on
    jsonb), so they change no model state. ``definition`` is the tail after
    ``ON <table>``, e.g. ``USING gin (tags) WHERE tags <> '[]'::jsonb``.

    On a live table where writers run concurrently, the create is
    ``CREATE INDEX CONCURRENTLY`` and the drop ``DROP INDEX CONCURRENTLY``
    (the migration says ``atomic = False``); the create is re-runnable like
    :class:`AddIndexConcurrently`: a valid index of that name is kept (an
    earlier run built it and stopped before recording the migration), an
    invalid one is dropped concurrently and built again. On partitioned
    history (``history=True`` where the engine partitions it) the create
    declares the index on the parent only (``ON ONLY``: a catalog change; the
    leader's ``HistoryIndexer`` builds each partition's concurrently), and the
    drop is a plain ``DROP INDEX`` (a partitioned index cannot be dropped
    concurrently): a catalog change under a brief ACCESS EXCLUSIVE lock on
    history, which also drops each partition's copy a pass left unattached.
    Both first wait for a ``HistoryIndexer`` pass under way
    (``BaseEngine.history_index_declare``), so the two never interleave.
    """

    reversible = True
    reduces_to_sql = False

    def __init__(
        self,
        feature: str,
        name: str,
        table: str,
        definition: str,
        *,
        drop: bool = False,
        history: bool = False,
    ) -> None:
        self.feature = feature
        self.name = name
        self.table = table
        self.definition = definition
        self.drop = drop
        self.history = history

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "feature": self.feature,
            "name": self.name,
            "table": self.table,
            "definition": self.definition,
        }
        if self.drop:
            kwargs["drop"] = True
        if self.history:
            kwargs["history"] = True
        return self.__class__.__name__, [], kwargs

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Change no model state: the index is SQL only."""

    def _history(self, schema_editor: Any, drop: bool) -> None:
        get_engine(schema_editor.connection.alias).history_index_declare(
            HistoryIndexDeclareParams(name=self.name, definition=self.definition, drop=drop)
        )

    def _create(self, schema_editor: Any, features: Any) -> None:
        qn = schema_editor.quote_name
        if self.history and features.supports_history_partitions:
            self._history(schema_editor, drop=False)
            return
        if features.single_writer:
            schema_editor.execute(
                f"CREATE INDEX IF NOT EXISTS {qn(self.name)} ON {qn(self.table)} {self.definition}"
            )
            return
        left = get_engine(schema_editor.connection.alias).index_valid(self.name)
        if left is True:
            return
        if left is False:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {qn(self.name)}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {qn(self.name)} ON {qn(self.table)} {self.definition}"
        )

    def _drop(self, schema_editor: Any, features: Any) -> None:
        qn = schema_editor.quote_name
        if self.history and features.supports_history_partitions:
            self._history(schema_editor, drop=True)
        elif features.single_writer:
            schema_editor.execute(f"DROP INDEX IF EXISTS {qn(self.name)}")
        else:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {qn(self.name)}")

    def _allowed(self, app_label: str, schema_editor: Any, state: Any) -> bool:
        """Whether the router lets this app migrate on the alias, asked for the
        model of ``table`` as Django's index operations ask: an alias a router
        keeps hopper out of has no hopper tables to index."""
        alias = schema_editor.connection.alias
        for model in state.apps.get_app_config(app_label).get_models():
            if model._meta.db_table == self.table:
                return self.allow_migrate_model(alias, model)
        return bool(router.allow_migrate(alias, app_label))

    def _apply(self, schema_editor: Any, create: bool) -> None:
        features = _features(schema_editor)
        if not (features and getattr(features, self.feature)):
            return
        if create:
            self._create(schema_editor, features)
        else:
            self._drop(schema_editor, features)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(app_label, schema_editor, to_state):
            self._apply(schema_editor, create=not self.drop)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(app_label, schema_editor, to_state):
            self._apply(schema_editor, create=self.drop)

    def describe(self) -> str:
        verb = "Drop" if self.drop else "Create"
        return f"{verb} index {self.name} on {self.table} (where {self.feature})"
