"""Env refs of a plan against a registry that cannot answer: the plan names the real error
(no service, a timeout), never "no environment X in the registry"."""

from __future__ import annotations

from pathlib import Path

from rollout.client import AsyncClient
from rollout.plans import check_plan
from rollout.shared import subjects
from rollout.shared.settings import Settings, connect_nats

PLAN = """
name = "lookup"
[envs.refunds]
ref = "{ref}"
[models]
agent = "openai/x"
[[stages]]
name = "baseline"
run = {{ env = "refunds", model = "agent", n = 1 }}
"""


def plan_file(tmp_path: Path, ref: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(ref=ref))
    return path


async def test_no_registry_running_is_reported_as_such(nats_settings: Settings, tmp_path) -> None:
    client = AsyncClient(nats_settings, timeout_s=5)
    # The lookup names its caller (subjects.attributed).
    subject = subjects.request("registry", "get", nats_settings.nats_user)
    try:
        for ref, shown in (("refunds@2", "refunds@2"), ("refunds", "refunds")):
            result = await check_plan(plan_file(tmp_path, ref), client=client)
            assert result.problems == [
                f"envs.refunds.ref: could not look up {shown} in the registry: no service "
                f"answers {subject}; its service (registry) is not running, or is restarting:"
                " `rollout status` shows it; start the stack with `rollout up` "
                "(or `rollout serve <service>`)"
            ]
    finally:
        await client.close()


async def test_a_registry_that_does_not_answer_in_time_is_a_timeout(
    nats_settings: Settings, tmp_path
) -> None:
    # A registry that is up (it takes the request) but too busy to answer in time.
    nc = await connect_nats(nats_settings)
    stalled = await nc.subscribe(subjects.request_filter("registry", "get"))
    await nc.flush()
    client = AsyncClient(nats_settings, timeout_s=1)
    try:
        result = await check_plan(plan_file(tmp_path, "refunds@1"), client=client)
        assert result.problems == [
            "envs.refunds.ref: could not look up refunds@1 in the registry: "
            f"{subjects.request('registry', 'get', nats_settings.nats_user)} did not answer "
            "within 1s"
        ]
    finally:
        await client.close()
        await stalled.unsubscribe()
        await nc.close()
