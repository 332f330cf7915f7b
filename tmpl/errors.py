"""Typed errors of tmpl. Each one says what went wrong and where.

Every error tmpl raises is defined here and belongs to one of twelve catchable families:

==================== ===================================================== ===========================
family               what went wrong                                       attributes
==================== ===================================================== ===========================
:class:`TmplError`   root of all of them
:class:`TemplateError` a chat template (render, splice, lookup, metadata)  ``template``, ``reason``
:class:`MessageError` a message in a conversation                          ``index``, ``reason``
:class:`TrajectoryError` one sample's trajectory or a batch of them        ``sample``, ``reason``
:class:`ToolError`   a tool, a tool-call parser or the Toolbox              ``tool``, ``reason``
:class:`BackendError` a generation backend                                 ``backend``
:class:`IntegrationError` a trainer integration                            ``reason``
:class:`ExportError` a rollout file or record                              ``where``, ``reason``
:class:`WorkerError` a rollout worker (a process or a Ray actor)           ``worker``, ``reason``
:class:`TokenizerChangedError` a tokenizer changed after tmpl read it      ``tokenizer``, ``changes``
:class:`GatewayError` a request to the gateway (``tmpl serve``)            ``session``, ``status``, ``reason``
:class:`HarnessError` an agent harness run (:mod:`tmpl.harness`)            ``harness``, ``reason``
==================== ===================================================== ===========================

The specific classes below (``SpliceError``, ``TokenIdError``...) subclass their family and add
the attributes that help (``field``, ``position``, ``boundary``). Errors about user input also
derive from ``ValueError`` so that ``except ValueError`` keeps working.

>>> try:
...     raise TokenIdError("q1", "ids", 0, -1, limit=10, vocab_known=True)
... except TrajectoryError as err:
...     (err.sample, err.field, err.position)
('q1', 'ids', 0)
"""

from __future__ import annotations

from typing import Any


class TmplError(Exception):
    """Base class of every error raised by tmpl."""


class TokenizerChangedError(TmplError):
    """A tokenizer changed after tmpl read it (a token added, dropout set, the normalizer or
    pre-tokenizer replaced): its codec would give stale IDs, so it gives none. ``tokenizer`` names
    it, ``changes`` lists what changed.

    >>> raise TokenizerChangedError("Qwen2.5", ["vocabulary size 151665 -> 151667"])
    Traceback (most recent call last):
    ...
    tmpl.errors.TokenizerChangedError: tokenizer 'Qwen2.5' changed after tmpl read it (vocabulary size 151665 -> 151667); make a new ChatTemplate (or codec_for(tokenizer)) for it
    """

    def __init__(self, tokenizer: str, changes: list[str]) -> None:
        self.tokenizer = tokenizer
        self.changes = list(changes)
        self.reason = "; ".join(self.changes) or "changed"
        super().__init__(
            f"tokenizer {tokenizer!r} changed after tmpl read it ({self.reason}); "
            "make a new ChatTemplate (or codec_for(tokenizer)) for it"
        )


class TemplateError(TmplError):
    """A chat template misbehaved; ``template`` names it."""

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.reason = reason
        super().__init__(f"chat template {template!r}: {reason}")


class UnsupportedTemplateError(TemplateError):
    """The template cannot render what the operation needs (e.g. a tool conversation).

    >>> raise UnsupportedTemplateError("gemma-2-it", "a 'tool' message raises in the template")
    Traceback (most recent call last):
    ...
    tmpl.errors.UnsupportedTemplateError: chat template 'gemma-2-it': a 'tool' message raises in the template
    """


class HistoryRequiredError(TemplateError):
    """The template's suffix depends on earlier messages; pass ``history=`` to get it exactly."""


class TemplateRenderError(TemplateError):
    """Rendering raised inside the template (a ``raise_exception`` call, a Jinja error)."""


class SpliceError(TemplateError):
    """Token IDs cannot be spliced exactly at a boundary: the tokenizer merges across it.

    ``boundary`` says which boundary (e.g. ``"after the turn close '<|im_end|>'"``).
    """

    def __init__(self, template: str, boundary: str, detail: str = "") -> None:
        self.boundary = boundary
        reason = f"token IDs are not splice-safe {boundary}"
        if detail:
            reason += f" ({detail})"
        super().__init__(template, reason)


class HistorySpliceError(TemplateError):
    """A rendered history could not be rebuilt exactly from sampled IDs and encoded text
    (``Rollout(history="template")``): the spliced IDs do not decode to the template's render.
    ``sample`` and ``turn`` name where (``template`` names the template).

    >>> raise HistorySpliceError("qwen3", "0/1", 2, "the spliced IDs decode to 812 characters, the render has 814")
    Traceback (most recent call last):
    ...
    tmpl.errors.HistorySpliceError: chat template 'qwen3': sample 0/1, turn 2: the spliced IDs decode to 812 characters, the render has 814
    """

    def __init__(self, template: str, sample: object, turn: int, detail: str) -> None:
        self.sample = sample
        self.turn = turn
        self.detail = detail
        super().__init__(template, f"sample {sample}, turn {turn}: {detail}")


class UnknownTemplateError(TemplateError, LookupError):
    """No shipped template has this name; ``available`` lists the names that exist.

    >>> raise UnknownTemplateError("qwen4", ["qwen2.5", "qwen3"])
    Traceback (most recent call last):
    ...
    tmpl.errors.UnknownTemplateError: no shipped template named 'qwen4'; available: qwen2.5, qwen3
    """

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.template = name
        self.available = list(available)
        self.reason = "no shipped template with this name"
        TmplError.__init__(
            self, f"no shipped template named {name!r}; available: {', '.join(self.available) or '(none)'}"
        )


class TemplateMetadataError(TemplateError):
    """A shipped template's ``.json`` metadata is missing or malformed; ``path`` names the file
    (it is also the ``template`` attribute)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.template = path
        self.reason = reason
        TmplError.__init__(self, f"{path}: {reason}")


class MessageError(TmplError, ValueError):
    """A message is malformed; ``index`` is its position in the list given."""

    def __init__(self, index: int, reason: str, *, where: str = "messages") -> None:
        self.index = index
        self.reason = reason
        super().__init__(f"{where}[{index}]: {reason}")


class MissingContentError(MessageError):
    """A message that needs ``content`` has none."""


class UnknownRoleError(MessageError):
    """A message's ``role`` is not one tmpl knows."""


class ToolMessageCountError(MessageError):
    """The number of tool messages does not match the number of tool calls they answer."""


def describe_sample(sample: object) -> str:
    """How an error names a sample: its ``sample_id``, or that it has none.

    >>> describe_sample("q17/2"), describe_sample(None)
    ("sample 'q17/2'", 'sample (no sample_id)')
    """
    return "sample (no sample_id)" if sample is None else f"sample {sample!r}"


class TrajectoryError(TmplError):
    """One sample's trajectory was given bad data or misused; ``sample`` is its ``sample_id``."""

    def __init__(self, sample: object, reason: str) -> None:
        self.sample = sample
        self.reason = reason
        super().__init__(f"{describe_sample(sample)}: {reason}")


class BudgetError(TrajectoryError, ValueError):
    """A budget is invalid: a bad ``max_length``, a prompt longer than it, a negative request.

    >>> raise BudgetError("q1", "prompt of 9000 tokens exceeds max_length=8192")
    Traceback (most recent call last):
    ...
    tmpl.errors.BudgetError: sample 'q1': prompt of 9000 tokens exceeds max_length=8192
    """


class TokenIdError(TrajectoryError, ValueError):
    """A token ID is not an integer, or lies outside ``[0, limit)``.

    ``field`` names the argument (``"ids"``, ``"prompt_ids"``), ``position`` the index in it
    (None when the argument itself is not a sequence), ``value`` the offending item.
    ``limit`` is ``vocab_size`` when the trajectory knows it, else ``2**31`` (IDs are stored as int32).

    >>> raise TokenIdError("q1", "ids", 3, 50000, limit=32000, vocab_known=True)
    Traceback (most recent call last):
    ...
    tmpl.errors.TokenIdError: sample 'q1': ids[3] = 50000 is outside [0, 32000) (vocab_size=32000)
    """

    def __init__(
        self, sample: object, field: str, position: int | None, value: object, *, limit: int, vocab_known: bool
    ) -> None:
        self.field = field
        self.position = position
        self.value = value
        if position is None:
            reason = f"{field} must be a sequence of token ids, not {type(value).__name__}"
        elif type(value) is int:
            bound = f"vocab_size={limit}" if vocab_known else "token ids are stored as int32"
            reason = f"{field}[{position}] = {value} is outside [0, {limit}) ({bound})"
        else:
            reason = f"{field}[{position}] = {value!r} is not an integer token id ({type(value).__name__})"
        super().__init__(sample, reason)


class LogprobError(TrajectoryError, ValueError):
    """A rollout logprob is not a number, is NaN or infinite, or is positive.

    Checked on the float32 value that is stored (a tiny positive double that rounds to 0.0 is 0.0).
    ``position`` is None when the argument itself is not a sequence.

    >>> raise LogprobError("q1", 2, float("nan"))
    Traceback (most recent call last):
    ...
    tmpl.errors.LogprobError: sample 'q1': logprobs[2] = nan is NaN
    """

    def __init__(self, sample: object, position: int | None, value: object) -> None:
        self.position = position
        self.value = value
        if position is None:
            reason = f"logprobs must be a sequence of floats, not {type(value).__name__}"
        elif type(value) is not float:
            reason = f"logprobs[{position}] = {value!r} is not a number ({type(value).__name__})"
        elif value != value:
            reason = f"logprobs[{position}] = nan is NaN"
        elif value > 0.0 and value != float("inf"):
            reason = f"logprobs[{position}] = {value!r} is positive (a log-probability is <= 0)"
        else:
            reason = f"logprobs[{position}] = {value!r} is not finite (float32)"
        super().__init__(sample, reason)


class SpanLabelError(TrajectoryError, ValueError):
    """A span label is invalid: ``message`` must be a non-negative int or None."""


class TrajectoryClosedError(TrajectoryError):
    """Tokens were appended to a trajectory whose status is final (DONE, TRUNCATED, ABORTED).

    ``status`` is the final status; the trajectory is unchanged. Check ``traj.running`` (or
    ``traj.max_new_tokens()``, which is 0) before generating the next turn.
    """

    def __init__(self, sample: object, status: object, status_reason: str, what: str) -> None:
        self.status = status
        self.status_reason = status_reason
        name = getattr(status, "name", status)
        detail = f" ({status_reason})" if status_reason else ""
        super().__init__(sample, f"cannot {what}: the trajectory is {name}{detail}; call reset() to retry")


class RoutesError(TrajectoryError, ValueError):
    """Mixture-of-experts routes (routing replay) that cannot be aligned with a sample's tokens: a count
    that does not match the positions, an unknown dtype, a layer count or top-k that changes between turns.

    The trajectory is left as it was; the rollout ends the sample with ``EndCode.BAD_ROUTES``.

    >>> raise RoutesError("q1", "routes of 3 layers x top-2 after 2 layers x top-2")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesError: sample 'q1': routes of 3 layers x top-2 after 2 layers x top-2
    """


class CollateError(TrajectoryError, ValueError):
    """A batch cannot be collated; ``index`` is the trajectory's position in the batch (None for the batch)."""

    def __init__(self, index: int | None, sample: object, reason: str) -> None:
        self.index = index
        self.sample = sample
        self.reason = reason
        where = "batch" if index is None else f"trajectories[{index}] ({describe_sample(sample)})"
        TmplError.__init__(self, f"{where}: {reason}")


class EpisodeError(TrajectoryError):
    """An episode (:mod:`tmpl.episode`) was given a bad call or reward, or misused.

    ``call`` is the call's id (None: the episode itself), ``sample`` the episode's ``sample_id``.

    >>> raise EpisodeError("q1", "c2", "parent 'c9' is no earlier call of this episode")
    Traceback (most recent call last):
    ...
    tmpl.errors.EpisodeError: episode 'q1', call 'c2': parent 'c9' is no earlier call of this episode
    """

    def __init__(self, sample: object, call: object, reason: str) -> None:
        self.sample = sample
        self.call = call
        self.reason = reason
        parts = ([] if sample is None else [f"episode {sample!r}"]) + ([] if call is None else [f"call {call!r}"])
        TmplError.__init__(self, f"{', '.join(parts) or 'episode'}: {reason}")


class CallError(EpisodeError, ValueError):
    """A model call's data is bad: logprobs or versions of another length than its completion, no
    completion, a token ID or logprob out of range, a duplicate id, an unknown parent. ``field`` names
    the argument (``"logprobs"``, ``"completion_ids"``, ``"parent"``...).

    >>> raise CallError(None, "c0", "logprobs", "3 logprobs for 4 sampled tokens")
    Traceback (most recent call last):
    ...
    tmpl.errors.CallError: call 'c0': logprobs: 3 logprobs for 4 sampled tokens
    """

    def __init__(self, sample: object, call: object, field: str, reason: str) -> None:
        self.field = field
        super().__init__(sample, call, f"{field}: {reason}")
        self.reason = reason


class RewardError(EpisodeError, ValueError):
    """A reward is not a finite number, an episode has none, or a group cannot have a baseline
    (RLOO needs two samples). ``call`` names the call whose reward it is (None: the episode's)."""


class EnvError(TrajectoryError):
    """An environment (:mod:`tmpl.env`) of one sample failed or answered with something unusable.

    ``sample`` is the sample (``"<conversation>/<sample>"``), ``env`` the environment's class name,
    ``phase`` what it was doing (``"factory"``, ``"reset"``, ``"step"``, ``"close"``). The rollout ends
    the sample (``EndCode.ENV_FAILED`` when the environment raised, ``EndCode.ENV_REJECTED`` when its
    answer was refused) and names the error in ``RolloutResult.reason`` and ``env_error``.

    >>> raise EnvError("0/1", "raised RuntimeError: db is down", env="Shop", phase="step")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvError: sample '0/1': Shop.step raised RuntimeError: db is down
    """

    def __init__(self, sample: object, reason: str, *, env: str | None = None, phase: str | None = None) -> None:
        self.sample = sample
        self.reason = reason
        self.env = env
        self.phase = phase
        where = ".".join(p for p in (env, phase) if p)
        TmplError.__init__(self, f"{describe_sample(sample)}: {where + ' ' if where else ''}{reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # keyword attributes survive pickling (DistributedRollout)
        return (_rebuild, (type(self), self.args, self.__dict__))


class EnvMessageError(EnvError, ValueError):
    """An environment returned a message that cannot go into the conversation: not a dict, no role, a
    role it may not append (``step`` appends ``tool``, ``user``, ``system`` or ``developer`` turns), no
    content. ``index`` is the message's position in what it returned.

    >>> raise EnvMessageError("0/0", "messages[1]: unknown role 'robot'", env="Shop", phase="step", index=1)
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvMessageError: sample '0/0': Shop.step messages[1]: unknown role 'robot'
    """

    def __init__(
        self,
        sample: object,
        reason: str,
        *,
        env: str | None = None,
        phase: str | None = None,
        index: int | None = None,
    ) -> None:
        super().__init__(sample, reason, env=env, phase=phase)
        self.index = index


class EnvRewardError(EnvError, ValueError):
    """An environment's reward is not a finite number (NaN, infinity, a string).

    >>> raise EnvRewardError("0/0", "reward nan is not a finite number", env="Shop", phase="step")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvRewardError: sample '0/0': Shop.step reward nan is not a finite number
    """


def _rebuild(cls: type[Exception], args: tuple[Any, ...], state: dict[str, Any]) -> Exception:
    """An error of ``cls`` with ``args`` and ``state`` as its attributes (the unpickling of :class:`EnvError`)."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class ToolError(TmplError):
    """A tool, a tool-call parser or the Toolbox cannot do what was asked.

    ``tool`` names the tool or parser at fault when there is one (else None), ``reason`` says why.
    Errors a tool raises while it runs are not ToolErrors: the Toolbox turns them into tool results.

    >>> raise ToolError("no parser for this format", tool="hermes")
    Traceback (most recent call last):
    ...
    tmpl.errors.ToolError: no parser for this format
    """

    def __init__(self, reason: str = "", *, tool: str | None = None) -> None:
        self.tool = tool
        self.reason = reason
        super().__init__(reason)


class ToolSchemaError(ToolError, ValueError):
    """A tool given to tmpl has no usable JSON schema; ``tool`` names it."""

    def __init__(self, tool: str, reason: str) -> None:
        self.tool = tool
        self.reason = reason
        TmplError.__init__(self, f"tool {tool!r}: {reason}")


class UnknownParserError(ToolError, ValueError):
    """A tool-call parser was asked for by a name that does not exist; ``tool`` is that name."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.tool = name
        self.known = known
        self.reason = "unknown tool-call parser"
        TmplError.__init__(self, f"unknown tool-call parser {name!r}; known parsers: {', '.join(known)}")


class NoToolParserError(TemplateError, ToolError):
    """No tool-call parser was recognised for a template; force one with ``parser=<name>``.

    Both a TemplateError (``template`` names it) and a ToolError (``tool`` is None).
    """

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.tool = None
        self.reason = reason
        TmplError.__init__(self, f"chat template {template!r}: {reason}")


class ToolboxError(ToolError, ValueError):
    """The Toolbox was used wrongly (a bad option, a duplicate tool name, a malformed batch)."""

    def __init__(self, reason: str = "", *, tool: str | None = None) -> None:
        ToolError.__init__(self, reason, tool=tool)


class ToolIsolationError(ToolboxError):
    """A tool cannot run in a worker process (``Toolbox(isolation="process")``); ``tool`` names it.

    Workers start clean (not forked from the caller), so each tool reaches them by pickle: a
    function or class defined at module level (pickled by its importable name), or built there
    by the ``worker_tools`` factory. A lambda, a nested function or a closure cannot be sent.

    >>> raise ToolIsolationError("lambda", "a lambda cannot be pickled")
    Traceback (most recent call last):
    ...
    tmpl.errors.ToolIsolationError: tool 'lambda' cannot run in a worker process: a lambda cannot be pickled
    """

    def __init__(self, tool: str, reason: str) -> None:
        ToolError.__init__(self, f"tool {tool!r} cannot run in a worker process: {reason}", tool=tool)
        self.reason = reason


class SandboxError(ToolboxError):
    """``Toolbox(isolation="sandbox")`` cannot sandbox its workers: bubblewrap is missing, or an
    option of :class:`tmpl.tools.sandbox.Sandbox` is wrong. (A sandbox that fails to start a
    worker is a :class:`ToolIsolationError` naming the tools, with bwrap's reason.)

    >>> raise SandboxError("bubblewrap ('bwrap') is not installed")
    Traceback (most recent call last):
    ...
    tmpl.errors.SandboxError: isolation='sandbox': bubblewrap ('bwrap') is not installed
    """

    def __init__(self, reason: str) -> None:
        ToolError.__init__(self, f"isolation='sandbox': {reason}")
        self.reason = reason


class MCPServerError(ToolboxError):
    """An MCP server cannot give a Toolbox its tools (``Toolbox.from_mcp``): it did not start or answer,
    two servers list a tool of the same name, or an adapter names a tool no server has. ``server``
    names the server (its command or URL when it has no name), ``tool`` the tool at fault, if one.

    Calls of a server that crashes or hangs later are not errors: they are answered as tool messages.

    >>> raise MCPServerError("time", "did not start within 30 s")
    Traceback (most recent call last):
    ...
    tmpl.errors.MCPServerError: MCP server 'time': did not start within 30 s
    """

    def __init__(self, server: str, reason: str, *, tool: str | None = None) -> None:
        ToolError.__init__(self, f"MCP server {server!r}: {reason}", tool=tool)
        self.server = server
        self.reason = reason


class BackendError(TmplError):
    """A backend failed in a way that affects every request (misconfiguration, missing package).

    ``backend`` names the backend class when the raiser gives it (else None).

    >>> raise BackendError("vllm is not installed: pip install 'tmpl[vllm]'")
    Traceback (most recent call last):
    ...
    tmpl.errors.BackendError: vllm is not installed: pip install 'tmpl[vllm]'
    """

    def __init__(self, *args: object, backend: str | None = None) -> None:
        self.backend = backend
        super().__init__(*args)


class RoutesUnavailableError(BackendError, ValueError):
    """Routes (mixture-of-experts routing replay) were asked of a backend that cannot give them.

    Raised once, when ``Rollout(..., routes=True)`` is built on such a backend: routes are never faked.

    >>> raise RoutesUnavailableError("Scripted gives no routes", backend="Scripted")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesUnavailableError: Scripted gives no routes
    """


class RoutesDecodeError(BackendError, ValueError):
    """A routes payload that is not what its engine sends (routing replay): not base64, not ``.npy`` bytes,
    an object array, flat expert IDs that are not a whole number of ``layers x top_k`` rows.

    The backend fails the generation with the message (a malformed answer, like a missing ``token_ids``);
    routes that decode but do not fit the sample end it with ``EndCode.BAD_ROUTES`` instead.

    >>> raise RoutesDecodeError("routed_experts is not base64 of .npy bytes: ...")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesDecodeError: routed_experts is not base64 of .npy bytes: ...
    """


class WeightUpdateError(BackendError):
    """A weight update (``Rollout.update_weights``) failed on one engine; ``engine`` names it.

    ``step`` says which step failed (pause, apply, reset_prefix_cache, label, resume).

    >>> raise WeightUpdateError("http://node1:8000", "apply", "HTTP 500 from /collective_rpc")
    Traceback (most recent call last):
    ...
    tmpl.errors.WeightUpdateError: weight update on http://node1:8000 failed at apply: HTTP 500 from /collective_rpc
    """

    def __init__(self, engine: str, step: str, detail: str) -> None:
        self.engine, self.step, self.detail = engine, step, detail
        super().__init__(f"weight update on {engine} failed at {step}: {detail}", backend=engine)


class IntegrationError(TmplError):
    """A trainer integration (``tmpl.integrations``) cannot work with what it was given."""


class TrlNotInstalledError(IntegrationError, ImportError):
    """``tmpl.integrations.trl`` was used but TRL is not installed.

    >>> raise TrlNotInstalledError()
    Traceback (most recent call last):
    ...
    tmpl.errors.TrlNotInstalledError: tmpl.integrations.trl needs TRL, which is not installed: pip install 'tmpl[trl]'
    """

    def __init__(self, detail: str = "") -> None:
        message = "tmpl.integrations.trl needs TRL, which is not installed: pip install 'tmpl[trl]'"
        super().__init__(message + (f" ({detail})" if detail else ""))


class UnsupportedTrlVersionError(IntegrationError):
    """The installed TRL is outside the range whose trainer contract tmpl was checked against.

    >>> raise UnsupportedTrlVersionError("1.9.2", ">=1.11,<1.17")
    Traceback (most recent call last):
    ...
    tmpl.errors.UnsupportedTrlVersionError: TRL 1.9.2 is installed; tmpl.integrations.trl supports trl>=1.11,<1.17 (pip install 'tmpl[trl]'), or set TMPL_TRL_SKIP_VERSION_CHECK=1 to try it anyway
    """

    def __init__(self, installed: str, supported: str) -> None:
        self.installed = installed
        self.supported = supported
        super().__init__(
            f"TRL {installed} is installed; tmpl.integrations.trl supports trl{supported} (pip install 'tmpl[trl]'), "
            "or set TMPL_TRL_SKIP_VERSION_CHECK=1 to try it anyway"
        )


class IntegrationNotInstalledError(IntegrationError, ImportError):
    """An integration (``tmpl.integrations.verl``, ``.slime``) was used without its trainer installed.

    >>> raise IntegrationNotInstalledError("verl", "pip install verl==0.9.1")
    Traceback (most recent call last):
    ...
    tmpl.errors.IntegrationNotInstalledError: tmpl.integrations.verl needs verl, which is not installed: pip install verl==0.9.1
    """

    def __init__(self, package: str, install: str, detail: str = "") -> None:
        self.package = package
        message = f"tmpl.integrations.{package} needs {package}, which is not installed: {install}"
        super().__init__(message + (f" ({detail})" if detail else ""))


class EnvAdapterError(IntegrationError, ValueError):
    """An adapter of another framework's environments (``tmpl.env.trl``, ``tmpl.env.openenv``) was given
    something it cannot run as a tmpl environment; ``adapter`` names it.

    >>> raise EnvAdapterError("OpenEnvEnv", "EchoObservation has no text field to show the model")
    Traceback (most recent call last):
    ...
    tmpl.errors.EnvAdapterError: OpenEnvEnv: EchoObservation has no text field to show the model
    """

    def __init__(self, adapter: str, reason: str) -> None:
        self.adapter = adapter
        self.reason = reason
        super().__init__(f"{adapter}: {reason}")


class ContinuousTokenError(IntegrationError, ValueError):
    """tmpl cannot give exact IDs for a verl Continuous Token merge and was told not to fall back.

    >>> raise ContinuousTokenError("gemma-2-it", "a 'tool' message raises in the template")
    Traceback (most recent call last):
    ...
    tmpl.errors.ContinuousTokenError: gemma-2-it: a 'tool' message raises in the template
    """

    def __init__(self, template: str, reason: str) -> None:
        self.template = template
        self.reason = reason
        super().__init__(f"{template}: {reason}")


class TrainerConfigError(IntegrationError, ValueError):
    """A trainer is configured in a way the integration cannot honour; ``trainer`` names its class,
    ``setting`` the argument at fault.

    >>> raise TrainerConfigError("GRPOTrainer", "tools", "pass the tools to make_rollout_func only")
    Traceback (most recent call last):
    ...
    tmpl.errors.TrainerConfigError: GRPOTrainer(tools=...): pass the tools to make_rollout_func only
    """

    def __init__(self, trainer: str, setting: str, reason: str) -> None:
        self.trainer = trainer
        self.setting = setting
        self.reason = reason
        super().__init__(f"{trainer}({setting}=...): {reason}")


class RolloutContractError(IntegrationError, ValueError):
    """What a ``rollout_func`` returned breaks TRL's contract (a missing key, lengths that differ).

    >>> raise RolloutContractError("completion_ids", "3 rows for 4 prompts")
    Traceback (most recent call last):
    ...
    tmpl.errors.RolloutContractError: rollout_func output 'completion_ids': 3 rows for 4 prompts
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"rollout_func output {key!r}: {reason}")


class ExportError(TmplError, ValueError):
    """A rollout file or record cannot be written or read back; ``where`` names the file and line or row.

    >>> raise ExportError("rollouts.jsonl:3", "missing field 'mask'")
    Traceback (most recent call last):
    ...
    tmpl.errors.ExportError: rollouts.jsonl:3: missing field 'mask'
    """

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class AtifError(ExportError):
    """An ATIF trajectory (the Agent Trajectory Interchange Format) tmpl cannot read or write: ``where``
    names the file (and line or document), ``step`` the step at fault (its ``step_id``, or ``"name/step 3"``
    inside an embedded trajectory) and ``field`` the field (``"metrics.logprobs"``) where known.

    >>> raise AtifError("run.json", "steps[1] (step 2): metrics.logprobs has 3 entries but metrics.completion_token_ids has 4")
    Traceback (most recent call last):
    ...
    tmpl.errors.AtifError: run.json: steps[1] (step 2): metrics.logprobs has 3 entries but metrics.completion_token_ids has 4
    """

    def __init__(self, where: str, reason: str, step: int | str | None = None, field: str | None = None) -> None:
        super().__init__(where, reason)
        self.step = step
        self.field = field


class ViewError(ExportError):
    """A file ``tmpl view`` cannot open: ``where`` names the file and line (or row), ``reason`` what is wrong.

    >>> raise ViewError("rollouts.csv:1", "text starting 'index,sample', not a JSON record")
    Traceback (most recent call last):
    ...
    tmpl.errors.ViewError: rollouts.csv:1: text starting 'index,sample', not a JSON record
    """


class TemplateFixError(TemplateError):
    """:func:`tmpl.report.make_training_safe` could not prove a training-safe rewrite of a template.

    ``reason`` says what could not be proven; ``attempted`` lists the rewrites tried (one line each),
    ``source`` is the rewritten template the proof failed on (None when no rewrite was tried) and
    ``counterexample`` the conversation that breaks it (the search's, JSON-able; None when there is
    none: an unsupported template, a close that is not a token).

    >>> raise TemplateFixError("GLM-4.6.jinja", "the turn close is not a single token of this tokenizer")
    Traceback (most recent call last):
    ...
    tmpl.errors.TemplateFixError: chat template 'GLM-4.6.jinja': cannot make it training-safe: the turn close is not a single token of this tokenizer
    """

    def __init__(self, template: str, reason: str, attempted: tuple[str, ...] = ()) -> None:
        self.attempted = attempted
        self.source: str | None = None
        self.counterexample: dict[str, Any] | None = None
        super().__init__(template, f"cannot make it training-safe: {reason}")
        self.reason = reason


class TemplateEditError(TemplateError):
    """A template's source cannot be edited where the fixer needs to (an expression tmpl cannot print,
    a lexer token not found). :func:`tmpl.report.make_training_safe` turns it into a refusal."""


class HTTPConnectionError(BackendError, ConnectionError):
    """A server could not be reached, or dropped the connection before a full response; ``url`` names it.

    Raised by the pooled HTTP client of :class:`tmpl.backends.VLLMServer`, which retries the request
    on another server and marks this one unhealthy for a while.

    >>> raise HTTPConnectionError("http://127.0.0.1:8000", "connection refused")
    Traceback (most recent call last):
    ...
    tmpl.errors.HTTPConnectionError: http://127.0.0.1:8000: connection refused
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}", backend="VLLMServer")


class BudgetExceededError(TemplateError):
    """Checking a template ran out of its budget (:class:`tmpl.report.budget.Budget`): ``budget`` names
    which (``"seconds"``, ``"memory_mb"`` or ``"output_chars"``), ``limit`` says it in words and
    ``detail`` what hit it. Reports turn it into the verdict ``UNPROVEN (budget exceeded: ...)``.

    >>> raise BudgetExceededError("loops.jinja", "seconds", "3 s of wall time", "the check did not finish in time")
    Traceback (most recent call last):
    ...
    tmpl.errors.BudgetExceededError: chat template 'loops.jinja': budget exceeded: 3 s of wall time (seconds): the check did not finish in time
    """

    def __init__(self, template: str, budget: str, limit: str, detail: str = "") -> None:
        self.budget = budget
        self.limit = limit
        self.detail = detail
        super().__init__(template, f"budget exceeded: {limit} ({budget})" + (f": {detail}" if detail else ""))


class TemplateSourceError(TemplateError, ValueError):
    """Where a template, or the tokenizer it renders with, should come from cannot be used: ``source`` is the
    argument as given (a path, a hub id; it is also the ``template`` attribute), ``reason`` says what is wrong
    there and what was expected.

    >>> raise TemplateSourceError("qwen9", "is neither Jinja template text nor an existing file")
    Traceback (most recent call last):
    ...
    tmpl.errors.TemplateSourceError: qwen9: is neither Jinja template text nor an existing file
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.template = source
        self.reason = reason
        TmplError.__init__(self, f"{source}: {reason}")


class SourceNotFoundError(TemplateSourceError, FileNotFoundError):
    """A path given as a template file or a tokenizer folder does not exist (and is not a hub id).

    >>> raise SourceNotFoundError("/no/such.jinja", "does not exist; expected a chat template file")
    Traceback (most recent call last):
    ...
    tmpl.errors.SourceNotFoundError: /no/such.jinja: does not exist; expected a chat template file
    """


class NotATemplateError(TemplateSourceError):
    """A path exists but holds no chat template: a binary or non-UTF-8 file, text without Jinja syntax,
    JSON that is not a tokenizer config, a folder without tokenizer files.

    >>> raise NotATemplateError("/etc/hostname", "has no Jinja syntax; expected a chat template file")
    Traceback (most recent call last):
    ...
    tmpl.errors.NotATemplateError: /etc/hostname: has no Jinja syntax; expected a chat template file
    """


class HubUnreachableError(TemplateSourceError, ConnectionError):
    """A hub id was given, it is not in the local hub cache, and the hub did not answer in time (or
    ``HF_HUB_OFFLINE=1`` forbids asking). ``timeout`` is the seconds waited per try (None when offline).

    >>> raise HubUnreachableError("org/model", "the hub did not answer", timeout=5.0)
    Traceback (most recent call last):
    ...
    tmpl.errors.HubUnreachableError: org/model: the hub did not answer
    """

    def __init__(self, source: str, reason: str, *, timeout: float | None = None) -> None:
        self.timeout = timeout
        super().__init__(source, reason)


class ToolsFileError(ToolError, ValueError):
    """A file of tool schemas (``tmpl replay --tools``) does not exist or is not a JSON list; ``path`` names it.

    >>> raise ToolsFileError("tools.json", "holds a JSON dict; expected a JSON file with a list of tool schemas")
    Traceback (most recent call last):
    ...
    tmpl.errors.ToolsFileError: tools.json: holds a JSON dict; expected a JSON file with a list of tool schemas
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        ToolError.__init__(self, f"{path}: {reason}")
        self.reason = reason


class WorkerError(TmplError):
    """A worker of :class:`tmpl.DistributedRollout` (a process or a Ray actor) failed; ``worker`` names it."""

    def __init__(self, worker: str | None, reason: str) -> None:
        self.worker = worker
        self.reason = reason
        super().__init__(f"rollout worker {worker}: {reason}" if worker is not None else reason)

    def __reduce__(self) -> tuple[Any, ...]:  # sent from a worker to the driver: its attributes survive pickling
        return (_rebuild, (type(self), self.args, self.__dict__))


class WorkerSetupError(WorkerError, ValueError):
    """A worker could not be set up: its rollout factory does not pickle, raised, returned no
    ``tmpl.Rollout``, or built a template whose fingerprint differs from the other workers'.

    >>> raise WorkerSetupError("process 1", "the factory returned a list, not a tmpl.Rollout")
    Traceback (most recent call last):
    ...
    tmpl.errors.WorkerSetupError: rollout worker process 1: cannot set up: the factory returned a list, not a tmpl.Rollout
    """

    def __init__(self, worker: str | None, reason: str) -> None:
        super().__init__(worker, f"cannot set up: {reason}")
        self.reason = reason


class WorkerLostError(WorkerError):
    """Workers died and a shard of samples could not be run: no worker left, or the shard killed
    ``attempts`` workers in a row (each death re-runs it elsewhere first). ``shard`` names it.

    >>> raise WorkerLostError("process 0", "shard 3 (conversations 12-15)", "killed by SIGKILL", 3)
    Traceback (most recent call last):
    ...
    tmpl.errors.WorkerLostError: rollout worker process 0: shard 3 (conversations 12-15) lost after 3 attempt(s): killed by SIGKILL
    """

    def __init__(self, worker: str | None, shard: str, how: str, attempts: int) -> None:
        super().__init__(worker, f"{shard} lost after {attempts} attempt(s): {how}")
        self.shard, self.how, self.attempts = shard, how, attempts


class RayNotInstalledError(WorkerError, ImportError):
    """Ray workers were asked for (``mode="ray"`` or an ``address``) but ray is not installed.

    >>> raise RayNotInstalledError()
    Traceback (most recent call last):
    ...
    tmpl.errors.RayNotInstalledError: DistributedRollout(mode='ray') needs ray, which is not installed: pip install 'tmpl[ray]' (ray==2.60.0)
    """

    def __init__(self) -> None:
        WorkerError.__init__(
            self,
            None,
            "DistributedRollout(mode='ray') needs ray, which is not installed: pip install 'tmpl[ray]' (ray==2.60.0)",
        )


class ImageInputError(MessageError):
    """An image content part cannot be read; ``part`` names it (e.g. ``"tool_messages[0].content[1]"``).

    >>> raise ImageInputError(0, "tool_messages[0].content[1]", "no such file 'shot.png'", where="tool_messages")
    Traceback (most recent call last):
    ...
    tmpl.errors.ImageInputError: tool_messages[0]: content part tool_messages[0].content[1]: no such file 'shot.png'
    """

    def __init__(self, index: int, part: str, reason: str, *, where: str = "messages") -> None:
        super().__init__(index, f"content part {part}: {reason}", where=where)
        self.part = part
        self.reason = reason


class ImagePlaceholderError(TemplateError):
    """The images of some messages did not become one placeholder run each in the processor's
    output (e.g. a template that drops images in tool results); ``parts`` names the images.

    >>> raise ImagePlaceholderError("gemma-4", ("tool_messages[0].content[0]",), "1 image, 0 placeholders")
    Traceback (most recent call last):
    ...
    tmpl.errors.ImagePlaceholderError: chat template 'gemma-4': images tool_messages[0].content[0]: 1 image, 0 placeholders
    """

    def __init__(self, template: str, parts: tuple[str, ...], reason: str) -> None:
        super().__init__(template, f"images {', '.join(parts) or '(none)'}: {reason}")
        self.parts = parts


class GatewayError(TmplError):
    """A request the gateway (:mod:`tmpl.gateway`, ``tmpl serve``) cannot answer: ``session`` names the
    session, ``status`` is the HTTP status the API answers with, ``kind`` its error type (the OpenAI and
    Anthropic shapes carry it), ``param`` the request field at fault where one is.

    >>> raise GatewayError("s1", 400, "messages[2]: a tool result for call id 'x9' the gateway never issued")
    Traceback (most recent call last):
    ...
    tmpl.errors.GatewayError: session 's1': messages[2]: a tool result for call id 'x9' the gateway never issued
    """

    kind = "invalid_request_error"

    def __init__(self, session: str | None, status: int, reason: str, *, param: str | None = None) -> None:
        self.session = session
        self.status = status
        self.reason = reason
        self.param = param
        where = f"session {session!r}: " if session is not None else ""
        super().__init__(f"{where}{reason}")


class GatewayRequestError(GatewayError, ValueError):
    """A request body the gateway cannot read: malformed JSON, a wrong schema, an unknown tool call id (400).

    >>> GatewayRequestError("s1", "messages: field required", param="messages").status
    400
    """

    def __init__(self, session: str | None, reason: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(session, status, reason, param=param)


class SessionNotFoundError(GatewayError, LookupError):
    """A session the gateway does not hold: never opened (strict sessions), expired, or already drained (404).

    >>> SessionNotFoundError("s1", "expired after 600 s idle").status
    404
    """

    kind = "not_found_error"

    def __init__(self, session: str, reason: str) -> None:
        super().__init__(session, 404, reason)


class HistoryConflictError(GatewayError):
    """A history that claims an assistant turn the gateway never produced, refused in strict mode (409).

    >>> HistoryConflictError("s1", "messages[1]: assistant content differs from every reply").status
    409
    """

    kind = "conflict_error"

    def __init__(self, session: str, reason: str) -> None:
        super().__init__(session, 409, reason, param="messages")


class BackendUnavailableError(GatewayError):
    """The backend behind the gateway failed or cannot be reached (503).

    >>> BackendUnavailableError("s1", "connection refused").status
    503
    """

    kind = "api_error"

    def __init__(self, session: str | None, reason: str) -> None:
        super().__init__(session, 503, reason)


class GatewayTimeoutError(GatewayError):
    """The engine gave no reply within the gateway's ``call_timeout``; the engine request was cancelled (504).

    >>> GatewayTimeoutError("s1", "no reply within call_timeout=600 s").status
    504
    """

    kind = "timeout_error"

    def __init__(self, session: str | None, reason: str) -> None:
        super().__init__(session, 504, reason)


class HarnessError(TmplError):
    """An agent harness (:mod:`tmpl.harness`): its spec, its run, its verifier. ``harness`` names it.

    >>> raise HarnessError("claude-code", "the executable 'claude' is not on PATH")
    Traceback (most recent call last):
    ...
    tmpl.errors.HarnessError: harness 'claude-code': the executable 'claude' is not on PATH
    """

    def __init__(self, harness: str, reason: str) -> None:
        self.harness = harness
        self.reason = reason
        super().__init__(f"harness {harness!r}: {reason}")


class HarnessSpecError(HarnessError, ValueError):
    """A :class:`tmpl.harness.Harness` that cannot run: an unknown dialect or placeholder, an empty argv.

    >>> HarnessSpecError("x", "argv must be a non-empty sequence of strings").harness
    'x'
    """


class HarnessTaskError(HarnessError, ValueError):
    """A :class:`tmpl.harness.HarnessTask` that cannot be laid out: its files directory missing, a path
    leaving the working directory, a content that is not text or bytes. ``task`` names it.

    >>> raise HarnessTaskError("bug-1", "files: '/data/bug-1' is not a directory")
    Traceback (most recent call last):
    ...
    tmpl.errors.HarnessTaskError: task 'bug-1': files: '/data/bug-1' is not a directory
    """

    def __init__(self, task: str, reason: str) -> None:
        self.harness = ""
        self.task = task
        self.reason = reason
        TmplError.__init__(self, f"task {task!r}: {reason}")


class HarnessVerifierError(HarnessError):
    """A verifier that gave no reward: it hung past its timeout, crashed, or returned something that is
    not a finite number. ``verifier`` names it (its argv or function).

    >>> raise HarnessVerifierError("pytest -q", "did not finish within 60 s (its process tree was killed)")
    Traceback (most recent call last):
    ...
    tmpl.errors.HarnessVerifierError: verifier 'pytest -q': did not finish within 60 s (its process tree was killed)
    """

    def __init__(self, verifier: str, reason: str) -> None:
        self.harness = ""
        self.verifier = verifier
        self.reason = reason
        TmplError.__init__(self, f"verifier {verifier!r}: {reason}")


class StoreCorruptError(GatewayError):
    """A gateway store (``tmpl serve --store``) that cannot be loaded whole: damaged pages, a truncated
    file, a row failing its checksum, another schema. ``path`` names the file and ``record`` the row
    (its ``seq``) where one is at fault; the gateway refuses to start rather than load part of it.

    >>> raise StoreCorruptError("/data/gw.db", 42, "the 'call' event of session 's1' fails its CRC32")
    Traceback (most recent call last):
    ...
    tmpl.errors.StoreCorruptError: store '/data/gw.db', record 42: the 'call' event of session 's1' fails its CRC32
    """

    kind = "api_error"

    def __init__(self, path: str, record: int | None, reason: str) -> None:
        self.path = path
        self.record = record
        where = f"store {path!r}" + (f", record {record}" if record is not None else "")
        super().__init__(None, 500, f"{where}: {reason}")


class StoreFullError(GatewayError):
    """A call the gateway's store could not keep (the disk is full, ``max_store_bytes`` reached with no
    read episode left to drop, the file unwritable): the call fails (507) and nothing of it is written.

    >>> StoreFullError("/data/gw.db", "over max_store_bytes=1000000").status
    507
    """

    kind = "api_error"

    def __init__(self, path: str, reason: str, session: str | None = None) -> None:
        self.path = path
        super().__init__(session, 507, f"store {path!r}: {reason}")
