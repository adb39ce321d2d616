from django.contrib import admin
from django.urls import path

admin.site.site_header = "Dunning & entitlement grace — support console"
admin.site.site_title = "Dunning support"

urlpatterns = [
    path("admin/", admin.site.urls),
]
