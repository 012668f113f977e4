"""URLs of the example shop: just the admin, where the jobs can be watched."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
