"""An environment slug belongs to the key that pushed its first version: a colleague's key cannot
push a new version of it (and so replace the tasks or verifier everyone's runs of it use); its
owner and the admin can, identical content still dedups for anyone, and other slugs are free."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from auth.conftest import make_key, refund_env
from auth.test_auth_roles import client_for, refused_fast
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.roles import Role
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import EnvRegistered
from rollout.shared.envs.coerce import as_spec
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer
from rollout.shared.store.env_versions import env_subject


@pytest.fixture
def keys(auth_nats: NatsServer) -> tuple[ApiKey, ApiKey]:
    """Two runner keys, minted before the services connect (a reload may drop a connect)."""
    return make_key(auth_nats, Role.RUNNER), make_key(auth_nats, Role.RUNNER)


def env(slug: str = "refunds", *, pass_everything: bool = False, tasks: int = 1) -> dict:
    """The refund env under `slug`; `pass_everything`: a verifier any agent passes."""
    spec: dict[str, Any] = refund_env() | {"slug": slug}
    if pass_everything:
        # Nothing to do is the ground truth: an agent that does nothing scores 1.
        spec["tasks"] = [{"instruction": "Refund order O-1 in full", "hiddenGroundTruth": {}}]
    spec["tasks"] = [
        task | {"instruction": f"{task['instruction']} ({n})"} if n else task
        for n in range(tasks)
        for task in spec["tasks"]
    ]
    return spec


def refusal(slug: str, owner: ApiKey, pusher: ApiKey) -> str:
    """The registry's words for `pusher`'s push of `owner`'s slug."""
    return (
        f"environment {slug!r} belongs to key {owner.key_id} (it pushed the first version), not "
        f"to key {pusher.key_id}: a key may push new versions only of its own environments; "
        "push yours under another slug, or ask its owner (or whoever holds the admin "
        "credentials) to push this one"
    )


async def owners_on_the_log(js: Any, slug: str) -> list[tuple[int, str | None]]:
    """(version, owner) of every env.registered of `slug`, in order."""
    return [
        (e.payload["version"], e.payload.get("owner"))
        async for m in read_events(js, env_subject(slug))
        if (e := EventEnvelope.from_bytes(m.data))
    ]


async def test_a_colleague_cannot_push_over_an_environment(
    service_settings: Settings, keys: tuple[ApiKey, ApiKey], services: None, pg_dsn: str
) -> None:
    alice_key, bob_key = keys
    alice, bob = (client_for(service_settings, key) for key in keys)
    admin = client_for(service_settings, None)
    try:
        first = await alice.push_environment(env())
        assert (first["version"], first["created"], first["owner"]) == (1, True, alice_key.user)

        # Bob's pass-everything verifier under her slug is refused at once, in one line.
        denied = await refused_fast(bob.push_environment(env(pass_everything=True)))
        assert str(denied) == refusal("refunds", alice_key, bob_key), denied
        assert "\n" not in str(denied) and not denied.problems
        newest = await bob.get_environment("refunds")
        assert (newest["version"], newest["spec_hash"]) == (1, first["spec_hash"])

        # Her exact content, pushed by anyone, is still her version: nothing new to refuse.
        same = await bob.push_environment(env())
        assert (same["version"], same["created"], same["owner"]) == (1, False, alice_key.user)

        # Her own next version, and the admin's, are accepted; the slug stays hers.
        mine = await alice.push_environment(env(tasks=2))
        assert (mine["version"], mine["created"], mine["owner"]) == (2, True, alice_key.user)
        fixed = await admin.push_environment(env(tasks=3))
        assert (fixed["version"], fixed["created"], fixed["owner"]) == (3, True, alice_key.user)
        denied = await refused_fast(bob.push_environment(env(tasks=4)))
        assert str(denied) == refusal("refunds", alice_key, bob_key), denied

        # Another slug is bob's, and alice in turn cannot push over it.
        his = await bob.push_environment(env("bobs-refunds", pass_everything=True))
        assert (his["version"], his["created"], his["owner"]) == (1, True, bob_key.user)
        denied = await refused_fast(alice.push_environment(env("bobs-refunds")))
        assert str(denied) == refusal("bobs-refunds", bob_key, alice_key), denied
        again = await bob.push_environment(env("bobs-refunds", tasks=2))
        assert (again["version"], again["owner"]) == (2, bob_key.user)

        # The owner is on each env.registered (the request's subject named the caller) ...
        js = await admin.jetstream()
        assert await owners_on_the_log(js, "refunds") == [(n, alice_key.user) for n in (1, 2, 3)]
        assert await owners_on_the_log(js, "bobs-refunds") == [(1, bob_key.user), (2, bob_key.user)]
        # ... and in the read model.
        conn = await asyncpg.connect(pg_dsn)
        try:

            async def projected() -> bool:
                rows = await conn.fetch("select slug, owner from environments order by slug")
                return [tuple(r) for r in rows] == [("bobs-refunds", bob_key.user)] * 2 + [
                    ("refunds", alice_key.user)
                ] * 3

            await wait_until(projected, "the owners projected into environments", 30)
        finally:
            await conn.close()
    finally:
        await alice.close()
        await bob.close()
        await admin.close()


async def test_two_keys_racing_for_a_new_slug_one_owns_it(
    service_settings: Settings, keys: tuple[ApiKey, ApiKey], services: None
) -> None:
    clients = [client_for(service_settings, key) for key in keys]
    try:
        results = await asyncio.gather(
            clients[0].push_environment(env("race")),
            clients[1].push_environment(env("race", pass_everything=True)),
            return_exceptions=True,
        )
        [won] = [r for r in results if isinstance(r, dict)]
        [lost] = [r for r in results if isinstance(r, BaseException)]
        assert won["version"] == 1 and won["created"], won
        winner, loser = keys if won["owner"] == keys[0].user else keys[::-1]
        assert won["owner"] == winner.user
        assert isinstance(lost, RolloutError) and str(lost) == refusal("race", winner, loser)
    finally:
        for client in clients:
            await client.close()


async def test_a_slug_from_before_owners_stays_open(
    service_settings: Settings, keys: tuple[ApiKey, ApiKey], services: None
) -> None:
    alice, bob = (client_for(service_settings, key) for key in keys)
    admin = client_for(service_settings, None)
    try:
        # Version 1 as the registry wrote it before owners were kept (no owner).
        spec = as_spec(env("legacy"))
        old = EnvRegistered(
            slug="legacy", version=1, spec_hash=spec.spec_hash(), name=spec.name,
            template=spec.template, task_count=len(spec.tasks), spec=spec.to_json_dict(),
        )  # fmt: skip
        envelope = EventEnvelope.new(old, aggregate_id="legacy", id_parts=("legacy", 1))
        await EventPublisher(await admin.jetstream()).publish(envelope, expected_last_subject_seq=0)
        assert (await bob.get_environment("legacy"))["owner"] is None

        # Not checked, as runs and jobs from before owners: any key may push, and it stays open.
        for client, tasks in ((bob, 2), (alice, 3)):
            out = await client.push_environment(env("legacy", tasks=tasks))
            assert (out["version"], out["created"], out["owner"]) == (tasks, True, None)
    finally:
        await alice.close()
        await bob.close()
        await admin.close()
