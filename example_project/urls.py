from __future__ import annotations

from django.contrib import admin
from django.urls import path

from example_project import views

webhook_patterns = [path("hooks/<slug:source>/", views.webhook, name="webhook")]

urlpatterns = [path("admin/", admin.site.urls), *webhook_patterns]
