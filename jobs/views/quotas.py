"""Quotas: members read their teams' usage against limits; admins write."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from accounts.permissions import IsPerson, ReadOrAdmin, is_operator
from jobs.admission import quota_usage, request_admission

from ..models import Quota
from ..serializers import QuotaSerializer
from ..validators import QuotaValidator
from ..visibility import visible_teams


def visible_quotas(user):
    quotas = Quota.objects.select_related("team", "cluster")
    if is_operator(user):
        return quotas
    return quotas.filter(team__in=visible_teams(user).values("pk"))


class QuotaListView(generics.ListAPIView):
    permission_classes = [IsPerson, ReadOrAdmin]
    serializer_class = QuotaSerializer

    def get_queryset(self):
        return visible_quotas(self.request.user)

    def get_serializer(self, *args, **kwargs):
        if kwargs.get("many"):  # a page of quotas: their usage in one query
            kwargs["context"] = {**self.get_serializer_context(),
                                 "quota_usage": quota_usage(args[0])}
        return super().get_serializer(*args, **kwargs)

    @extend_schema(request=QuotaValidator, responses={201: QuotaSerializer})
    def post(self, request):
        body = QuotaValidator(data=request.data)
        body.is_valid(raise_exception=True)
        quota = Quota.objects.create(**body.validated_data)
        request_admission(quota.cluster_id)
        return Response(QuotaSerializer(quota).data, status=status.HTTP_201_CREATED)


class QuotaDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson, ReadOrAdmin]
    serializer_class = QuotaSerializer

    def get_queryset(self):
        return visible_quotas(self.request.user)

    def get_object(self):
        return get_object_or_404(self.get_queryset(), pk=self.kwargs["pk"])

    @extend_schema(request=QuotaValidator, responses={200: QuotaSerializer})
    def patch(self, request, pk):
        quota = self.get_object()
        body = QuotaValidator(quota, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        Quota.objects.filter(pk=quota.pk).update(**body.validated_data)
        quota.refresh_from_db()
        request_admission(quota.cluster_id)
        return Response(QuotaSerializer(quota).data)

    def delete(self, request, pk):
        self.get_object().delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
