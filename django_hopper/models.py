"""The schema, as Django models: the source of truth for every hopper table.

The ORM serves the admin and listings; the hot paths (insert, claim, finalize)
run the engine's raw SQL against the same tables. Keep the two in step: a
column the engine writes is declared here first, and `makemigrations --check`
must stay clean.

Times are stored in UTC. On SQLite, Django stores datetimes as text
(``YYYY-MM-DD HH:MM:SS.ffffff``); the SQLite engine always writes the
microseconds so that text order is time order.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from django_hopper.types import (
    FINAL_STATES,
    LIVE_STATES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    DependencyFailure,
    JobState,
    Vocabulary,
)


def _choices(vocabulary: type[Vocabulary]) -> list[tuple[str, str]]:
    """Return a vocabulary of :mod:`django_hopper.types` as field choices (label = value)."""
    return [(word, word) for word in vocabulary.values()]


class JobBase(models.Model):
    """Columns shared by live jobs and history.

    ``id`` is a UUIDv7, so ID order is creation order. ``fence`` numbers the
    job's claims and never repeats; every write an attempt makes is
    conditional on it.
    """

    id = models.UUIDField(primary_key=True, editable=False)
    kind = models.CharField(max_length=255)
    queue = models.CharField(max_length=128)
    state = models.CharField(max_length=16, choices=_choices(JobState))
    priority = models.SmallIntegerField(default=0)
    attempt = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=25)
    scheduled_at = models.DateTimeField()
    attempted_at = models.DateTimeField(null=True, blank=True)
    attempted_by = models.BigIntegerField(null=True, blank=True)
    fence = models.BigIntegerField(default=0)
    args = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # A list of AttemptError objects: {"at", "attempt", "fence", "error", "trace", "rescue"}.
    errors = models.JSONField(default=list, blank=True)
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    ordering_key = models.CharField(max_length=255, null=True, blank=True)
    partition_key = models.CharField(max_length=255, null=True, blank=True)
    tags = models.JSONField(default=list, blank=True)
    batch_id = models.UUIDField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Await: announce the finalize on the done channel.
    awaited = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    snooze_reason = models.TextField(null=True, blank=True)
    # {"step": str, "cursor": <json> | null, "at": iso time} or null.
    progress = models.JSONField(null=True, blank=True)
    # Job leases (claim by ID): the random token that owns a running job with no
    # client, and when that lease expires by database time.
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_renewed_at = models.DateTimeField(null=True, blank=True)
    # Pass leases of resumable runs (docs/resumable.md): when the pass holding the
    # job BEGAN (null: it has not, and a claim that never began costs no attempt),
    # and the run's consecutive claims that did not begin (null: none). Written on
    # the live table only; history has them so that its columns stay the live ones.
    lease_began_at = models.DateTimeField(null=True, blank=True)
    admission_misses = models.IntegerField(null=True, blank=True)
    # When a worker claimed the running job ahead of a free slot, to start it from
    # its local buffer (null: claimed into a free slot, or not running). A rescue
    # cannot tell whether such a job started, so it counts an admission miss
    # instead of charging an attempt. Written on the live table only.
    claimed_ahead_at = models.DateTimeField(null=True, blank=True)
    # The job's step name within its workflow (WorkflowInsertParams.Steps), or null.
    step = models.CharField(max_length=255, null=True, blank=True)
    # The data subject whose data the job carries (erase_subject finds it by this
    # key), or null; an erasure clears it with the rest.
    subject = models.CharField(max_length=255, null=True, blank=True)
    # When erase_subject removed the job's data, or null.
    erased_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.state})"


class Job(JobBase):
    """A live job: pending, available, scheduled, retryable or running."""

    class Meta:
        db_table = "hopper_job"
        verbose_name = "live job"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=LIVE_STATES), name="hopper_job_state_live"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="hopper_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1, attempt__gte=0, fence__gte=0),
                name="hopper_job_counts",
            ),
            models.CheckConstraint(
                condition=~Q(state="running") | Q(attempted_at__isnull=False),
                name="hopper_job_running_attempted",
            ),
            models.CheckConstraint(
                condition=Q(snooze_reason__isnull=True) | Q(state="scheduled"),
                name="hopper_job_snooze_scheduled",
            ),
            models.CheckConstraint(condition=~Q(queue=""), name="hopper_job_queue_not_empty"),
            models.UniqueConstraint(
                fields=["kind", "unique_key"],
                condition=Q(unique_key__isnull=False),
                name="hopper_job_unique_key",
            ),
        ]
        indexes = [
            # The claim: the best available jobs of a queue, in claim order. Jobs
            # with an ordering key are claimed through their key's head instead
            # (hopper_job_ordering), so they never sit in the plain claim's way.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "scheduled_at",
                "id",
                condition=Q(state="available", ordering_key__isnull=True),
                name="hopper_job_claim",
            ),
            # Promotion of due scheduled / retryable jobs.
            models.Index(
                fields=["queue", "scheduled_at"],
                condition=Q(state__in=("scheduled", "retryable")),
                name="hopper_job_due",
            ),
            # Rescue and stats: running jobs per client.
            models.Index(
                fields=["attempted_by", "attempted_at"],
                condition=Q(state="running"),
                name="hopper_job_running",
            ),
            models.Index(
                fields=["expires_at"],
                condition=Q(expires_at__isnull=False),
                name="hopper_job_expires",
            ),
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(lease_expires_at__isnull=False),
                name="hopper_job_lease",
            ),
            models.Index(
                fields=["batch_id"],
                condition=Q(batch_id__isnull=False),
                name="hopper_job_batch",
            ),
            models.Index(
                fields=["subject"],
                condition=Q(subject__isnull=False),
                name="hopper_job_subject",
            ),
            models.Index(
                fields=["queue", "ordering_key", "id"],
                condition=Q(ordering_key__isnull=False),
                name="hopper_job_ordering",
            ),
            # The claim's window on keyed jobs: a queue's keyed candidates in claim
            # order, so the claim finds the best heads without walking every key
            # (docs/queue-controls.md). The claim SQL repeats the condition word for
            # word (SQLite matches partial indexes by their terms, and pins this one
            # by INDEXED BY).
            models.Index(
                "queue",
                models.F("priority").desc(),
                "scheduled_at",
                "id",
                condition=Q(
                    ordering_key__isnull=False, state__in=("available", "scheduled", "retryable")
                ),
                name="hopper_job_keyed",
            ),
            models.Index(fields=["kind", "id"], name="hopper_job_kind"),
            models.Index(fields=["state", "queue", "id"], name="hopper_job_state"),
        ]


class JobHistory(JobBase):
    """A finalized job: completed, canceled or discarded.

    On PostgreSQL the table is partitioned by ``finalized_at`` (see the
    initial migration), so retention drops whole partitions; the model still
    names ``id`` as the key, which is unique in practice because a job is in
    history at most once at a time.
    """

    finalized_at = models.DateTimeField()
    output = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "hopper_job_history"
        verbose_name = "finished job"
        verbose_name_plural = "job history"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=FINAL_STATES), name="hopper_history_state_final"
            ),
        ]
        indexes = [
            models.Index(
                fields=["kind", "unique_key"],
                condition=Q(unique_key__isnull=False),
                name="hopper_history_unique",
            ),
            models.Index(fields=["finalized_at"], name="hopper_history_finalized"),
            models.Index(fields=["kind", "id"], name="hopper_history_kind"),
            models.Index(fields=["state", "queue", "id"], name="hopper_history_state"),
            models.Index(
                fields=["batch_id"],
                condition=Q(batch_id__isnull=False),
                name="hopper_history_batch",
            ),
            models.Index(
                fields=["subject"],
                condition=Q(subject__isnull=False),
                name="hopper_history_subject",
            ),
        ]


class ResumableRun(Job):
    """A live run of a ``@resumable`` kind: its job row, listed on its own admin page.

    A proxy (no table): the admin lists runs by their step, cursor and pass
    lease, which the job list does not show.
    """

    class Meta:
        proxy = True
        verbose_name = "resumable run"
        verbose_name_plural = "resumable runs"


class FinishedRun(JobHistory):
    """A finished run of a ``@resumable`` kind (a proxy of history, no table)."""

    class Meta:
        proxy = True
        verbose_name = "finished resumable run"
        verbose_name_plural = "finished resumable runs"


class Erasure(models.Model):
    """That a data subject's data was erased: when, and how many rows, never the data.

    The subject is kept as its SHA-256 digest only, so "was this subject
    erased?" can be answered by whoever knows the subject, and the record
    itself names nobody.
    """

    id = models.BigAutoField(primary_key=True)
    subject_digest = models.CharField(max_length=64)
    erased_at = models.DateTimeField()
    # Job rows erased (live and history), of which were running (their attempt fenced).
    jobs = models.IntegerField(default=0)
    running = models.IntegerField(default=0)
    # Step-ledger rows, attempt logs and dependency results deleted.
    steps = models.IntegerField(default=0)
    logs = models.IntegerField(default=0)
    results = models.IntegerField(default=0)

    class Meta:
        db_table = "hopper_erasure"
        indexes = [models.Index(fields=["subject_digest"], name="hopper_erasure_subject")]

    def __str__(self) -> str:
        return f"erasure {self.id} at {self.erased_at:%Y-%m-%d %H:%M:%S}"


class JobLog(models.Model):
    """One attempt's log lines, kept apart from the hot job row."""

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField()
    attempt = models.IntegerField()
    snoozed = models.BooleanField(default=False)
    log = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_job_log"
        indexes = [models.Index(fields=["job_id", "id"], name="hopper_job_log_job")]

    def __str__(self) -> str:
        return f"log of {self.job_id} attempt {self.attempt}"


class Queue(models.Model):
    """A known queue, its pause switch and its cluster-wide limits.

    Unlimited, unpaused queues are never touched by the claim; the limited
    claim path locks this row and keeps the rate limit's token bucket here.
    """

    name = models.CharField(max_length=128, primary_key=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    global_limit = models.IntegerField(null=True, blank=True)
    rate_per_sec = models.FloatField(null=True, blank=True)
    rate_burst = models.IntegerField(null=True, blank=True)
    partition_limit = models.IntegerField(null=True, blank=True)
    aging = models.DurationField(null=True, blank=True)
    # Token bucket state of the rate limit.
    rate_tokens = models.FloatField(null=True, blank=True)
    rate_refilled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "hopper_queue"
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="hopper_queue_name_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name


class Client(models.Model):
    """A worker process's lease. A client whose lease expired is fenced."""

    id = models.BigAutoField(primary_key=True)
    hostname = models.CharField(max_length=255)
    started_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    info = models.JSONField(default=dict, blank=True)
    #: Jobs this client completed without archiving them, per queue, over the
    #: minute before its last renewal: ``stats`` adds them to the history's count.
    completed = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "hopper_client"
        indexes = [models.Index(fields=["expires_at"], name="hopper_client_expires")]

    def __str__(self) -> str:
        return f"client {self.id} on {self.hostname}"


class Leader(models.Model):
    """The leader lease: at most one row per election name, held by one client."""

    name = models.CharField(max_length=64, primary_key=True, default="default")
    client_id = models.BigIntegerField()
    elected_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_leader"

    def __str__(self) -> str:
        return f"leader {self.client_id}"


class Batch(models.Model):
    """A batch (or the batch behind a workflow): progress and callbacks.

    Finalizing statements never update this row (that would serialize them);
    they append :class:`BatchProgress` rows, which ``batch_settle`` folds in.
    """

    id = models.UUIDField(primary_key=True, editable=False)
    # Set for workflows.
    name = models.CharField(max_length=255, null=True, blank=True)
    is_workflow = models.BooleanField(default=False)
    total = models.IntegerField()
    # Jobs not yet finalized, and those canceled or discarded, as last folded.
    pending = models.IntegerField()
    failed = models.IntegerField(default=0)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    metadata = models.JSONField(default=dict, blank=True)
    # Callback jobs (serialized JobInsertParams) inserted at completion.
    on_success = models.JSONField(null=True, blank=True)
    on_failure = models.JSONField(null=True, blank=True)
    on_complete = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "hopper_batch"
        verbose_name_plural = "batches"
        constraints = [
            models.CheckConstraint(
                condition=Q(total__gte=0, pending__gte=0, failed__gte=0),
                name="hopper_batch_counts",
            ),
        ]
        indexes = [
            models.Index(
                fields=["id"], condition=Q(completed_at__isnull=True), name="hopper_batch_open"
            ),
        ]

    def __str__(self) -> str:
        return self.name or str(self.id)


class BatchProgress(models.Model):
    """Progress a finalize recorded for a batch, not yet folded into it."""

    id = models.BigAutoField(primary_key=True)
    batch_id = models.UUIDField()
    done = models.IntegerField()
    failed = models.IntegerField(default=0)

    class Meta:
        db_table = "hopper_batch_progress"
        indexes = [models.Index(fields=["batch_id"], name="hopper_batch_progress_batch")]


class JobDependency(models.Model):
    """An edge of a workflow: ``job_id`` waits for ``depends_on``."""

    id = models.BigAutoField(primary_key=True)
    workflow_id = models.UUIDField()
    job_id = models.UUIDField()
    depends_on = models.UUIDField()
    on_failure = models.CharField(
        max_length=16, choices=_choices(DependencyFailure), default=DependencyFailure.CANCEL.value
    )
    reads = models.BooleanField(default=False)

    class Meta:
        db_table = "hopper_job_dependency"
        constraints = [
            models.UniqueConstraint(fields=["job_id", "depends_on"], name="hopper_dep_edge"),
            models.CheckConstraint(
                condition=~Q(job_id=models.F("depends_on")), name="hopper_dep_not_self"
            ),
        ]
        indexes = [
            models.Index(fields=["depends_on"], name="hopper_dep_depends_on"),
            models.Index(fields=["workflow_id"], name="hopper_dep_workflow"),
        ]


class DependencyResult(models.Model):
    """The final state and output of a workflow job that a dependent reads."""

    job_id = models.UUIDField(primary_key=True)
    workflow_id = models.UUIDField()
    step = models.CharField(max_length=255, null=True, blank=True)
    state = models.CharField(max_length=16, choices=_choices(JobState))
    output = models.JSONField(null=True, blank=True)
    finalized_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_dependency_result"
        indexes = [models.Index(fields=["workflow_id"], name="hopper_dep_result_workflow")]


class PeriodicSlot(models.Model):
    """A periodic job's state: the last slot inserted (a slot produces one job at most),
    and whether an operator disabled it.

    ``last_slot`` is NULL for a job disabled before its first slot.
    ``enabled_at`` is when an operator last enabled it: slots before then
    were skipped while it was disabled and are never caught up.
    """

    name = models.CharField(max_length=255, primary_key=True)
    last_slot = models.DateTimeField(null=True, blank=True)
    job_id = models.UUIDField(null=True, blank=True)
    inserted_at = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    enabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "hopper_periodic_slot"

    def __str__(self) -> str:
        return self.name


class PeriodicRegistration(models.Model):
    """A periodic job as a live client declared it (definition and digest)."""

    id = models.BigAutoField(primary_key=True)
    client_id = models.BigIntegerField()
    name = models.CharField(max_length=255)
    definition = models.JSONField()
    digest = models.CharField(max_length=128)
    registered_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_periodic_registration"
        constraints = [
            models.UniqueConstraint(fields=["client_id", "name"], name="hopper_periodic_reg"),
        ]

    def __str__(self) -> str:
        return self.name


class JobStep(models.Model):
    """The step ledger of a resumable job's current pass.

    A row is written as each named step completes; ``result`` not null is what
    means completed (a step returning nothing stores JSON ``null`` inside the
    wrapper ``{"value": ...}``). The rows of a pass are dropped when the pass
    commits its cursor, so the ledger holds one pass's worth of steps.
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField()
    step = models.CharField(max_length=255)
    result = models.JSONField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(null=True, blank=True)
    recorded_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_job_step"
        constraints = [
            models.UniqueConstraint(fields=["job_id", "step"], name="hopper_job_step_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.step}"


class Subscription(models.Model):
    """A pub/sub subscription: each publish to a matching topic inserts a delivery job."""

    name = models.CharField(max_length=255, primary_key=True)
    # An AMQP topic pattern ("orders.*", "orders.#").
    pattern = models.CharField(max_length=255)
    kind = models.CharField(max_length=255)
    queue = models.CharField(max_length=128)
    max_attempts = models.IntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    # Paused: publishes still make its deliveries, held until it is resumed.
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_subscription"

    def __str__(self) -> str:
        return self.name


class StreamEvent(models.Model):
    """An event of the stream log, at position (xid, seq).

    On PostgreSQL ``xid`` is the appending transaction's id (xid8), so a
    consumer can tell events of transactions still in flight from those it has
    read; on SQLite (one writer) it is 0 and ``seq`` alone orders the log.
    """

    seq = models.BigAutoField(primary_key=True)
    xid = models.BigIntegerField(default=0)
    topic = models.CharField(max_length=255)
    key = models.CharField(max_length=255, null=True, blank=True)
    payload = models.JSONField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    message_id = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_stream_event"
        indexes = [
            models.Index(fields=["xid", "seq"], name="hopper_stream_position"),
            models.Index(fields=["created_at"], name="hopper_stream_created"),
            models.Index(fields=["topic", "seq"], name="hopper_stream_topic"),
        ]

    def __str__(self) -> str:
        return f"{self.topic} #{self.seq}"


class StreamConsumer(models.Model):
    """A stream consumer: turns events after its position into delivery jobs."""

    name = models.CharField(max_length=255, primary_key=True)
    pattern = models.CharField(max_length=255)
    kind = models.CharField(max_length=255)
    queue = models.CharField(max_length=128)
    max_attempts = models.IntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    # earliest | latest
    start = models.CharField(max_length=16, default="latest")
    # PostgreSQL: the pg_snapshot every delivered transaction is visible in.
    snapshot = models.TextField(null=True, blank=True)
    position_xid = models.BigIntegerField(default=0)
    position_seq = models.BigIntegerField(default=0)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Paused: no pump delivers its events; its position waits where it is.
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "hopper_stream_consumer"

    def __str__(self) -> str:
        return self.name


class SchemaFloor(models.Model):
    """The oldest code a migrated schema still serves, one row per declaration.

    A migration that removes or changes what earlier code relies on declares,
    with ``migration_operations.RequireCode(N)``, that code built for schema
    versions below ``N`` must not run against it any more. A worker reads the
    largest ``code_version`` at start and refuses to run if it is built for an
    older schema (``django_hopper.schema.check``).
    """

    code_version = models.IntegerField(primary_key=True)
    declared_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "hopper_schema_floor"

    def __str__(self) -> str:
        return f"code >= {self.code_version}"
