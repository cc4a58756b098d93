"""An actor replica's backends: one build per model, kept once built, released when refused.

Real backends over real HTTP (a local server stands in for the model endpoint).
"""

from __future__ import annotations

import asyncio
import time

from fakes.openai_server import FakeOpenAI, Reply, text_reply

from rollout.services.actor.handlers import ActorState, Backends, check_model
from rollout.shared.contracts.requests import CheckModel
from rollout.shared.models.openai_compat import CHECK_TIMEOUT_S
from rollout.shared.settings import Settings


def actor(settings: Settings) -> ActorState:
    return ActorState(settings=settings, actor_id="test-actor", keepalive_s=5.0)


async def test_a_models_first_uses_at_once_share_one_backend() -> None:
    backends = Backends()
    model = "http://127.0.0.1:9/v1#m"
    first, second = await asyncio.gather(backends.get(model), backends.get(model))
    assert first is second and backends.loaded(model) is first


async def test_a_build_its_waiter_gave_up_on_is_kept_not_redone() -> None:
    backends = Backends()
    model = "http://127.0.0.1:9/v1#kept"
    waiter = asyncio.ensure_future(backends.get(model))
    # One step of the loop, not a wait for anything: the task's first step starts the build,
    # and the build's thread has not reported back before the cancel below.
    await asyncio.sleep(0)
    building = backends.building(model)
    assert building is not None
    waiter.cancel()  # its run ended while the model loaded
    await asyncio.wait_for(asyncio.shield(building), 10)
    assert backends.loaded(model) is building.result()


async def test_a_refused_models_backend_is_released(settings: Settings) -> None:
    state = actor(settings)
    with FakeOpenAI(lambda body: text_reply("hi"), api_key="sk-right") as server:
        model = f"{server.base_url}#m"
        reply = await check_model(CheckModel(model=model), state)
        assert "authentication failed (HTTP 401" in reply.data["problem"], reply
        # Its run is refused, so nothing would ever use it: no backend, no open connection.
        assert state.backends.loaded(model) is None
    with FakeOpenAI(lambda body: text_reply("hi")) as good:
        model = f"{good.base_url}#m"
        reply = await check_model(CheckModel(model=model), state)
        assert reply.data["problem"] is None
        assert state.backends.loaded(model) is not None  # kept for the run


async def test_an_endpoint_that_drips_its_answer_is_cut_off_at_the_checks_limit(
    settings: Settings,
) -> None:
    # A 401 whose headers come at once and whose body comes a byte a second: each read is
    # quick, so only a limit on the whole exchange stops it.
    dripping = Reply({"error": {"message": "x" * 40}}, status=401, drip=1.0)
    state = actor(settings)
    with FakeOpenAI(models=dripping) as server:
        started = time.monotonic()
        reply = await check_model(CheckModel(model=f"{server.base_url}#m"), state)
        took = time.monotonic() - started
    assert "did not answer within" in reply.data["problem"], reply
    assert took < CHECK_TIMEOUT_S + 3, took
