import json

from django.http import HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from sandbox.control import faults
from sandbox.registry import reset_world


@csrf_exempt
def faults_view(request):
    """GET: list switches. POST {"name": ..., "times": n|null, "params": {...}}: set one
    (400 with ``known``, the list of fault names, when no stand-in reads ``name``).
    DELETE: clear all."""
    if request.method == "GET":
        return JsonResponse({"faults": faults.listing()})
    if request.method == "POST":
        try:
            body = json.loads(request.body or b"{}")
            name = body["name"]
        except (ValueError, KeyError, TypeError):
            return JsonResponse({"error": "body must be JSON with a 'name'"}, status=400)
        problem = _fault_body_problem(body)
        if problem:
            return JsonResponse({"error": problem}, status=400)
        try:
            faults.set_fault(name, times=body.get("times"), params=body.get("params") or {})
        except faults.UnknownFault as exc:
            return JsonResponse({"error": str(exc), "known": sorted(faults.KNOWN)},
                                status=400)
        return JsonResponse({"faults": faults.listing()})
    if request.method == "DELETE":
        faults.clear_faults()
        return JsonResponse({"faults": []})
    return HttpResponseNotAllowed(["GET", "POST", "DELETE"])


def _fault_body_problem(body) -> str:
    """Why a switch body is malformed ("" when it is not): a string name, times a
    non-negative integer or null, params an object."""
    if not isinstance(body.get("name"), str):
        return "'name' must be a string"
    times = body.get("times")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int)
                              or times < 0):
        return "'times' must be a non-negative integer or null"
    if body.get("params") is not None and not isinstance(body.get("params"), dict):
        return "'params' must be an object"
    return ""


@csrf_exempt
def reset_view(request):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    reset_world()
    return JsonResponse({"reset": True})
