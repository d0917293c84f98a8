from django.core.exceptions import RequestDataTooBig
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from .errors import IllegalTransition, NotAllowed, Refused
from .parsers import too_large_detail


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object is not in a state that allows this."
    default_code = "conflict"


def exception_handler(exc, context):
    if isinstance(exc, IllegalTransition):
        return Response(
            {"detail": str(exc), "current": exc.current, "requested": exc.target},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, Refused):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, NotAllowed):
        return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {"detail": too_large_detail()},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    return drf_exception_handler(exc, context)
