"""A run belongs to the key that started it: a colleague's runner key cannot cancel it, nor
start runs in its name, nor claim it by reusing its request id; its owner and the admin can."""

from __future__ import annotations

from waiting import wait_until

from rollout.shared import subjects
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.roles import Role
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import requests as rq
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer

from .conftest import make_key, refund_env
from .test_auth_roles import MODEL, client_for, refused_fast


async def test_only_its_owner_or_the_admin_cancels_a_run(
    service_settings: Settings, services: None, auth_nats: NatsServer
) -> None:
    alice_key: ApiKey = make_key(auth_nats, Role.RUNNER)
    bob_key: ApiKey = make_key(auth_nats, Role.RUNNER)
    alice = client_for(service_settings, alice_key)
    bob = client_for(service_settings, bob_key)
    admin = client_for(service_settings, None)
    try:
        await alice.push_environment(refund_env())
        run = await alice.create_run("refunds", MODEL, n=1, client_request_id="alice-1")

        # The run records who started it (the request's subject named the caller).
        js = await admin.jetstream()
        requested = [
            EventEnvelope.from_bytes(m.data)
            async for m in read_events(js, subjects.run_events(run["runId"]))
        ][0]
        assert requested.payload["owner"] == alice_key.user

        # Whoever reads the run sees who started it.
        async def listed_with_owner() -> bool:
            runs = await bob.list_runs()
            return any(r["runId"] == run["runId"] and r["owner"] == alice_key.user for r in runs)

        await wait_until(listed_with_owner, "the run listed with its owner", 30)

        denied = await refused_fast(bob.cancel_run(run["runId"], reason="mine now"))
        assert str(denied).startswith(
            f"run {run['runId']} was started by key {alice_key.key_id}, not by key "
            f"{bob_key.key_id}: a key may cancel only what it started"
        ), denied
        assert (await admin.get_run(run["runId"]))["status"] != "failed"

        # Nor may bob start a run in alice's name.
        denied = await refused_fast(bob.create_run("refunds", MODEL, n=1, owner=alice_key.user))
        assert str(denied).startswith(
            f"owner: key {bob_key.key_id} may start a run only for itself"
        ), denied
        # Her request id, sent by bob, names a run of bob's: he can neither claim hers nor
        # take the id of her next one first (a job's round runs, a plan's stages: predictable).
        squat = await bob.create_run("refunds", MODEL, n=2, client_request_id="alice-2")
        bobs_copy = await bob.create_run("refunds", MODEL, n=1, client_request_id="alice-1")
        assert bobs_copy["runId"] != run["runId"]
        again = await alice.create_run("refunds", MODEL, n=1, client_request_id="alice-1")
        assert again["runId"] == run["runId"]  # her retry still gets her run back
        hers = await alice.create_run("refunds", MODEL, n=1, client_request_id="alice-2")
        assert hers["runId"] != squat["runId"] and hers["n"] == 1

        ended = await alice.cancel_run(run["runId"], reason="done with it")
        assert ended["reason"].startswith("cancelled: done with it")

        # `rollout runs --mine`: only the runs this key started.
        assert await bob.caller() == bob_key.user

        async def only_bobs() -> bool:
            mine = await bob.list_runs(owner=bob_key.user)
            return {r["runId"] for r in mine} == {squat["runId"], bobs_copy["runId"]}

        await wait_until(only_bobs, "bob's runs listed as his alone", 30)
        assert await alice.list_training_jobs(owner=alice_key.user) == []

        # The admin may cancel anyone's run.
        bobs = await bob.create_run("refunds", MODEL, n=1)
        ended = await admin.cancel_run(bobs["runId"], reason="maintenance")
        assert ended["reason"].startswith("cancelled: maintenance")
    finally:
        await alice.close()
        await bob.close()
        await admin.close()


async def test_a_colleague_cannot_drive_or_fail_a_plan(
    service_settings: Settings, services: None, auth_nats: NatsServer
) -> None:
    alice_key, bob_key = make_key(auth_nats, Role.RUNNER), make_key(auth_nats, Role.RUNNER)
    alice, bob = client_for(service_settings, alice_key), client_for(service_settings, bob_key)

    def event(type_: str, version: int, **payload: object) -> rq.RecordPlanEvent:
        body = {"plan_id": "p-1", **payload}
        return rq.RecordPlanEvent(plan_id="p-1", type=type_, payload=body, expected_version=version)

    try:
        started = {"name": "p", "plan_hash": "h", "stages": ["a"]}
        # Bob cannot start it in alice's name either.
        denied = await refused_fast(
            bob.request("tracker", "record_plan_event",
                        event("plan.started", 0, owner=alice_key.user, **started))
        )  # fmt: skip
        assert str(denied).startswith(f"owner: key {bob_key.key_id} may start a plan only"), denied
        first = await alice.request(
            "tracker", "record_plan_event", event("plan.started", 0, **started)
        )
        # At the plan's newest version, bob's failure would land but for its owner.
        denied = await refused_fast(
            bob.request(
                "tracker", "record_plan_event",
                event("plan.failed", first["seq"], reason="sabotage"),
            )
        )  # fmt: skip
        assert str(denied).startswith(
            f"plan p-1 was started by key {alice_key.key_id}, not by key {bob_key.key_id}: "
            "a key may drive only what it started"
        ), denied
        assert "give it another name" in str(denied)
        moved = await alice.request(
            "tracker",
            "record_plan_event",
            event("plan.stage_started", first["seq"], stage="a", kind="run"),
        )
        assert moved["seq"] > first["seq"] and not moved["duplicate"]
    finally:
        await alice.close()
        await bob.close()
