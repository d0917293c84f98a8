from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from accounts.models import ApiToken, hash_token


def test_it_prints_a_working_token_and_stores_its_hash(owner):
    out = StringIO()
    call_command("issue_token", "olivia", "--name", "laptop", stdout=out)
    raw = out.getvalue().strip()
    token = ApiToken.objects.get(name="laptop")
    assert token.user == owner and token.token_hash == hash_token(raw)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/me/").data["username"] == "olivia"


def test_it_refuses_an_unknown_user(db):
    with pytest.raises(CommandError, match="no active user"):
        call_command("issue_token", "nobody")
    assert not ApiToken.objects.exists()
