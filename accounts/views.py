from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsPerson, is_operator

from .models import ApiToken
from .serializers import ApiTokenSerializer, MeSerializer, NewApiTokenSerializer
from .throttles import spend
from .validators import TokenValidator


def own_tokens(user):
    if not user.is_authenticated:  # the schema generator asks as nobody
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)


class TokenListView(generics.ListAPIView):
    """The caller's own API tokens; POST creates one and shows it once."""

    permission_classes = [IsPerson]
    serializer_class = ApiTokenSerializer

    def get_queryset(self):
        return own_tokens(self.request.user).order_by("-created_at", "-id")

    @extend_schema(request=TokenValidator, responses={
        201: NewApiTokenSerializer,
        429: OpenApiResponse(description="Too many tokens created lately "
                                         "(REGATTA_TOKEN_CREATE_RATE); see Retry-After.")})
    def post(self, request):
        body = TokenValidator(data=request.data)
        body.is_valid(raise_exception=True)
        # Only tokens made count: a refused request (400) costs nothing.
        with spend("token_create", request.user.pk):
            token, raw = ApiToken.issue(request.user, body.validated_data["name"])
        token.token = raw
        return Response(NewApiTokenSerializer(token).data, status=status.HTTP_201_CREATED)


class TokenDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = ApiTokenSerializer

    def get_queryset(self):
        return own_tokens(self.request.user)

    def delete(self, request, pk):
        """Revoke; idempotent (a revoked token stays listed, marked revoked)."""
        get_object_or_404(self.get_queryset(), pk=pk).revoke()
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    permission_classes = [IsPerson]

    @extend_schema(responses=MeSerializer)
    def get(self, request):
        user = request.user
        return Response(MeSerializer({
            "username": user.get_username(),
            "is_operator": is_operator(user),
            "is_admin": user.is_superuser,
            "teams": list(user.teams.order_by("name").values_list("name", flat=True)),
        }).data)
