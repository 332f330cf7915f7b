"""A rollout's checks of its own IDs: each sample's drift (would decoding and re-rendering have changed its IDs, where\nand why) and every verify_every-th suffix against the template's full render."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import TmplError
from . import images as _images
from .codes import EndCode
from .drift import DriftDetail, chosen, rerender_drift
from .envs import schemas_of
from .sample import SampleRun

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate
    from ..trajectory import Trajectory
    from ..vision import VisionTemplate


logger = logging.getLogger("tmpl.rollout")


class RolloutChecks:
    """Rollout's methods of this module (a mixin: its attributes are Rollout's, declared here for the checker)."""

    tpl: ChatTemplate
    vision: VisionTemplate | None
    tool_schemas: list[dict[str, Any]] | None
    measure_drift: float | bool
    verify_every: int
    _rendered: bool
    _suffix_count: int
    _unverified_logged: bool

    # -- checks -----------------------------------------------------------------------------
    def _measure_drift(self, run: SampleRun) -> tuple[bool | None, DriftDetail | None]:
        """Drift of one finished sample, if ``measure_drift`` chooses it (timed as the ``drift`` phase)."""
        if self._rendered or not chosen(self.measure_drift, run.index, run.sample):
            return None, None  # rendered histories: there is no one sequence to re-render
        if run.env is not None and run.code in (EndCode.ENV_DONE, EndCode.ENV_TRUNCATED, EndCode.MAX_TURNS):
            return None, None  # its last messages were kept in the history, not appended to the IDs
        with run.clock("drift"):
            return self._drift(run.history, run.traj, schemas_of(self, run.env))

    def _drift(
        self, history: list[dict[str, Any]], traj: Trajectory, tools: Any = None
    ) -> tuple[bool | None, DriftDetail | None]:
        """Would decoding and re-rendering this sample have changed its token IDs? Where and why?"""
        ours = traj.prompt_ids.tolist() + traj.completion_ids.tolist()
        tools = self.tool_schemas if tools is None else tools
        if self.vision is not None:  # through the processor, images included
            return _images.drift(self.vision, history, ours, tools)
        return rerender_drift(self.tpl, history, ours, tools)

    def _verify(
        self,
        history: list[dict[str, Any]],
        assistant: dict[str, Any],
        tool_messages: list[dict[str, Any]],
        suffix: list[int],
    ) -> bool | None:
        """Is ``suffix`` the tail of the full render (every ``verify_every``-th suffix; the others pass)?

        None when the check could not run: the template raised on the whole conversation (logged
        once per rollout, with the error). Such a suffix is never reported as verified.
        """
        self._suffix_count += 1
        if self._suffix_count % self.verify_every:
            return True
        messages = history + [assistant] + tool_messages
        try:
            if self.vision is not None:  # through the processor: IDs and image inputs
                return _images.verify(self.vision, messages, self.tool_schemas, suffix)
            text = self.tpl.renderer.text(messages, tools=self.tool_schemas, add_generation_prompt=True)
        except TmplError as exc:
            if not self._unverified_logged:
                self._unverified_logged = True
                logger.warning(
                    "%s: a suffix could not be verified (the full render of its conversation raised: %s); "
                    "it was appended unchecked and counted in RolloutResult.unverified",
                    self.tpl.name,
                    exc,
                )
            return None
        full = self.tpl.codec.encode_reference(text)  # the tokenizer's own IDs, not tmpl's encoder
        n = len(suffix)
        return full[len(full) - n :] == suffix and n < len(full) and full[len(full) - n - 1] in self.tpl.stop_token_ids
