"""People's API tokens: created and shown once, stored hashed, listed,
revoked; `me/`; the browser's session."""

from rest_framework.test import APIClient

from accounts.models import ApiToken, hash_token


def test_a_new_token_is_shown_once_and_stored_hashed(api, owner):
    resp = api(owner).post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert resp.status_code == 201
    raw = resp.data["token"]
    token = ApiToken.objects.get(pk=resp.data["id"])
    assert raw.startswith("rgt_") and token.token_hash == hash_token(raw)
    assert raw not in str(list(ApiToken.objects.values()))
    assert token.prefix == raw[:12] and token.user == owner
    listed = api(owner).get("/api/v1/tokens/").data["results"]
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert "laptop" in [t["name"] for t in listed]


def test_a_new_token_works_and_records_its_use(api, owner):
    raw = api(owner).post("/api/v1/tokens/", {"name": "ci"}, format="json").data["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/me/").data["username"] == "olivia"
    assert ApiToken.objects.get(name="ci").last_used_at is not None


def test_a_person_lists_only_their_own_tokens(api, owner, teammate):
    api(teammate).post("/api/v1/tokens/", {"name": "toms"}, format="json")
    names = [t["name"] for t in api(owner).get("/api/v1/tokens/").data["results"]]
    assert "toms" not in names


def test_revoking_is_idempotent_and_the_token_stops_working(api, owner):
    client = api(owner)
    created = client.post("/api/v1/tokens/", {"name": "old"}, format="json").data
    assert client.delete(f"/api/v1/tokens/{created['id']}/").status_code == 204
    revoked_at = ApiToken.objects.get(pk=created["id"]).revoked_at
    assert revoked_at is not None
    assert client.delete(f"/api/v1/tokens/{created['id']}/").status_code == 204
    assert ApiToken.objects.get(pk=created["id"]).revoked_at == revoked_at
    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION=f"Bearer {created['token']}")
    assert stale.get("/api/v1/jobs/").status_code == 401


def test_nobody_revokes_another_persons_token(api, owner, teammate):
    theirs = api(teammate).post("/api/v1/tokens/", {"name": "t"}, format="json").data
    assert api(owner).delete(f"/api/v1/tokens/{theirs['id']}/").status_code == 404
    assert ApiToken.objects.get(pk=theirs["id"]).revoked_at is None


def test_a_token_needs_a_name(api, owner):
    client = api(owner)
    before = ApiToken.objects.count()
    for body in ({}, {"name": ""}, {"name": 3}, {"name": "x" * 101}, {"name": "a", "b": 1}):
        assert client.post("/api/v1/tokens/", body, format="json").status_code == 400
    assert ApiToken.objects.count() == before


def test_me_names_roles_and_teams(api, owner, operator, admin_user_, other_team):
    other_team.members.add(owner)
    assert api(owner).get("/api/v1/me/").data == {
        "username": "olivia", "is_operator": False, "is_admin": False,
        "teams": ["speech", "vision"]}
    assert api(operator).get("/api/v1/me/").data["is_operator"] is True
    admin = api(admin_user_).get("/api/v1/me/").data
    assert admin["is_operator"] is True and admin["is_admin"] is True


def test_the_browser_session_authenticates(owner):
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="olivia", password="pw-olivia")
    assert client.get("/api/v1/me/").data["username"] == "olivia"
    # A write without the CSRF token is refused: a session alone is not enough.
    assert client.post("/api/v1/tokens/", {"name": "x"}, format="json").status_code == 403


def test_anonymous_and_garbage_tokens_get_401(db):
    assert APIClient().get("/api/v1/me/").status_code == 401
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer rgt_not-a-token")
    assert client.get("/api/v1/me/").status_code == 401
