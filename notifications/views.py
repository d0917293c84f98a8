"""A team's webhooks: its members (and operators) list, create, change and
delete them, read their delivery log, send a test ping and retry a delivery.
Another team's webhook is not found (404), as its jobs are not."""

from django.db import transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from accounts.permissions import IsPerson
from accounts.throttles import spend
from controlplane.lib.api import Conflict
from jobs.visibility import visible_teams

from . import delivery
from .models import Delivery, Webhook
from .serializers import DeliverySerializer, NewWebhookSerializer, WebhookSerializer
from .validators import WebhookUpdateValidator, WebhookValidator


def visible_webhooks(user):
    return (Webhook.objects.select_related("team", "created_by")
            .filter(team__in=visible_teams(user).values("pk")))


class WebhookListView(generics.ListAPIView):
    """The webhooks of the caller's teams; POST creates one and shows its
    secret once."""

    permission_classes = [IsPerson]
    serializer_class = WebhookSerializer

    @extend_schema(parameters=[OpenApiParameter("team", str, description="Only this team's.")])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        hooks = visible_webhooks(self.request.user)
        team = self.request.query_params.get("team")
        return hooks.filter(team__name=team) if team else hooks

    @extend_schema(request=WebhookValidator, responses={201: NewWebhookSerializer})
    def post(self, request):
        body = WebhookValidator(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        webhook = Webhook.objects.create(created_by=request.user, **body.validated_data)
        return Response(NewWebhookSerializer(webhook).data, status=status.HTTP_201_CREATED)


class WebhookScopedMixin:
    permission_classes = [IsPerson]

    def get_webhook(self) -> Webhook:
        return get_object_or_404(visible_webhooks(self.request.user), pk=self.kwargs["pk"])


class WebhookDetailView(WebhookScopedMixin, generics.RetrieveAPIView):
    serializer_class = WebhookSerializer

    def get_object(self):
        return self.get_webhook()

    @extend_schema(request=WebhookUpdateValidator, responses={200: WebhookSerializer})
    def patch(self, request, pk):
        webhook = self.get_webhook()
        body = WebhookUpdateValidator(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        Webhook.objects.filter(pk=webhook.pk).update(**body.validated_data)
        webhook.refresh_from_db()
        return Response(WebhookSerializer(webhook).data)

    def delete(self, request, pk):
        self.get_webhook().delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateSecretView(WebhookScopedMixin, generics.GenericAPIView):
    serializer_class = NewWebhookSerializer

    @extend_schema(request=None, responses={200: NewWebhookSerializer})
    def post(self, request, pk):
        """A new signing secret, shown once; the old one signs beside it for
        24 hours, so the receiver can switch without dropping a delivery."""
        webhook = self.get_webhook()
        webhook.rotate_secret(timezone.now())
        return Response(NewWebhookSerializer(webhook).data)


class WebhookDeliveriesView(WebhookScopedMixin, generics.ListAPIView):
    """The webhook's delivery log, newest first."""

    serializer_class = DeliverySerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no webhook
            return Delivery.objects.none()
        return self.get_webhook().deliveries.order_by("-created_at", "-id")


# Each ping or retry makes the control plane send a signed request: one
# person's are throttled together (REGATTA_WEBHOOK_SEND_RATE), counting
# only those that send.
SEND_THROTTLED = OpenApiResponse(description="Too many pings and retries sent lately "
                                             "(REGATTA_WEBHOOK_SEND_RATE); see Retry-After.")


class WebhookPingView(WebhookScopedMixin, generics.GenericAPIView):
    serializer_class = DeliverySerializer

    @extend_schema(request=None, responses={
        202: DeliverySerializer,
        409: OpenApiResponse(description="The webhook is not active."),
        429: SEND_THROTTLED})
    def post(self, request, pk):
        """Send a test delivery (type webhook.ping) now; its result shows in
        the delivery log."""
        webhook = self.get_webhook()
        if not webhook.active:
            raise Conflict("The webhook is not active: activate it first.")
        with spend("webhook_send", request.user.pk), transaction.atomic():
            sent = delivery.ping(webhook, timezone.now())
        return Response(DeliverySerializer(sent).data, status=status.HTTP_202_ACCEPTED)


class DeliveryRetryView(generics.GenericAPIView):
    permission_classes = [IsPerson]
    serializer_class = DeliverySerializer

    @extend_schema(request=None, responses={
        202: DeliverySerializer,
        409: OpenApiResponse(description="The delivery was delivered already."),
        429: SEND_THROTTLED})
    def post(self, request, pk):
        """Try a delivery again now, even one given up on; 409 if it was
        delivered already."""
        found = get_object_or_404(
            Delivery.objects.filter(webhook__in=visible_webhooks(request.user).values("pk")),
            pk=pk)
        with spend("webhook_send", request.user.pk), transaction.atomic():
            if not delivery.retry_now(found, timezone.now()):
                raise Conflict("This delivery was delivered already.")
        found.refresh_from_db()
        return Response(DeliverySerializer(found).data, status=status.HTTP_202_ACCEPTED)
