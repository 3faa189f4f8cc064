"""The console in a real browser (Debian's chromium through Playwright) against real
services, on SQLite and Postgres: every page loads (and is photographed for the docs),
the timeline shows the seeded rewinds' abandoned intervals, a live append appears
without a reload, a rewind made in the console changes what GetSessionState answers
and is audited, delivery actions confirm their row count, an agent token sees only its
agent, keyboard navigation reaches every action and text contrast meets WCAG AA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from tests.console.conftest import log_in
from tests.console.deployment import ADMIN, Deployment, message

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


def _pages(deployment: Deployment) -> dict[str, str]:
    """Every page, by the name of its screenshot."""
    seeded = deployment.seeded
    return {
        "timeline": "/",
        "sessions": "/sessions",
        "session": f"/sessions/alice/{seeded.alice_session}?at={seeded.abandoned_message}",
        "deliveries": "/deliveries?state=owed",
        "rewind": "/rewind?checkpoint=before-deploy",
        "audit": "/audit",
    }


def _backend(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["deployment"])


def test_every_page_loads(
    browser: Any, deployment: Deployment, request: pytest.FixtureRequest
) -> None:
    page = log_in(browser, deployment)
    for name, path in _pages(deployment).items():
        answer = page.goto(deployment.url + path)
        assert answer.status == 200, (path, page.inner_text("main"))
        assert page.locator("h1").count() == 1
        assert "Traceback" not in page.content()
        if _backend(request) == "sqlite":  # one set of pictures, kept in the docs
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    page.context.close()


def test_the_timeline_shows_both_abandoned_intervals(browser: Any, deployment: Deployment) -> None:
    page = log_in(browser, deployment)
    page.goto(deployment.url + "/")
    hatched = page.eval_on_selector_all(
        "svg#timeline rect.abandoned",
        "rects => rects.map(r => "
        "[Number(r.dataset.rewind), Number(r.dataset.first), Number(r.dataset.last)])",
    )
    by_rewind = {rewind: (first, last) for rewind, first, last in hatched if rewind}
    assert set(deployment.seeded.rewinds) <= set(by_rewind)
    first, second = (by_rewind[r] for r in deployment.seeded.rewinds)
    assert first[1] < second[0]  # two separate intervals
    lines = page.eval_on_selector_all(
        "svg#timeline line.rewind-marker", "lines => lines.map(l => Number(l.dataset.seq))"
    )
    assert set(deployment.seeded.rewinds) <= set(lines)
    assert page.locator("svg#timeline g.flag").count() >= 1  # the checkpoint
    page.context.close()


def test_a_live_append_appears_without_a_reload(browser: Any, deployment: Deployment) -> None:
    page = log_in(browser, deployment)
    page.goto(deployment.url + "/")
    hub = deployment.console.hub
    assert hub is not None
    page.wait_for_function("() => document.getElementById('live-tail') !== null")
    _wait_until(lambda: hub.follower_count >= 1)
    appended = deployment.append(deployment.seeded.bob_session, message("live!"), agent="bob")
    sequence = appended.events[0].sequence
    # Within 1 s of the append, without a reload: in the tail and on the timeline.
    page.wait_for_selector(f"#live-tail li[data-seq='{sequence}']", timeout=1000)
    assert page.locator(f"svg#timeline rect.mark[data-seq='{sequence}']").count() == 1
    page.context.close()


def test_a_rewind_in_the_console_changes_the_state_and_is_audited(
    browser: Any, deployment: Deployment
) -> None:
    seeded = deployment.seeded
    state = pb.GetSessionStateRequest(agent="alice", session_id=seeded.alice_session)
    before = deployment.sessions.GetSessionState(state, metadata=ADMIN).state
    assert before.temp_state["topic"] == "shipped"
    target = (
        deployment.sessions.ListCheckpoints(pb.ListCheckpointsRequest(), metadata=ADMIN)
        .checkpoints[0]
        .sequence
    )
    page = log_in(browser, deployment)
    page.goto(f"{deployment.url}/rewind?sequence={target}")
    assert page.locator("#effects tbody tr").count() >= 1
    page.fill("#confirm", str(target + 1))  # a wrong target changes nothing
    page.click("form.confirm button[type=submit]")
    assert "Not confirmed" in page.inner_text("h1")
    assert deployment.sessions.GetSessionState(state, metadata=ADMIN).state == before
    page.goto(f"{deployment.url}/rewind?sequence={target}")
    page.fill("#confirm", str(target))
    page.click("form.confirm button[type=submit]")
    assert "done" in page.inner_text("h1")
    after = deployment.sessions.GetSessionState(state, metadata=ADMIN).state
    assert after.temp_state["topic"] == "roadmap"
    page.goto(deployment.url + "/audit")
    audit = page.inner_text("#audit")
    assert "session.rewind by admin" in audit and f"rewind to {target}" in audit
    page.context.close()


def test_delivery_actions_confirm_how_many_rows_they_touch(
    browser: Any, deployment: Deployment
) -> None:
    page = log_in(browser, deployment)
    page.goto(deployment.url + "/deliveries?state=abandoned")
    page.select_option("#a-action", "retry")
    page.select_option("#a-scope", "all")
    page.click("fieldset.actions button[type=submit]")
    assert page.inner_text("#touched") == "1"
    page.click("form button.danger")
    assert "1 row done" in page.inner_text("#result")
    page.goto(deployment.url + "/audit")
    assert "delivery.retry by admin" in page.inner_text("#audit")
    page.context.close()


def test_an_agent_token_sees_only_its_agent(browser: Any, deployment: Deployment) -> None:
    page = log_in(browser, deployment, "alice")
    assert page.url.endswith("/sessions")
    own = page.goto(deployment.url + "/sessions?agent=alice")
    assert own.status == 200 and deployment.seeded.alice_session in page.inner_text("#sessions")
    for path in (
        "/sessions?agent=bob",
        f"/sessions/bob/{deployment.seeded.bob_session}",
        "/",  # the timeline spans every agent
    ):
        refused = page.goto(deployment.url + path)
        assert refused.status == 403, path
        assert "Not allowed with this token" in page.inner_text("h1")
        assert deployment.seeded.bob_session not in page.content()
    page.goto(deployment.url + "/deliveries")
    assert "bob" not in page.inner_text("#obligations")
    page.context.close()


_FOCUSABLE = """() => [...document.querySelectorAll('a[href], button, input, select, textarea')]
  .filter(e => e.type !== 'hidden' && e.tabIndex >= 0 && !e.closest('[hidden]')
     && e.getClientRects().length > 0)
  .map(e => e.outerHTML.slice(0, 120))"""


def test_the_keyboard_reaches_every_action(browser: Any, deployment: Deployment) -> None:
    page = log_in(browser, deployment)
    for path in _pages(deployment).values():
        page.goto(deployment.url + path)
        wanted = set(page.evaluate(_FOCUSABLE))
        reached: set[str] = set()
        for _ in range(len(wanted) + 5):
            page.keyboard.press("Tab")
            focused = page.evaluate(
                "() => document.activeElement ? document.activeElement.outerHTML.slice(0, 120) : ''"
            )
            reached.add(focused)
        assert wanted <= reached, (path, sorted(wanted - reached)[:3])
    page.context.close()


_CONTRAST = """() => {
  const rgb = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = e => {
    for (; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const failures = [];
  for (const e of document.querySelectorAll('body *')) {
    const own = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || e.getClientRects().length === 0 || e.closest('svg')) continue;
    const style = getComputedStyle(e);
    const fg = rgb(style.color).slice(0, 3), bg = background(e);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) {
      failures.push(e.tagName + ' ' + ratio.toFixed(2) + ' ' + e.textContent.trim().slice(0, 30));
    }
  }
  return failures;
}"""


def test_text_contrast_meets_wcag_aa(browser: Any, deployment: Deployment) -> None:
    page = log_in(browser, deployment)
    for path in _pages(deployment).values():
        page.goto(deployment.url + path)
        assert page.evaluate(_CONTRAST) == [], path
    page.context.close()


def _wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
