"""The Prometheus endpoint as a Django view, for operators to mount in ``urls.py``::

    from django_hopper.observability.views import metrics

    urlpatterns = [path("hopper/metrics", metrics), ...]

Protected like the admin: an active staff user's session, or a scraper's
``Authorization: Bearer <token>`` matching ``HOPPER["METRICS_TOKEN"]`` when
that is set. The queue depths it reports are cluster-wide (one query per
scrape); its job counters are those of the serving process (enqueues made
there), the workers' are on ``hopper_worker --metrics-port``.
"""

from __future__ import annotations

import hmac

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse

from django_hopper.conf import hopper_settings
from django_hopper.observability import metrics as hopper_metrics


def _token_ok(request: HttpRequest) -> bool:

    token = str(hopper_settings.METRICS_TOKEN or "")
    header = request.headers.get("Authorization", "")
    if not token or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())


def _exposition(request: HttpRequest) -> HttpResponse:

    if not hopper_metrics.prometheus_available():
        return HttpResponse(
            "prometheus-client is not installed: pip install 'django-hopper[prometheus]'\n",
            status=501,
            content_type="text/plain",
        )
    import prometheus_client  # noqa: PLC0415 - optional dependency

    hopper_metrics.prometheus()
    body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
    return HttpResponse(body, content_type=prometheus_client.CONTENT_TYPE_LATEST)


_staff_exposition = staff_member_required(_exposition)


def metrics(request: HttpRequest) -> HttpResponse:
    """Return the Prometheus exposition to staff (or to a scraper with the token)."""
    if _token_ok(request):
        return _exposition(request)
    return _staff_exposition(request)
