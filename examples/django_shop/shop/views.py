"""The view that matters: the order and its receipt job commit together, or neither does."""

import json

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import skiplock

from .models import Order


class Refused(Exception):
    pass


@csrf_exempt  # an API endpoint of the example; a real one authenticates its callers
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body or b"{}")
    try:
        with transaction.atomic():
            order = Order.objects.create(total=int(body.get("total", 0)))
            job_id = skiplock.enqueue(connection, "shop.send_receipt", {"order": order.pk}, queue="mail",
                                      idempotency_key=f"receipt-{order.pk}")
            if order.total <= 0:  # a check that fails after the enqueue: both roll back
                raise Refused("total must be positive")
    except Refused as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"order": order.pk, "job": job_id}, status=201)
