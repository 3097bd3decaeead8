import json

from django.http import HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from sandbox.control import faults
from sandbox.registry import reset_world


@csrf_exempt
def faults_view(request):
    """GET: list switches. POST {"name": ..., "times": n|null, "params": {...}}: set one.
    DELETE: clear all."""
    if request.method == "GET":
        return JsonResponse({"faults": faults.listing()})
    if request.method == "POST":
        try:
            body = json.loads(request.body or b"{}")
            name = body["name"]
        except (ValueError, KeyError):
            return JsonResponse({"error": "body must be JSON with a 'name'"}, status=400)
        faults.set_fault(name, times=body.get("times"), params=body.get("params") or {})
        return JsonResponse({"faults": faults.listing()})
    if request.method == "DELETE":
        faults.clear_faults()
        return JsonResponse({"faults": []})
    return HttpResponseNotAllowed(["GET", "POST", "DELETE"])


@csrf_exempt
def reset_view(request):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    reset_world()
    return JsonResponse({"reset": True})
