"""Views that enqueue a job and make a call through the project's default zqsync client."""

import os

from django.http import HttpRequest, JsonResponse

import zqsync
from zqsync.contrib import django as zq


def order(request: HttpRequest, order_id: int) -> JsonResponse:
    """Enqueue ``record_order`` and call ``quote``; a zqsync failure answers 502/504 as JSON."""
    try:
        job_id = zq.enqueue("record_order", order_id)
        price = zq.call("quote", int(request.GET.get("quantity", 1)), 250)
    except zqsync.ZqsyncError as exc:
        status = 504 if isinstance(exc, zqsync.CallTimeout) else 502
        return JsonResponse({"error": type(exc).__name__, "message": str(exc)}, status=status)
    return JsonResponse({"job_id": job_id, "price": price, "pid": os.getpid()})


def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})
