"""What the CLI prints from the server (names, reasons, messages) never
reaches the terminal as control characters: an ESC sequence in a job's
name could recolour or rewrite what an operator reads."""

import json

from tests.frontend.factories import make_job

HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\rjob"


def test_list_and_show_print_control_characters_escaped(logged_in, owner, team, cluster):
    # Stored as the model allows; the API hands such strings out as they are.
    job = make_job(team, cluster, name="evil", pending_reason=f"waiting {HOSTILE}")
    job.__class__.objects.filter(pk=job.pk).update(name=HOSTILE)
    regatta = logged_in(owner)
    for args in (("list",), ("show", job.pk)):
        out = regatta(*args).output
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out, args
        assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\rjob" in out, (args, out)
    # Scripts get the string itself (JSON escapes it).
    listed = json.loads(regatta("list", "--json").output)
    assert listed["results"][0]["name"] == HOSTILE
