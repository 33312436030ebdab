"""The shop app's tasks: found by ``manage.py zqsync_worker`` through autodiscovery."""

from django.conf import settings

from zqsync.worker import Registry

registry = Registry()


@registry.task(retries=2, backoff=0.5)
def record_order(order_id: int) -> None:
    """Append the order to ``settings.SHOP_ORDERS_LOG`` (stands in for a slow side effect)."""
    with open(settings.SHOP_ORDERS_LOG, "a") as log:
        log.write(f"order {order_id}\n")


@registry.task(time_limit=5.0)
def quote(quantity: int, unit_cents: int) -> dict:
    """The order's price, in the project's currency (read from the Django settings in the worker)."""
    return {"cents": quantity * unit_cents, "currency": settings.SHOP_CURRENCY}
