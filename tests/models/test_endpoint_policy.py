"""The operator's endpoint policy: which endpoint a model name may reach and which key it gets.

Capture servers are real local HTTP servers (tests/fakes/openai_server.py); each records every
request's headers, so "no credential reached it" is read from what it actually received.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply
from pipeline.kit import Platform, refund_agent, refund_env, wait_for_platform

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.tracker.runs import check_model_name
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.endpoints import load_policy
from rollout.shared.settings import Settings

SECRET = "sk-operator-secret-123"
ASK = [ChatRequest(messages=[{"role": "user", "content": "hi"}])]


@pytest.fixture(autouse=True)
def operator_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A clean process environment holding one operator secret and some ordinary variables."""
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    for name in ("ROLLOUT_MODEL_ENDPOINTS", "OPENAI_BASE_URL", "TOGETHER_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GATEWAY_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-real")
    monkeypatch.setenv("OPENAI_COMPATIBLE_API_KEY", "sk-compat-legacy")


def allow(monkeypatch: pytest.MonkeyPatch, entries: dict, *, loopback: bool = False) -> None:
    """Set the operator's policy inline (ROLLOUT_MODEL_ENDPOINTS)."""
    monkeypatch.setenv(
        "ROLLOUT_MODEL_ENDPOINTS", json.dumps({"allow_loopback": loopback, "endpoints": entries})
    )


def leaked(server: FakeOpenAI) -> list[str]:
    """Every credential-looking thing the server received: auth headers and known secrets."""
    found = []
    for request in server.requests:
        for key, value in request.headers.items():
            if key.lower() in ("authorization", "api-key", "x-api-key"):
                found.append(f"{key}: {value}")
        text = json.dumps(request.body) + json.dumps(request.headers)
        for secret in (SECRET, "sk-openai-real", "sk-compat-legacy"):
            if secret in text:
                found.append(secret)
    return found


@pytest.mark.parametrize(
    ("suffix", "reason"),
    [
        ("?key_env=HOME", "key_env would choose a credential"),
        ("?key_env=GATEWAY_KEY", "key_env would choose a credential"),
        ("?api_key=x", "api_key would choose a credential"),
        ("?Authorization=Bearer", "Authorization would choose a credential"),
        ("?timeout=5&token=abc", "token would choose a credential"),
    ],
)
async def test_a_name_choosing_a_credential_is_refused_and_sends_nothing(
    fake_openai, suffix: str, reason: str
) -> None:
    capture = fake_openai([text_reply("x")])
    name = f"{capture.base_url}{suffix}#m"
    with pytest.raises(RolloutError) as caught:
        resolve_backend(name)
    assert reason in str(caught.value) and "ROLLOUT_MODEL_ENDPOINTS" in str(caught.value)
    assert check_model_name(name) is not None and reason in check_model_name(name)
    assert capture.requests == []


def test_credentials_in_the_url_are_refused(fake_openai) -> None:
    capture = fake_openai([text_reply("x")])
    name = capture.base_url.replace("http://", "http://user:pw@") + "#m"
    with pytest.raises(RolloutError, match="cannot carry credentials"):
        resolve_backend(name)


async def test_no_credential_reaches_a_host_nobody_allowed(monkeypatch, fake_openai) -> None:
    gateway = fake_openai([text_reply("from gateway")], api_key=SECRET)
    capture = fake_openai([text_reply("from capture")] * 3)
    allow(monkeypatch, {"gateway": {"url": gateway.base_url, "key_env": "GATEWAY_KEY"}})
    # Off the list (loopback not allowed here): refused before any request.
    for name in (f"{capture.base_url}#m", f"openai-compatible:{capture.base_url}#m"):
        with pytest.raises(RolloutError, match="is not allowed") as caught:
            resolve_backend(name)
        assert gateway.base_url in str(caught.value)  # the reason lists what is allowed
        assert "is not allowed" in (check_model_name(name) or "")
    # The same host on another path prefix is not the allowed endpoint either.
    other_path = gateway.base_url.removesuffix("/v1") + "/v2#m"
    with pytest.raises(RolloutError, match="is not allowed"):
        resolve_backend(other_path)
    # With loopback allowed the capture server may be called, but it gets no key at all.
    allow(
        monkeypatch,
        {"gateway": {"url": gateway.base_url, "key_env": "GATEWAY_KEY"}},
        loopback=True,
    )
    backend = resolve_backend(f"{capture.base_url}#m")
    [answer] = await backend.generate(ASK)
    assert answer.content == "from capture"
    assert len(capture.requests) == 1 and leaked(capture) == []
    assert gateway.requests == []


async def test_the_allowed_endpoint_gets_its_configured_secret_only(
    monkeypatch, fake_openai
) -> None:
    gateway = fake_openai([text_reply("ok")], api_key=SECRET)
    allow(monkeypatch, {"gateway": {"url": gateway.base_url, "key_env": "GATEWAY_KEY"}})
    backend = resolve_backend(f"{gateway.base_url}?timeout=5#served")
    [answer] = await backend.generate(ASK)
    assert answer.content == "ok" and answer.error is None
    [request] = gateway.requests
    assert request.headers["Authorization"] == f"Bearer {SECRET}"
    assert check_model_name(f"{gateway.base_url}#served") is None


async def test_a_redirect_does_not_carry_the_key_to_another_host(monkeypatch, fake_openai) -> None:
    capture = fake_openai([text_reply("stolen")])
    target = f"{capture.base_url}/chat/completions"
    gateway = fake_openai([Reply({}, status=307, headers={"Location": target})])
    allow(monkeypatch, {"gateway": {"url": gateway.base_url, "key_env": "GATEWAY_KEY"}})
    backend = resolve_backend(f"{gateway.base_url}?retries=0#m")
    [answer] = await backend.generate(ASK)
    assert answer.error is not None and "307" in answer.error
    assert gateway.requests[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert capture.requests == []


async def test_a_key_file_secret_and_a_toml_file_in_rollout_home(
    monkeypatch, fake_openai, tmp_path: Path
) -> None:
    gateway = fake_openai([text_reply("ok")], api_key="from-file")
    (tmp_path / "secret").write_text("from-file\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "model_endpoints.toml").write_text(
        f'allow_loopback = false\n[endpoints.gw]\nurl = "{gateway.base_url}"\n'
        f'key_file = "{tmp_path / "secret"}"\n'
    )
    backend = resolve_backend(f"{gateway.base_url}#m")
    [answer] = await backend.generate(ASK)
    assert answer.content == "ok"
    assert load_policy().source == str(home / "model_endpoints.toml")


def test_openai_key_goes_only_to_the_openai_endpoint(monkeypatch) -> None:
    backend = resolve_backend("openai/gpt-4o-mini")
    assert (backend.base_url, backend.api_key) == ("https://api.openai.com/v1", "sk-openai-real")
    # The legacy OPENAI_COMPATIBLE_API_KEY is no longer sent to whatever URL a name gives.
    loop = resolve_backend("http://127.0.0.1:9/v1#m")
    assert loop.api_key is None
    # A URL naming the OpenAI host is the OpenAI endpoint: same key, never another one.
    same = resolve_backend("https://api.openai.com/v1#gpt-4o-mini")
    assert same.api_key == "sk-openai-real"


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ('{"endpoints": {"gw": {"url": "ftp://x"}}}', "endpoints.gw.url"),
        ('{"endpoints": {"gw": {"url": "https://x", "key": "sk"}}}', "endpoints.gw.key"),
        ('{"endpoints": {"gw": {"url": "https://x", "key_env": "A B"}}}', "endpoints.gw.key_env"),
        (
            '{"endpoints": {"gw": {"url": "https://x", "key_env": "A", "key_file": "/f"}}}',
            "not both",
        ),
        ('{"allow_loopback": "sometimes"}', "allow_loopback"),
        ('{"endpoints": ', "is not valid JSON"),
        ("[1]", "no such file"),
        ("/nonexistent/endpoints.toml", "no such file"),
    ],
)
def test_a_bad_operator_setting_names_the_setting(monkeypatch, setting: str, problem: str) -> None:
    monkeypatch.setenv("ROLLOUT_MODEL_ENDPOINTS", setting)
    with pytest.raises(RolloutError) as caught:
        resolve_backend("http://127.0.0.1:9/v1#m")
    text = str(caught.value) + " ".join(caught.value.problems or [])
    assert "ROLLOUT_MODEL_ENDPOINTS" in text and problem in text, text
    # The tracker reports the same problem at run creation instead of crashing.
    assert problem in (check_model_name("http://127.0.0.1:9/v1#m") or "")


def test_an_endpoint_setting_not_text_or_a_folder_names_its_path(monkeypatch, tmp_path) -> None:
    # Bytes that are not UTF-8 were a UnicodeDecodeError traceback (and would crash the
    # tracker's check at run creation); a folder was called "no such file".
    binary = tmp_path / "endpoints.toml"
    binary.write_bytes(b"\xff\xfe[endpoints.gw]\n")
    for setting, problem in [
        (binary, f"ROLLOUT_MODEL_ENDPOINTS={binary}: not UTF-8 text (byte 0xff at offset 0)"),
        (tmp_path, f"ROLLOUT_MODEL_ENDPOINTS={tmp_path}: is a folder, not (a .toml or .json"),
    ]:
        monkeypatch.setenv("ROLLOUT_MODEL_ENDPOINTS", str(setting))
        with pytest.raises(RolloutError, match=re.escape(problem)):
            resolve_backend("http://127.0.0.1:9/v1#m")
        assert problem in (check_model_name("http://127.0.0.1:9/v1#m") or "")


def test_a_bad_toml_file_names_its_path(monkeypatch, tmp_path: Path) -> None:
    path = tmp_path / "endpoints.toml"
    path.write_text('[endpoints.gw]\nurl = "https://gw.example.com"\ncolour = "red"\n')
    monkeypatch.setenv("ROLLOUT_MODEL_ENDPOINTS", str(path))
    with pytest.raises(RolloutError) as caught:
        load_policy()
    assert str(path) in str(caught.value)
    assert any("endpoints.gw.colour" in p for p in caught.value.problems)


def test_rollout_test_refuses_a_credential_choosing_name(fake_openai) -> None:
    capture = fake_openai([text_reply("x")] * 5)
    env_file = Path(__file__).resolve().parents[2] / "examples" / "refund_agent.py"
    result = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "test", str(env_file), "--model"]
        + [f"{capture.base_url}?key_env=HOME#m"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "key_env would choose a credential" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert capture.requests == []


async def test_run_creation_refuses_and_an_allowed_run_sends_the_secret_only_there(
    monkeypatch, settings: Settings
) -> None:
    with (
        FakeOpenAI(refund_agent, api_key=SECRET) as gateway,
        FakeOpenAI([text_reply("x")] * 50) as capture,
    ):
        allow(monkeypatch, {"gateway": {"url": gateway.base_url, "key_env": "GATEWAY_KEY"}})
        platform = Platform(settings)
        for name in ("env-registry", "tracker", "verifier", "actor"):
            platform.start(name)
        client = AsyncClient(settings, timeout_s=20)
        try:
            await wait_for_platform(client, platform)
            await client.push_environment(refund_env(tasks=2))
            for name, reason in (
                (f"{capture.base_url}?key_env=HOME#m", "key_env would choose a credential"),
                (f"{capture.base_url}?key_env=GATEWAY_KEY#m", "key_env would choose"),
                (f"{capture.base_url}#m", "is not allowed"),
            ):
                with pytest.raises(RolloutError) as caught:
                    await client.create_run("refunds", name, n=1)
                assert reason in str(caught.value) + " ".join(caught.value.problems or [])
            assert await client.list_runs() == []
            run = await client.create_run(
                "refunds", f"{gateway.base_url}#scripted", n=2, temperature=0.0
            )
            done = await client.wait_for_run(run["runId"], timeout_s=120)
            assert done["status"] == "completed" and done["scored"] == 4, done
        finally:
            await client.close()
            platform.check()
            await platform.stop_all()
        assert capture.requests == [] and leaked(capture) == []
        assert gateway.requests
        assert {r.headers.get("Authorization") for r in gateway.requests} == {f"Bearer {SECRET}"}
