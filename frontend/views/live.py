"""Pages that update themselves: the page renders its fragments once, and its
JSON twin renders the same fragment templates with the same context."""

from django.http import JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string


def page(request, template: str, context: dict, live_url: str):
    return render(request, template, {**context, "live_url": live_url})


def fragments(request, partials: dict[str, str], context: dict, **extra) -> JsonResponse:
    """`partials` maps a DOM id to the template that renders its inside."""
    body = {
        "fragments": {
            dom_id: render_to_string(tpl, context, request) for dom_id, tpl in partials.items()
        },
        **extra,
    }
    return JsonResponse(body)
