from django.contrib import admin
from django.urls import path

from tests.testapp.views import take_job

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/<str:job_id>/take/", take_job),
]
