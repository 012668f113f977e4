"""The URLconf of ``python -m bench.admin``: the admin alone."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
