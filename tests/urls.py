from __future__ import annotations

from django.contrib import admin
from django.urls import path

from example_project.urls import webhook_patterns

urlpatterns = [path("admin/", admin.site.urls), *webhook_patterns]
