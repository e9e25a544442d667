"""Label matchers: Alertmanager's semantics and anchored Go regexes."""

from __future__ import annotations

from vllm_watchdog.matchers import parse_matcher


def test_matchers_follow_alertmanager_semantics() -> None:
    eq, ne = parse_matcher("severity=critical"), parse_matcher('severity!="critical"')
    rx, nrx = parse_matcher('alertname=~"VLLM(Queue|KV).*"'), parse_matcher("instance!~vllm-[0-9]+")
    assert eq.matches({"severity": "critical"}) and not eq.matches({})
    assert ne.matches({}) and not ne.matches({"severity": "critical"})
    assert rx.matches({"alertname": "VLLMQueueBacklog"}) and not rx.matches(
        {"alertname": "xVLLMQueue"}
    )  # anchored
    assert nrx.matches({"instance": "other"}) and not nrx.matches({"instance": "vllm-12"})
    assert parse_matcher('summary="a \\"quoted\\" word"').value == 'a "quoted" word'
