"""The chat stream of a request with tools (server/tools.py): content streams until a call may begin, the calls go out
as OpenAI's tool_calls deltas once the answer is finished."""
from __future__ import annotations

from samebits.server.responses import CHUNK_END, ChoiceCursor, StreamWriter, dumps, safe_text
from samebits.server.tools import ToolPlan, openai_call


def held(plan: ToolPlan, text: str) -> str:
    """The prefix of a running answer that is content whatever comes next: text before a call may begin."""
    if plan.choice == "none":
        return text
    at = text.find(plan.parser.start)
    head = safe_text(text if at < 0 else text[:at], [plan.parser.start], False)
    return head if head.strip() else ""


class _Running:
    """A choice as the stream sees it while it runs: its text cut to what is content whatever comes next."""

    def __init__(self, c, text: str, finish_reason: str | None):
        self._c, self.text, self.finish_reason = c, text, finish_reason

    def __getattr__(self, name):
        return getattr(self._c, name)


class ToolStreamWriter(StreamWriter):
    """The chat stream of a request with tools: content streams until a call may begin; the calls go out once the
    answer is finished, one delta per call (id, name and all its arguments), then the finish_reason. The deltas
    concatenate to the non-streamed body's message."""

    def __init__(self, state, job):
        super().__init__(state, job)
        self.plan: ToolPlan = job.tools

    def feed(self, i: int, out) -> list[bytes]:
        self.last[i] = out
        events = []
        for c in out.outputs:
            cursor = self.cursors.setdefault(c.index, ChoiceCursor())
            if cursor.done:  # finished and sent; the request's other choices still run
                continue
            content, calls = self.plan.calls(c.text) if c.finish_reason is not None else (None, ())
            if c.finish_reason is None:
                view = _Running(c, held(self.plan, c.text), None)
            elif calls:
                view = _Running(c, content or "", None)
            else:
                view = c
            step = cursor.advance(view, self.stops)
            if step is not None:
                choice, _ = self._choice(c.index, view, step[0], step[1], step[2], 0)
                events.append(self.envelope + choice.encode() + CHUNK_END)
            if calls:
                events += self._calls(c.index, calls, self.plan.finish(c.finish_reason))
                cursor.done = True
        return events

    def _calls(self, index: int, calls, finish: str | None) -> list[bytes]:
        deltas = [{"index": index, "delta": {"tool_calls": [{"index": k, **openai_call(call)}]}, "logprobs": None,
                   "finish_reason": None} for k, call in enumerate(calls)]
        deltas.append({"index": index, "delta": {}, "logprobs": None, "finish_reason": finish})
        return [f"data: {dumps(chunk)}\n\n".encode() for chunk in self._chunks(deltas)]
