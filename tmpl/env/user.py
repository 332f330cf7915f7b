"""``SimulatedUser``: a user played by a model through any tmpl backend (tau-bench style).

The simulator sees the conversation from the other side: the agent's answers are its user turns,
its own earlier turns are its assistant turns, tool traffic and the agent's system prompt are not
shown; ``instructions`` (its persona and goal) are its system prompt. It answers with text, or
ends the episode by writing ``stop`` (default ``"###STOP###"``). Each of its generations is a
:class:`tmpl.episode.Call` with ``trained=False`` and ``agent="simulated-user"``: the rollout adds it
to the sample's episode, mask 0, never merged with the policy's sequences.

>>> user = SimulatedUser(tmpl.backends.VLLMServer(url), tpl,                      # doctest: +SKIP
...                      instructions="You want a table for two at 8pm. Say ###STOP### when booked.")
>>> env = lambda: tmpl.env.ToolEnv([book_table], user=user)                       # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ..backends.base import Backend, GenerationRequest, Sampling
from ..chat_template import ChatTemplate
from ..episode import Call
from ..toolcalls.api import CompletionReader

_ids = itertools.count()


class SimulatedUser:
    """A model that plays the user: ``backend`` generates, ``template`` renders its conversation.

    ``sampling`` (default: temperature 1.0 with logprobs), ``max_tokens`` per reply, ``agent``: the
    lineage label of its calls in the episode.
    """

    def __init__(
        self,
        backend: Backend,
        template: ChatTemplate,
        *,
        instructions: str | None = None,
        sampling: Sampling | None = None,
        max_tokens: int = 256,
        stop: str | None = "###STOP###",
        agent: str = "simulated-user",
    ) -> None:
        self.backend = backend
        self.template = template
        self.instructions = instructions
        self.sampling = sampling or Sampling()
        self.max_tokens = max_tokens
        self.stop = stop
        self.agent = agent
        self._read = CompletionReader(template, plain=True)

    def view(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the simulator sees it (roles swapped, tool traffic and system turns left out).

        >>> SimulatedUser.view(None, [{"role": "system", "content": "Agent rules."},
        ...     {"role": "user", "content": "Book a table."}, {"role": "assistant", "content": "For how many?"}])
        [{'role': 'assistant', 'content': 'Book a table.'}, {'role': 'user', 'content': 'For how many?'}]
        """
        out: list[dict[str, Any]] = []
        if self is not None and self.instructions:
            out.append({"role": "system", "content": self.instructions})
        for m in messages:
            role, content = m.get("role"), m.get("content")
            if role not in ("user", "assistant") or not isinstance(content, str) or not content.strip():
                continue  # tool calls and results, system and developer turns: the agent's side only
            out.append({"role": "assistant" if role == "user" else "user", "content": content})
        return out

    async def reply(self, messages: Sequence[Mapping[str, Any]], *, call_id: str) -> tuple[str | None, Call | None]:
        """The simulator's next user turn (None: it ended the episode) and the model call that made it."""
        convo = self.view(messages)
        text = self.template.render(convo, add_generation_prompt=True)
        prompt = self.template.codec.encode(text)
        request = GenerationRequest(
            f"simulated-user-{next(_ids)}", prompt, self.max_tokens, self.template.stop_token_ids, self.sampling
        )
        result = await self.backend.agenerate(request)
        if result.finish_reason in ("error", "abort"):
            raise RuntimeError(f"the simulated user's generation failed: {result.error or result.finish_reason}")
        ids = list(result.token_ids)
        call = None
        if ids:
            call = Call(prompt, ids, result.logprobs, trained=False, agent=self.agent, id=call_id, versions=None)
        content = self._read(ids).content or ""
        if self.stop and self.stop in content:
            return None, call
        return content.strip() or None, call
