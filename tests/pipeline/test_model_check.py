"""A run on a model the actors cannot generate with is refused before it starts, in their words.

The tracker asks an actor replica (`actor.check_model`) once a request is otherwise accepted:
the actor builds the backend as it would for the run (a local model's weights, an endpoint's
key from its own environment) and asks an endpoint whether it is there and takes the key.
"""

from __future__ import annotations

import nats.errors
import pytest
from fakes.openai_server import FakeOpenAI, error_reply
from pipeline.kit import refund_agent, refund_env
from test_outcomes import closed_port
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.tracker.servable import TIMEOUT_ENV
from rollout.shared import subjects
from rollout.shared.contracts.requests import CheckModel
from rollout.shared.settings import Settings, connect_nats


async def actors_answer(settings: Settings) -> None:
    """Wait until an actor replica answers model checks (it subscribes as it starts)."""
    nc = await connect_nats(settings)
    body = CheckModel(model="local/scripted").model_dump_json().encode()

    async def answered() -> bool:
        try:
            await nc.request(subjects.request("actor", "check_model"), body, timeout=5)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False
        return True

    try:
        await wait_until(answered, "an actor to answer model checks", 60)
    finally:
        await nc.close()


async def refused(client: AsyncClient, model: str) -> str:
    """The refusal of a run of `model`, all its problems in one text."""
    with pytest.raises(RolloutError) as caught:
        await client.create_run("refunds", model, n=2)
    return f"{caught.value} {' '.join(caught.value.problems)}"


async def no_runs(client: AsyncClient) -> None:
    assert await client.list_runs() == [], "a refused run must record nothing"


async def test_an_endpoint_the_actors_cannot_reach_is_refused(client, settings) -> None:
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    url = f"http://127.0.0.1:{closed_port()}/v1#m"
    why = await refused(client, url)
    assert f"the actors cannot generate with '{url}'" in why, why
    assert "cannot reach http://127.0.0.1:" in why, why
    await no_runs(client)


async def test_a_key_the_endpoint_refuses_is_refused(client, settings) -> None:
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    # The server wants a key; loopback endpoints get none (the operator's policy).
    with FakeOpenAI(refund_agent, api_key="sk-right") as server:
        why = await refused(client, f"{server.base_url}#m")
        assert "authentication failed (HTTP 401" in why, why
        assert [r.method for r in server.requests] == ["GET"], "nothing was generated"
    await no_runs(client)


async def test_a_provider_whose_key_the_actors_lack_is_refused(
    client, settings, monkeypatch
) -> None:
    # The actors read the key from their own environment (in-process here: this one).
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ROLLOUT_MODEL_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    why = await refused(client, "openai/gpt-4o-mini")
    assert "needs an API key: set OPENAI_API_KEY" in why, why
    # Set in the user's shell it would reach no actor: where it must be set, and no class name.
    assert "the actors read OPENAI_API_KEY from their own environment" in why, why
    assert "`rollout down` and `rollout up`" in why and "RolloutError" not in why, why
    await no_runs(client)


@pytest.mark.parametrize(("status", "said"), [(404, "not found (HTTP 404"), (500, "HTTP 500")])
async def test_an_endpoint_whose_chat_route_is_missing_or_failing_is_refused(
    client, settings, status: int, said: str
) -> None:
    # No model list to ask (or a failing one): the chat route itself is asked for one token.
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    broken = error_reply(status, "no such route")
    with FakeOpenAI([broken] * 4, models=broken) as server:
        why = await refused(client, f"{server.base_url}#m")
        assert said in why, why
        assert [r.method for r in server.requests] == ["GET", "POST"], "asked once"
    await no_runs(client)


async def test_a_local_model_folder_the_actors_lack_is_refused(client, settings, tmp_path) -> None:
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    missing = tmp_path / "no-such-model"
    why = await refused(client, f"hf:{missing}")
    assert f"no model directory at {missing}" in why, why
    await no_runs(client)


async def test_a_model_the_actors_can_serve_runs(client, settings, agent_server) -> None:
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    run = await client.create_run("refunds", f"{agent_server.base_url}#scripted", n=2)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed" and done["errored"] == 0, done
    assert [r.method for r in agent_server.requests].count("GET") == 1, "checked once"


async def test_with_no_actor_running_the_run_waits_for_one(actorless) -> None:
    platform, client, _ = actorless
    await client.push_environment(refund_env(tasks=1))
    with FakeOpenAI(refund_agent) as server:
        run = await client.create_run("refunds", f"{server.base_url}#scripted", n=2)
        assert server.requests == [], "no actor: nothing checked the endpoint"
        platform.start("actor")
        done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed" and done["errored"] == 0, done


async def test_the_check_can_be_turned_off(client, settings, monkeypatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    await client.push_environment(refund_env(tasks=1))
    await actors_answer(settings)
    url = f"http://127.0.0.1:{closed_port()}/v1?retries=0#m"
    run = await client.create_run("refunds", url, n=1)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["errored"] == 1, done


async def test_a_bad_check_setting_is_named(client, monkeypatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    await client.push_environment(refund_env(tasks=1))
    with pytest.raises(RolloutError, match=f"{TIMEOUT_ENV} must be a number of seconds"):
        await client.create_run("refunds", "local/scripted", n=1)
