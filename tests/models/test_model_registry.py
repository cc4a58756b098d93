"""Model names -> backends: provider forms, endpoint forms, and clear errors."""

from __future__ import annotations

import pytest
from fakes.openai_server import text_reply

from rollout.errors import RolloutError
from rollout.shared.models.base import ChatRequest, ModelBackend
from rollout.shared.models.catalog import register_backend, resolve_backend
from rollout.shared.models.hermes import parse_tool_calls
from rollout.shared.models.openai_compat import OpenAICompatBackend


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # No operator endpoint file: the built-in policy (see rollout.shared.models.endpoints).
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ROLLOUT_MODEL_ENDPOINTS", raising=False)
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "TOGETHER_API_KEY",
        "TOGETHER_BASE_URL",
        "OPENAI_COMPATIBLE_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)


def test_unknown_prefix_lists_the_valid_forms() -> None:
    with pytest.raises(RolloutError) as info:
        resolve_backend("anthropic/claude")
    message = str(info.value)
    assert "unknown model 'anthropic/claude'" in message
    for form in ("openai/", "together/", "hf:", "openai-compatible:", "http://"):
        assert form in message


def test_empty_model_name_is_an_error() -> None:
    with pytest.raises(RolloutError, match=r"unknown model \(empty\)"):
        resolve_backend("  ")


def test_openai_needs_a_key_for_the_real_api() -> None:
    with pytest.raises(RolloutError, match="set OPENAI_API_KEY"):
        resolve_backend("openai/gpt-4o-mini")


def test_openai_honours_key_and_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-abc")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    backend = resolve_backend("openai/gpt-4o-mini")
    assert isinstance(backend, OpenAICompatBackend)
    assert (backend.model, backend.base_url, backend.api_key) == (
        "gpt-4o-mini",
        "http://127.0.0.1:9/v1",
        "sk-abc",
    )
    assert backend.name == "openai/gpt-4o-mini" and backend.key_env == "OPENAI_API_KEY"


def test_openai_base_url_without_key_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A local gateway may need no key at all.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    backend = resolve_backend("openai/local")
    assert backend.api_key is None


def test_bad_openai_base_url_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "localhost:8000")
    with pytest.raises(RolloutError, match="OPENAI_BASE_URL: 'localhost:8000' is not an http"):
        resolve_backend("openai/x")


def test_together_uses_its_key_and_keeps_slashes_in_model(monkeypatch) -> None:
    monkeypatch.setenv("TOGETHER_API_KEY", "tg-key")
    backend = resolve_backend("together/meta-llama/Llama-3.3-70B-Instruct-Turbo")
    assert backend.model == "meta-llama/Llama-3.3-70B-Instruct-Turbo"
    assert backend.base_url == "https://api.together.xyz/v1"
    assert backend.key_env == "TOGETHER_API_KEY"


def test_together_without_key_is_an_error() -> None:
    with pytest.raises(RolloutError, match="TOGETHER_API_KEY"):
        resolve_backend("together/x")


def test_endpoint_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_BOX_KEY", "gw-key")
    monkeypatch.setenv(
        "ROLLOUT_MODEL_ENDPOINTS",
        '{"endpoints": {"gpu": {"url": "http://gpu-box:8000/v1", "key_env": "GPU_BOX_KEY"}}}',
    )
    a = resolve_backend("openai-compatible:http://gpu-box:8000/v1#Qwen/Qwen2.5-7B-Instruct")
    b = resolve_backend("http://gpu-box:8000/v1#Qwen/Qwen2.5-7B-Instruct")
    for backend in (a, b):
        assert backend.base_url == "http://gpu-box:8000/v1"
        assert backend.model == "Qwen/Qwen2.5-7B-Instruct"
        assert backend.api_key == "gw-key"


def test_endpoint_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "k2")
    monkeypatch.setenv(
        "ROLLOUT_MODEL_ENDPOINTS",
        '{"endpoints": {"gw": {"url": "https://gw.example.com", "key_env": "MY_KEY"}}}',
    )
    backend = resolve_backend(
        "https://gw.example.com/v1?timeout=5&retries=2&concurrency=64&token_ids=1#m"
    )
    assert backend.base_url == "https://gw.example.com/v1"
    assert (backend.timeout, backend.max_retries, backend.concurrency) == (5.0, 2, 64)
    assert backend.logprobs and backend.token_ids and backend.api_key == "k2"


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ("http://gpu-box:8000/v1", "needs '#<model>'"),
        ("http://gpu-box:8000/v1#", "empty model name"),
        ("openai-compatible:gpu-box#m", "is not an http(s) base URL"),
        ("http://h/v1?colour=red#m", "unknown endpoint option(s) colour"),
        ("http://localhost:8000/v1?timeout=soon#m", "bad endpoint option value"),
        ("hf:", "missing the model directory"),
        ("openai/", "missing the model name"),
    ],
)
def test_malformed_names_get_clear_errors(model: str, problem: str) -> None:
    with pytest.raises(RolloutError) as info:
        resolve_backend(model)
    assert problem in str(info.value)


async def test_endpoint_backend_talks_to_a_server(fake_openai) -> None:
    server = fake_openai([text_reply("pong")])
    backend = resolve_backend(f"{server.base_url}#served-model")
    [response] = await backend.generate([ChatRequest(messages=[{"role": "user", "content": "x"}])])
    assert response.content == "pong"
    assert server.chat_bodies[0]["model"] == "served-model"


def test_other_parts_can_register_forms() -> None:
    class Echo:
        name = "echo"

        async def generate(self, requests):  # pragma: no cover - never called
            return []

    register_backend("echo:", lambda rest: Echo(), example="echo:anything")
    try:
        backend = resolve_backend("echo:hi")
        assert isinstance(backend, ModelBackend) and backend.name == "echo"
    finally:
        from rollout.shared.models import registry

        registry._FORMS[:] = [f for f in registry._FORMS if f.prefix != "echo:"]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Just text.", "Just text.", []),
        (
            'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
            "Sure.",
            [("f", '{"a": 1}', False)],
        ),
        (
            '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
            '<tool_call>{"name": "g", "parameters": {}}</tool_call>',
            None,
            [("f", '{"a": 1}', False), ("g", "{}", False)],
        ),
        ("<tool_call>{not json}</tool_call>", None, [("", "{not json}", True)]),
        ("<tool_call>[1, 2]</tool_call>", None, [("", "[1, 2]", True)]),
        (
            '<tool_call>{"name": "f", "arguments": {',
            None,
            [("f", '{"name": "f", "arguments": {', True)],
        ),
        # What small local models write instead of clean Hermes blocks.
        ('<tool_call>{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a": 1}', False)]),
        (
            '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]'
            "</tool_call>",
            None,
            [("f", "{}", False), ("g", "{}", False)],
        ),
        ('On it: {"name": "f", "arguments": {"a": 1}}', "On it:", [("f", '{"a": 1}', False)]),
        ('```json\n{"name": "f", "arguments": {"a": 2}}\n```', None, [("f", '{"a": 2}', False)]),
        (
            '{"name": "f", "arguments": {"team": billing}}',
            None,
            [("f", '{"name": "f", "arguments": {"team": billing}}', True)],
        ),
        ('The answer is {"name": "Paris"}.', 'The answer is {"name": "Paris"}.', []),
        # Valid JSON Python will not read (an integer over 4,300 digits): a malformed call, not
        # an AttributeError that failed the backend's whole batch.
        (
            f'<tool_call>{{"name": "f", "arguments": {{"a": {"9" * 5000}}}}}</tool_call>',
            None,
            [("f", f'{{"name": "f", "arguments": {{"a": {"9" * 5000}}}}}', True)],
        ),
        (
            f'{{"name": "f", "arguments": {{"a": {"9" * 5000}}}}}',
            None,
            [("f", f'{{"name": "f", "arguments": {{"a": {"9" * 5000}}}}}', True)],
        ),
    ],
)
def test_hermes_parsing(text: str, content, calls) -> None:
    got_content, got_calls = parse_tool_calls(text)
    assert got_content == content
    assert [(c.name, c.arguments, c.error is not None) for c in got_calls] == calls
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "refund", "arguments": {"a": DEEP}}</tool_call>',
        '<tool_call>{"name": "refund", "arguments": DEEP',
        'Sure. {"name": "refund", "arguments": {"a": DEEP}}',
    ],
)
def test_hermes_calls_nested_past_the_recursion_limit_are_malformed_not_a_crash(text: str) -> None:
    # json raised RecursionError, which is no ValueError: a local model's turn of 10,000
    # brackets failed the whole batch's generate (every sibling errored), not its own call.
    deep = "[" * 5000 + "]" * 5000
    _, [call] = parse_tool_calls(text.replace("DEEP", deep))
    assert call.name == "refund" and call.error and call.error.startswith("malformed tool call")
