from django.contrib import admin

from shop.models import Charge, Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "email", "total_cents", "created_at", "confirmed_at")


@admin.register(Charge)
class ChargeAdmin(admin.ModelAdmin):
    list_display = ("id", "order", "attempt", "succeeded", "created_at")
