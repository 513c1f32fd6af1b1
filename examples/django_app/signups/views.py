from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from signups.models import Signup
from signups.tasks import send_welcome


@csrf_exempt
@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    """Create a signup and enqueue its welcome job in one transaction: a referral to an unknown
    email fails the request after the enqueue, and rolls both back; an email already signed up
    is a conflict (409), with nothing enqueued."""
    try:
        with transaction.atomic():
            signup = Signup.objects.create(email=request.POST["email"])
            message_id = send_welcome.enqueue(signup.id)
            referred_by = request.POST.get("referred_by")
            if referred_by:
                referrer = Signup.objects.select_for_update().get(email=referred_by)
                referrer.referrals += 1
                referrer.save(update_fields=["referrals"])
    except Signup.DoesNotExist:
        return JsonResponse({"error": "unknown referrer"}, status=400)
    except IntegrityError:
        return JsonResponse({"error": "already signed up"}, status=409)
    return JsonResponse({"id": signup.id, "message_id": message_id}, status=201)


@csrf_exempt
@require_POST
def resend(request: HttpRequest, signup_id: int) -> JsonResponse:
    """Enqueue the welcome job again, outside any atomic(): the enqueue commits by itself, at
    once, like any autocommit write, so it stays even if the request fails after it."""
    message_id = send_welcome.delay(signup_id)
    if request.POST.get("fail"):
        raise RuntimeError("failed after the enqueue")
    return JsonResponse({"message_id": message_id}, status=202)
