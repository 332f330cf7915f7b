"""Typed errors of tmpl. Each one says what went wrong and where.

Every error tmpl raises is exported here (each family in a module of this package) and belongs to one of twelve catchable families:

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

from .backend import BackendError, HTTPConnectionError, RoutesDecodeError, RoutesUnavailableError, WeightUpdateError
from .base import TmplError, TokenizerChangedError
from .export import AtifError, ExportError, ViewError
from .gateway import (
    BackendUnavailableError,
    GatewayError,
    GatewayRequestError,
    GatewayTimeoutError,
    HistoryConflictError,
    SessionNotFoundError,
    StoreCorruptError,
    StoreFullError,
)
from .harness import HarnessError, HarnessSpecError, HarnessTaskError, HarnessVerifierError
from .integration import (
    ContinuousTokenError,
    EnvAdapterError,
    IntegrationError,
    IntegrationNotInstalledError,
    RolloutContractError,
    TrainerConfigError,
    TrlNotInstalledError,
    UnsupportedTrlVersionError,
)
from .message import ImageInputError, MessageError, MissingContentError, ToolMessageCountError, UnknownRoleError
from .template import (
    BudgetExceededError,
    HistoryRequiredError,
    HistorySpliceError,
    HubUnreachableError,
    ImagePlaceholderError,
    NotATemplateError,
    SourceNotFoundError,
    SpliceError,
    TemplateEditError,
    TemplateError,
    TemplateFixError,
    TemplateMetadataError,
    TemplateRenderError,
    TemplateSourceError,
    UnknownTemplateError,
    UnsupportedTemplateError,
)
from .tools import (
    MCPServerError,
    NoToolParserError,
    SandboxError,
    ToolboxError,
    ToolError,
    ToolIsolationError,
    ToolSchemaError,
    ToolsFileError,
    UnknownParserError,
)
from .trajectory import (
    BudgetError,
    CallError,
    CollateError,
    EnvError,
    EnvMessageError,
    EnvRewardError,
    EpisodeError,
    LogprobError,
    RewardError,
    RoutesError,
    SpanLabelError,
    TokenIdError,
    TrajectoryClosedError,
    TrajectoryError,
    describe_sample,
)
from .worker import RayNotInstalledError, WorkerError, WorkerLostError, WorkerSetupError

__all__ = [
    "AtifError",
    "BackendError",
    "BackendUnavailableError",
    "BudgetError",
    "BudgetExceededError",
    "CallError",
    "CollateError",
    "ContinuousTokenError",
    "EnvAdapterError",
    "EnvError",
    "EnvMessageError",
    "EnvRewardError",
    "EpisodeError",
    "ExportError",
    "GatewayError",
    "GatewayRequestError",
    "GatewayTimeoutError",
    "HTTPConnectionError",
    "HarnessError",
    "HarnessSpecError",
    "HarnessTaskError",
    "HarnessVerifierError",
    "HistoryConflictError",
    "HistoryRequiredError",
    "HistorySpliceError",
    "HubUnreachableError",
    "ImageInputError",
    "ImagePlaceholderError",
    "IntegrationError",
    "IntegrationNotInstalledError",
    "LogprobError",
    "MCPServerError",
    "MessageError",
    "MissingContentError",
    "NoToolParserError",
    "NotATemplateError",
    "RayNotInstalledError",
    "RewardError",
    "RolloutContractError",
    "RoutesDecodeError",
    "RoutesError",
    "RoutesUnavailableError",
    "SandboxError",
    "SessionNotFoundError",
    "SourceNotFoundError",
    "SpanLabelError",
    "SpliceError",
    "StoreCorruptError",
    "StoreFullError",
    "TemplateEditError",
    "TemplateError",
    "TemplateFixError",
    "TemplateMetadataError",
    "TemplateRenderError",
    "TemplateSourceError",
    "TmplError",
    "TokenIdError",
    "TokenizerChangedError",
    "ToolError",
    "ToolIsolationError",
    "ToolMessageCountError",
    "ToolSchemaError",
    "ToolboxError",
    "ToolsFileError",
    "TrainerConfigError",
    "TrajectoryClosedError",
    "TrajectoryError",
    "TrlNotInstalledError",
    "UnknownParserError",
    "UnknownRoleError",
    "UnknownTemplateError",
    "UnsupportedTemplateError",
    "UnsupportedTrlVersionError",
    "ViewError",
    "WeightUpdateError",
    "WorkerError",
    "WorkerLostError",
    "WorkerSetupError",
    "describe_sample",
]

# every class is shown, caught, pickled and documented as tmpl.errors.<Name>, wherever its family's module is
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
