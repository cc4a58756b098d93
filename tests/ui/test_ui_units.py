"""The viewer's small parts: the Wilson interval, the SVG plots, the session signer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollout.services.ui.app import _turns
from rollout.services.ui.auth import (
    SESSION_S,
    LoginThrottle,
    SessionSigner,
    Viewer,
    login_failures_allowed,
)
from rollout.services.ui.plots import histogram, line_plot
from rollout.services.ui.server import PROXY_ENV, trusted_proxies
from rollout.shared.errors import RolloutError
from rollout.shared.stats import wilson_interval


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson_interval(4, 6)
    assert (round(low, 4), round(high, 4)) == (0.3000, 0.9032)
    assert wilson_interval(0, 10)[0] == 0.0 and round(wilson_interval(0, 10)[1], 4) == 0.2775
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # Narrower with more trials at the same rate.
    wide, narrow = wilson_interval(5, 10), wilson_interval(500, 1000)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    with pytest.raises(ValueError, match="7 of 5"):
        wilson_interval(7, 5)


def test_plots_are_inline_svg_that_say_what_they_show() -> None:
    svg = line_plot([(1, 2.0), (2, 1.0), (3, math.nan)], title="loss")
    assert svg.startswith("<svg") and 'aria-label="loss: 2 points, last 1"' in svg
    assert "polyline" in svg
    assert 'aria-label="KL: not reported"' in line_plot([], title="KL")
    bars = histogram([0, 3, 1], lo=0, hi=1, title="scores")
    assert bars.count("<rect") == 3 and 'aria-label="scores: 4 scores"' in bars
    assert "<script" not in line_plot([(1, 1.0)], title="<script>x</script>")


def test_session_cookies_cannot_be_forged_or_outlive_their_time() -> None:
    signer = SessionSigner()
    cookie = signer.sign(Viewer("rk_viewer_abc", "viewer"), now=1000.0)
    assert signer.verify(cookie, now=1001.0) == Viewer("rk_viewer_abc", "viewer")
    assert signer.verify(cookie, now=1000.0 + SESSION_S + 1) is None
    body, mac = cookie.split(".")
    assert signer.verify(body[:-2] + "xx." + mac, now=1001.0) is None
    assert SessionSigner().verify(cookie, now=1001.0) is None  # another process's secret
    assert signer.verify(None) is None and signer.verify("garbage") is None


def test_turns_attach_tool_calls_and_token_logprobs_to_their_assistant_turn() -> None:
    trajectory = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "done"},
        ],
        "tool_calls": [{"index": 0, "name": "x"}, {"index": 1, "name": "y"}],
        "token_ids": [[5], [6, 7]],
        "logprobs": [[-0.1], [-1.0, -2.0]],
    }
    turns = _turns(trajectory)
    assert [c["name"] for c in turns[1]["calls"]] == ["x", "y"]
    assert turns[1]["tokens"] == [{"id": 5, "logprob": -0.1}]
    assert [t["id"] for t in turns[4]["tokens"]] == [6, 7]
    assert turns[0]["tokens"] is None and _turns(None) == []


def test_the_trajectory_page_says_whether_its_weights_are_its_versions() -> None:
    from rollout.services.ui.app import TEMPLATES, weights_shown

    v1, v2, v3 = "1" * 64, "2" * 64, "3" * 64
    digests = {1: v1, 2: v2, 3: v3}
    assert weights_shown({"weights_sha256": None}, 2, {}) is None
    rollout = {"rollout_id": "r1", "run_id": "run", "task_index": 0, "sample_index": 0,
               "policy_version": 2, "model": "tiny:rl", "trajectory": None, "score": 0.5,
               "passed": False, "primitives": [], "env_slug": "e", "env_version": 1,
               "env_hash": "h", "seed": 1, "sampling": {}, "error": None}  # fmt: skip

    def provenance(trajectory: dict, known: dict[int, str]) -> str:
        html = TEMPLATES.get_template("trajectory.html").render(
            r=rollout, trained=[], turns=[], weights=weights_shown(trajectory, 2, known)
        )
        start = html.index('id="prov-weights"')
        return html[start : html.index("</dd>", start)]

    ok = provenance({"weights_sha256": v2}, digests)
    assert 'class="ok"' in ok and "those of v2" in ok
    # An update landed between two turns: v2's and v3's weights, trained on like the learner.
    newer = provenance({"weights_sha256": f"mixed:{v2},{v3}"}, digests)
    assert 'class="ok"' in newer and "a newer version" in newer
    stale = provenance({"weights_sha256": v1}, digests)
    assert 'class="bad"' in stale and "not those of v2" in stale
    assert "the learner does not train on it" in stale
    missing = provenance({}, digests)
    assert "no proof of weights" in missing and 'class="bad"' in missing
    unknown = provenance({"weights_sha256": v1}, {})
    assert "no digest announced for v2" in unknown


def test_a_run_rate_is_over_its_verdicts_as_in_the_cli() -> None:
    from rollout.services.ui.queries import run_view

    # 6 scored: 2 passed, 2 failed, 2 errored (no verdict): 50%, as `rollout show` says.
    row = {"scored": 6, "errored": 2, "passed": 2, "total": 6, "score_sum": 2.5}
    view = run_view(row)  # type: ignore[arg-type]
    assert view["judged"] == 4 and view["pass_rate"] == 0.5
    assert view["interval"] == wilson_interval(2, 4) and view["mean_score"] == 2.5 / 4
    every = run_view({"scored": 3, "errored": 3, "passed": 0, "total": 3, "score_sum": 0.0})  # type: ignore[arg-type]
    assert every["pass_rate"] is None and every["interval"] is None  # no verdict: no rate


def test_the_login_throttle_counts_failures_per_address_in_a_sliding_window() -> None:
    throttle = LoginThrottle(limit=2, window_s=60)
    assert throttle.wait_s("a", now=0) == 0
    throttle.failed("a", now=0)
    throttle.failed("a", now=10)
    assert throttle.wait_s("a", now=20) == 40  # until the first failure leaves the window
    assert throttle.wait_s("b", now=20) == 0  # another address is not held
    assert throttle.wait_s("a", now=60.5) == 0
    unlimited = LoginThrottle(limit=0)
    for t in range(100):
        unlimited.failed("a", now=t)
    assert unlimited.wait_s("a", now=100) == 0


def test_a_bad_login_failures_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_UI_LOGIN_FAILURES", "lots")
    with pytest.raises(RolloutError, match="ROLLOUT_UI_LOGIN_FAILURES='lots'"):
        login_failures_allowed()


def test_the_trusted_proxy_setting_takes_addresses_and_networks_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PROXY_ENV, raising=False)
    assert trusted_proxies() == []  # unset: no forwarded header is believed
    monkeypatch.setenv(PROXY_ENV, " 127.0.0.1, ::1,10.1.2.3/8 ")
    assert trusted_proxies() == ["127.0.0.1", "::1", "10.0.0.0/8"]
    assert trusted_proxies("192.168.1.7") == ["192.168.1.7"]  # the flag wins
    for bad, source in (("*", PROXY_ENV), ("localhost", PROXY_ENV), ("", "--behind-proxy")):
        with pytest.raises(RolloutError, match=source) as caught:
            if source == PROXY_ENV:
                monkeypatch.setenv(PROXY_ENV, bad)
                trusted_proxies()
            else:
                trusted_proxies(bad)
        assert repr(bad) in str(caught.value) or "got nothing" in str(caught.value)


def test_rollout_ui_names_a_bad_proxy_address(capsys: pytest.CaptureFixture[str]) -> None:
    from rollout.cli import main as cli_main

    assert cli_main(["ui", "--behind-proxy", "proxy.local"]) != 0
    err = capsys.readouterr().err
    assert "--behind-proxy: 'proxy.local' is not an IP address" in err and "Traceback" not in err


async def test_one_key_holds_a_bounded_number_of_sessions() -> None:
    # Every login with a valid key was remembered for 12 h: logging in without end grew the
    # viewer's memory without end. Past the limit the key's oldest session ends.
    from rollout.services.ui.auth import SESSIONS_PER_KEY, Authenticator
    from rollout.shared.auth.keys import ApiKey
    from rollout.shared.auth.roles import Role
    from rollout.shared.settings import Settings

    auth = Authenticator(
        Settings(home=Path("/nonexistent"), nats_url="nats://127.0.0.1:1", database_url=None)
    )
    key, other = ApiKey.generate(Role.VIEWER), ApiKey.generate(Role.VIEWER)
    theirs = auth.open_session(Viewer(other.user, "viewer"), other.text)
    sessions = [
        auth.open_session(Viewer(key.user, "viewer"), key.text) for _ in range(SESSIONS_PER_KEY + 5)
    ]
    assert len(auth._sessions) == SESSIONS_PER_KEY + 1
    assert not any([await auth.still_valid(v) for v in sessions[:5]])
    assert all([await auth.still_valid(v) for v in sessions[5:]])
    assert await auth.still_valid(theirs)  # another key's session is not this key's to end
