"""The rollout explorer: one episode turn by turn, as HTML a notebook (or a browser) shows.

    from agentlab.explore import episode_html
    HTML(episode_html(ep, tokenizer=tok, group=[...same-group episodes...]))

Shows the question, every turn's text, tool calls with their results (and any training-time hint), the
trained/masked split of the token stream GRPO optimises (green: generated, trained; grey: tool results and
template, masked), and the group's rewards and advantages with this episode marked.
"""

from __future__ import annotations

import html

from agentlab.types import Episode

_CSS = ("font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap; margin: 2px 0; "
        "padding: 4px 6px; border-radius: 4px;")


def _esc(text: str, limit: int = 1500) -> str:
    text = str(text)
    return html.escape(text if len(text) <= limit else text[:limit] + f" … [{len(text) - limit} more characters]")


def token_spans(ep: Episode, tokenizer, limit: int = 800) -> str:
    """The completion tokens coloured by their loss mask (1: trained, 0: masked)."""
    ids, mask = ep.tokens.get("completion_ids", []), ep.tokens.get("mask", [])
    spans = []
    for tid, m in list(zip(ids, mask, strict=False))[:limit]:
        piece = _esc(tokenizer.decode([tid]))
        color = "#d4f4dd" if m else "#e6e6e6"
        spans.append(f'<span style="background:{color}" title="{"trained" if m else "masked"}">{piece}</span>')
    more = f" … [{len(ids) - limit} more tokens]" if len(ids) > limit else ""
    trained = sum(mask)
    return (f"<div><b>tokens</b>: {len(ids)} in the completion, {trained} trained (green), {len(ids) - trained} "
            f"masked (grey)</div><div style='{_CSS} border:1px solid #ccc'>{''.join(spans)}{more}</div>")


def group_html(group: list[Episode], advantages: list[float] | None, current: Episode | None = None) -> str:
    rows = []
    for i, ep in enumerate(group):
        adv = f"{advantages[i]:+.2f}" if advantages is not None else "-"
        mark = " ◀" if current is not None and ep.sample == current.sample else ""
        rows.append(f"<tr><td>{ep.sample}</td><td>{ep.reward:.2f}</td><td>{adv}</td><td>{ep.success:.0f}</td>"
                    f"<td>{_esc(ep.exit_reason)}</td><td>{_esc(', '.join(map(str, ep.outcome.final)), 60)}{mark}</td></tr>")
    return ("<table style='font-size:12px'><tr><th>sample</th><th>reward</th><th>advantage</th><th>success</th>"
            f"<th>exit</th><th>answer</th></tr>{''.join(rows)}</table>")


def episode_html(ep: Episode, tokenizer=None, group: list[Episode] | None = None,
                 advantages: list[float] | None = None) -> str:
    """One episode as HTML. ``group``/``advantages``: the episodes of its GRPO group and their advantages."""
    ok = ep.success >= 1.0
    head = (f"<div style='font-size:13px'><b>{_esc(ep.task.id)}</b> · step {ep.step} · group {ep.group} · "
            f"sample {ep.sample} · <span style='color:{'#2a7a3b' if ok else '#b03030'}'>"
            f"{'success' if ok else 'failure'}</span> · exit <code>{_esc(ep.exit_reason)}</code> · reward "
            f"{ep.reward:.2f} {_esc(ep.reward_terms)} · failure {_esc(ep.failure)}</div>"
            f"<div style='{_CSS} background:#eef3fb'><b>user</b>: {_esc(ep.task.question)}</div>")
    body = []
    for i, turn in enumerate(ep.turns, 1):
        flag = " <span style='color:#b03030'>(off-form)</span>" if turn.off_form else ""
        body.append(f"<div style='{_CSS} background:#d4f4dd'><b>turn {i} · assistant</b> ({turn.n_generated} "
                    f"tokens, trained){flag}:\n{_esc(turn.text)}</div>")
        for call in turn.tool_calls:
            err = f" <b style='color:#b03030'>[{_esc(call.get('error'))} error]</b>" if call.get("error") else ""
            hint = (f"\n<i style='color:#7a4b00'>hint: {_esc(call['hint'])}</i>") if call.get("hint") else ""
            body.append(f"<div style='{_CSS} background:#e6e6e6'><b>tool {_esc(call.get('name'))}</b>"
                        f"({_esc(call.get('arguments'), 200)}){err} → (masked)\n{_esc(call.get('result'))}{hint}</div>")
    expected = ep.task.answer.get("value", ep.task.answer.get("facts", ep.task.answer))
    tail = f"<div style='font-size:12px'>submitted {_esc(ep.outcome.final, 200)} · expected {_esc(expected, 200)}</div>"
    extra = ""
    if group:
        extra += "<div style='margin-top:6px'><b>its group</b></div>" + group_html(group, advantages, ep)
    if tokenizer is not None and ep.tokens:
        extra += token_spans(ep, tokenizer)
    return f"<div>{head}{''.join(body)}{tail}{extra}</div>"


def groups_of(episodes: list[Episode]) -> dict[tuple, list[Episode]]:
    """Episodes keyed by their GRPO group ``(step, group)``, in sample order."""
    out: dict[tuple, list[Episode]] = {}
    for ep in episodes:
        out.setdefault((ep.step, ep.group), []).append(ep)
    return {k: sorted(v, key=lambda e: e.sample) for k, v in out.items()}
