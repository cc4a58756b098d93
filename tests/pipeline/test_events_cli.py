"""`rollout events` on bad input: one `error:` line naming the flag, never a traceback; an id
with no events is no run (plan), as `show` and `replay` say."""

from __future__ import annotations

import asyncio
import json

from kit import refund_env
from test_cli_platform import rollout

NOT_A_SUBJECT = "not a NATS subject"
REFUSED = {
    ("--since", "-5"): "--since: must be a sequence number >= 1, got -5",
    ("--since", "0"): "--since: must be a sequence number >= 1, got 0",
    ("--subject-filter", "foo bar"): "--subject-filter 'foo bar': "
    f"{NOT_A_SUBJECT} (spaces and control characters are not allowed)",
    ("--subject-filter", ""): f"--subject-filter '': {NOT_A_SUBJECT} (empty token)",
    ("--subject-filter", "rollout..evt"): f"--subject-filter 'rollout..evt': {NOT_A_SUBJECT} "
    "(empty token)",
    ("--subject-filter", "rollout.>.run"): f"--subject-filter 'rollout.>.run': {NOT_A_SUBJECT} "
    "('>' may only be the last token)",
    ("--subject-filter", "rollout.evts.>"): "--subject-filter 'rollout.evts.>': matches no "
    "event (the events stream holds rollout.evt.>)",
    ("--run", "a b"): "run id 'a b' must be",
    ("--run", "r1", "--plan", "p1"): "--run and --plan: give one of them",
}


async def test_bad_flags_are_one_error_line(nats_settings) -> None:
    # Refused before anything is asked of NATS (so the session's bare server will do).
    results = await asyncio.gather(*(rollout(nats_settings, "events", *args) for args in REFUSED))
    for (args, message), (code, out, err) in zip(REFUSED.items(), results, strict=True):
        assert code == 1 and out == "", (args, out, err)
        assert err.startswith(f"error: {message}"), (args, err)
        assert "Traceback" not in err, (args, err)


async def test_an_id_with_no_events_is_no_run_or_plan(client, settings) -> None:
    await client.push_environment(refund_env(tasks=1))
    code, out, err = await rollout(settings, "events", "--run", "nosuch")
    assert (code, out, err.strip()) == (1, "", "error: no run 'nosuch' (see `rollout runs`)")
    code, out, err = await rollout(settings, "events", "--plan", "nosuch")
    assert (code, out, err.strip()) == (1, "", "error: no plan 'nosuch'")
    # Valid filters still read the log: wildcards in the middle, `>` at the end.
    for where in ("rollout.evt.env.>", "rollout.*.env.refunds.*", ">"):
        code, out, err = await rollout(settings, "events", "--subject-filter", where, "--json")
        assert code == 0, (where, err)
        assert [json.loads(line)["type"] for line in out.splitlines()] == ["env.registered"]
