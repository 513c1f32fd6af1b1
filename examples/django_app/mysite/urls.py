from django.contrib import admin
from django.urls import path
from signups import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("signup/", views.signup),
    path("signup/<int:signup_id>/resend/", views.resend),
]
