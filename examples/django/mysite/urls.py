from django.urls import path
from shop import views

urlpatterns = [
    path("order/<int:order_id>", views.order),
    path("health", views.health),
]
