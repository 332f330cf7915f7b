"""tmpl in slime: a custom generate function (``--custom-generate-function-path``).

slime calls ``async def generate(args, sample, sampling_params) -> Sample`` once per sample and trains
on ``sample.tokens`` (prompt + response), ``response_length``, ``loss_mask`` and
``rollout_log_probs`` (response only: 1 / the sampling logprob on model tokens, 0 on appended
tool results), with ``status``. The function below runs one :class:`tmpl.Rollout` per sample on
SGLang's ``/generate`` (:class:`tmpl.backends.SGLang`, at ``args.sglang_router_ip:port``) or any
tmpl backend, and keeps the invariants of slime's retool fixes (slime PR 1861): a retried sample
starts from its prompt (stale fields are overwritten), each turn's ``max_new_tokens`` is clamped to
the budget left, a generation without logprobs aborts the sample (never re-tokenized), and a tool
result that overflows the budget is cut together with its mask and logprobs and marks TRUNCATED.

In your module (then ``--custom-generate-function-path my_module.generate``)::

    from tmpl.integrations.slime import make_generate
    generate = make_generate(tools=[get_weather, get_time], max_turns=8)

**Several training sequences per sample.** With ``history="template"``, an ``edit_history`` hook or a
:class:`tmpl.rollout.SubAgent` among the tools, a sample's episode may have several training sequences
(:attr:`tmpl.rollout.RolloutResult.sequences`); the generate function then returns a ``list[Sample]``,
one per sequence, always a list for such a rollout (slime flattens a group only when its members all
have one shape). What slime does with a list, as read in THUDM/slime at commit 624b824a
(2026-08-21): ``generate_and_rm`` (slime/rollout/sglang_rollout.py) skips the reward model when any
Sample of the list is ABORTED, else scores every Sample whose ``reward`` is None with
``batched_async_rm`` (``--custom-rm-path`` gets the list in one call); ``generate_and_rm_group`` keeps
the shapes, so a group is ``list[list[Sample]]``; ``validate_rollout_id_annotated``
(slime/observability/rollout_data_utils.py) requires every Sample of such a list to carry one
``rollout_id``, and ``RolloutManager._get_rollout_data`` (slime/ray/rollout.py) then flattens the
groups, so each Sample is one training row (its own tokens, response, loss mask, reward) and the
per-rollout loss reducer divides by the loss-mask total of its ``rollout_id``. Its default reward
normalization (``_post_process_rewards``) reshapes by ``n_samples_per_prompt`` only when the batch has
exactly that many rows per prompt, else normalizes the whole batch as one group:
:func:`post_process_rewards` (``--custom-reward-post-process-path``) groups by ``group_index`` and
counts each episode once. The ``Sample`` fields used are those of slime/utils/types.py at that commit;
slime is not on the package index, so the tests use a stand-in with those fields, and slime's own
list handling where a checkout of it is given (tests/test_integrations_slime.py).

**Routing replay** (R3, slime's ``--use-rollout-routing-replay``): the rollout asks every turn for the
routes of its new positions (``Rollout(routes=True)``) on :class:`tmpl.backends.SGLang` with
``routes=(args.num_layers, args.moe_router_topk)``, and each Sample carries slime's own field
``rollout_routed_experts``: ``[len(tokens) - 1, num_layers, moe_router_topk]`` int32 (a numpy array),
the routes of every token but the last, which slime's Megatron path pads itself
(``prepare_routed_experts_for_routing_replay`` asserts ``len(tokens) - 1`` rows; slime's own SGLang path
fills the field the same way, ``Sample.update_from_meta_info``). A position whose route is not known is
a row of zeros. Without routing replay the field is None.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...backends.base import Backend, Sampling
from ...chat_template import ChatTemplate
from ...errors import TrainerConfigError
from ...rollout import Rollout, RolloutResult
from ...rollout.subagent import subagents_of
from ...trajectory.types import Status

__all__ = [
    "episode_samples",
    "make_generate",
    "post_process_rewards",
    "replay_routes",
    "sampling_from_slime",
    "several_sequences",
    "slime_routes",
]

STATUS = {"DONE": "COMPLETED", "TRUNCATED": "TRUNCATED", "ABORTED": "ABORTED"}


def sampling_from_slime(sampling_params: Mapping[str, Any]) -> Sampling:
    """tmpl's :class:`~tmpl.backends.Sampling` from slime's SGLang sampling dict.

    >>> sampling_from_slime({"temperature": 0.8, "top_p": 0.9, "top_k": -1, "max_new_tokens": 64})
    Sampling(temperature=0.8, top_p=0.9, top_k=0, n=1, seed=None, logprobs='raw')
    """
    top_k = int(sampling_params.get("top_k", 0) or 0)
    return Sampling(
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=max(top_k, 0),
    )


@functools.lru_cache(maxsize=8)
def _template(path: str) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(path, trust_remote_code=True))


@functools.lru_cache(maxsize=8)
def _sglang(url: str, routes: tuple[int, int] | None = None) -> Backend:
    """One SGLang client (and its connection pools) per router URL and process, shared by every sample
    (``routes``: the model's ``(layers, top_k)`` under routing replay)."""
    from ...backends.sglang import SGLang

    return SGLang(url, routes=routes)


def replay_routes(args: Any) -> tuple[int, int] | None:
    """``(num_layers, moe_router_topk)`` when slime runs with ``--use-rollout-routing-replay``, else None.

    >>> from types import SimpleNamespace
    >>> replay_routes(SimpleNamespace(use_rollout_routing_replay=True, num_layers=48, moe_router_topk=8))
    (48, 8)
    """
    if not getattr(args, "use_rollout_routing_replay", False):
        return None
    return int(args.num_layers), int(args.moe_router_topk)


def slime_routes(routes: Any, tokens: int) -> Any:
    """slime's ``rollout_routed_experts`` of a sequence of ``tokens`` IDs from its routes (None: None):
    int32 ``[tokens - 1, layers, top_k]``, every token but the last."""
    if routes is None:
        return None
    return np.ascontiguousarray(routes[: max(tokens - 1, 0)], dtype=np.int32)


def make_generate(
    tools: Any = None,
    *,
    template: ChatTemplate | None = None,
    backend: Callable[[Any], Backend] | Backend | None = None,
    max_turns: int = 8,
    harness: Any = None,
    **rollout_options: Any,
) -> Callable[[Any, Any, Mapping[str, Any]], Awaitable[Any]]:
    """slime's ``generate(args, sample, sampling_params)`` running tmpl's tool rollout.

    ``harness``: a :class:`tmpl.harness.Harness`: each sample is then one run of that agent program
    through a gateway (:mod:`.harness`: ``tasks_from``, ``gateway``, ``gateway_options`` and
    :class:`tmpl.harness.HarnessRollout` options), answered with a ``list[Sample]`` rewarded by its verifier.

    ``template``: default the tokenizer of ``args.hf_checkpoint`` with its own chat template.
    ``backend``: a tmpl backend, or ``backend(args)`` making one; default :class:`tmpl.backends.SGLang`
    on ``http://{args.sglang_router_ip}:{args.sglang_router_port}``. Budgets: ``max_length`` is
    ``args.rollout_max_context_len`` (when set), ``max_completion_length`` is
    ``args.rollout_max_response_len``; ``rollout_options`` go to :class:`tmpl.Rollout`.

    Append mode returns the ``sample``, filled. With ``history="template"``, ``edit_history=`` or a
    :class:`tmpl.rollout.SubAgent` tool it returns a ``list[Sample]``, one per training sequence
    (:func:`episode_samples`), every one with the sample's ``rollout_id`` (else its ``index``):

    >>> generate = make_generate(tools=[get_weather], history="template")   # doctest: +SKIP
    >>> [(s.response_length, s.metadata["tmpl_branch"]) for s in await generate(args, sample, params)]  # doctest: +SKIP
    [(61, 'first'), (48, "diverged from sequence 0 at token 97 (...); edit: template dropped reasoning")]
    """

    if harness is not None:
        from .harness import make_harness_generate

        if tools is not None:
            raise TypeError("make_generate: a harness runs its own tools; tools do not apply with harness=")
        return make_harness_generate(harness, template=template, backend=backend, **rollout_options)

    async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any]) -> Any:
        tpl = template or _template(str(args.hf_checkpoint))
        prompt = sample.prompt
        if isinstance(prompt, str):
            raise TrainerConfigError(
                "slime", "prompt", "tmpl needs the prompt as a message list (run slime without --apply-chat-template)"
            )
        if isinstance(backend, Backend):
            engine = backend
        elif backend is not None:
            engine = backend(args)
        else:
            engine = _sglang(f"http://{args.sglang_router_ip}:{args.sglang_router_port}", replay_routes(args))
        options = dict(rollout_options)
        if replay_routes(args) is not None:
            options.setdefault("routes", True)  # R3: every turn asks for the routes of its new positions
        max_response = int(
            getattr(args, "rollout_max_response_len", None) or sampling_params.get("max_new_tokens", 1024)
        )
        max_context = getattr(args, "rollout_max_context_len", None)
        rollout = Rollout(
            tpl,
            engine,
            tools=tools,
            max_turns=max_turns,
            max_length=int(max_context) if max_context else max_response,  # set below when not given
            max_completion_length=max_response,
            max_tokens_per_turn=int(sampling_params.get("max_new_tokens", max_response)),
            sampling=sampling_from_slime(sampling_params),
            progress=False,
            **options,
        )
        if not max_context:  # the prompt (with the tools' schemas) plus the response budget
            rollout.max_length = len(tpl.prompt_ids(list(prompt), tools=rollout.tool_schemas)) + max_response
        [result] = await rollout.run_async([list(prompt)])
        if not several_sequences(rollout):
            return _fill(tpl, sample, result)
        return episode_samples(tpl, sample, result)

    return generate


def several_sequences(rollout: Rollout) -> bool:
    """Whether ``rollout``'s samples may have several training sequences (template mode, an edit hook,
    a sub-agent tool): the generate function then answers every sample with a list, so that slime's
    groups all have one shape (it flattens ``list[list[Sample]]`` groups only when each member is a list)."""
    return rollout.history == "template" or rollout.edit_history is not None or bool(subagents_of(rollout.toolbox))


def _fill(tpl: ChatTemplate, sample: Any, result: RolloutResult) -> Any:
    """Append mode: ``sample`` written from the result's one trajectory (every field fresh: nothing of
    an earlier, aborted and retried, attempt stays)."""
    response = result.completion_ids.tolist()
    sample.tokens = result.prompt_ids.tolist() + response
    sample.response_length = len(response)
    sample.loss_mask = [int(m) for m in result.mask.tolist()]
    sample.rollout_log_probs = [float(x) for x in result.logprobs.tolist()]
    sample.rollout_routed_experts = slime_routes(result.routes, len(sample.tokens))
    sample.response = tpl.tokenizer.decode(response)  # text for rewards and logs only
    sample.status = getattr(type(sample).Status, STATUS[result.status.name])
    sample.metadata = {**(getattr(sample, "metadata", None) or {}), **_episode_metadata(result)}
    return sample


def _episode_metadata(result: RolloutResult) -> dict[str, Any]:
    return {
        "tmpl_reason": result.reason,
        "messages": result.messages,
        "tool_calls": result.tool_calls,
        "tool_failures": result.tool_failures,
        "turns": result.turns,
    }


def episode_samples(tpl: ChatTemplate, sample: Any, result: RolloutResult) -> list[Any]:
    """slime ``Sample`` s for every training sequence of ``result`` (``sample`` itself is the first).

    Each has ``tokens`` = the sequence's IDs, ``response_length`` from its first sampled token to its
    end, ``loss_mask`` and ``rollout_log_probs`` over that response (the loss mask is
    :attr:`RolloutResult.sequences`', the staleness policy applied), a ``status`` of its own (ABORTED
    for every Sample of an aborted episode, TRUNCATED where the budget cut the sequence, or the last
    sequence of a truncated episode), and the sample's ``index``, ``group_index``, ``prompt``,
    ``label`` and ``rollout_id`` (its ``index`` when unset): one rollout for slime's loss reducer.
    ``response`` is the episode's last response on every Sample (what append mode's ``response`` is),
    so a reward model scoring each Sample gives each the episode's reward. ``metadata``:
    ``tmpl_sequence`` (the sequence's index), ``tmpl_sequences`` (how many the episode has),
    ``tmpl_branch`` (why it started, in words), ``tmpl_branch_kind``, ``tmpl_agent``, ``tmpl_turns``,
    ``tmpl_episode`` (``{"index", "group_index", "rollout_id"}`` of the sample), ``tmpl_left_out`` (the
    sequences with no token sampled by the policy, e.g. a summarizer's, which get no Sample) and append
    mode's keys.
    Every token sampled by the policy is in exactly one Sample's loss mask.

    >>> [(s.metadata["tmpl_sequence"], len(s.tokens), sum(s.loss_mask)) for s in samples]   # doctest: +SKIP
    [(0, 158, 61), (1, 204, 48)]
    """
    rollout_id = getattr(sample, "rollout_id", None)
    if rollout_id is None:
        rollout_id = getattr(sample, "index", None)
    # a sequence with no token sampled by the policy (untrained calls only, a summarizer's; or all its
    # sampled tokens cut by the budget, counted in its ``sampled_cut``) has nothing to train: no Sample
    left_out = [seq.index for seq in result.episode.sequences if not seq.mask.any()]
    sequences = [seq for seq in result.sequences if seq.index not in left_out]
    if not sequences:  # no call kept a sampled token (no budget for the first): the trajectory, as append mode
        out = _fill(tpl, sample, result)
        out.metadata.update(tmpl_sequences=0, tmpl_left_out=left_out)
        out.rollout_id = rollout_id
        return [out]
    if len(sequences) > 1 and rollout_id is None:
        raise TrainerConfigError(
            "slime",
            "sample.index",
            f"sample of prompt {_prompt_head(sample)} has {len(sequences)} training sequences and neither a "
            "rollout_id nor an index: slime needs one rollout_id on all of them",
        )
    status_type = type(sample).Status
    aborted = result.status is Status.ABORTED
    last = max((seq.index for seq in sequences if seq.agent is None), default=sequences[-1].index)
    response = tpl.tokenizer.decode(result.completion_ids.tolist())  # the episode's last response
    base = {**(getattr(sample, "metadata", None) or {}), **_episode_metadata(result)}
    episode = {
        "index": getattr(sample, "index", None),
        "group_index": getattr(sample, "group_index", None),
        "rollout_id": rollout_id,
    }
    siblings = [copy.deepcopy(sample) for _ in sequences[1:]]  # before ``sample`` is written
    routes = {s.index: held for s, held in zip(result.sequences, result.sequence_routes)}
    out = []
    for seq, target in zip(sequences, [sample, *siblings]):
        write_sequence(target, seq)
        held = routes.get(seq.index)
        target.rollout_routed_experts = slime_routes(None if held is None else held[0], len(seq.ids))
        target.response = response
        if aborted:
            name = "ABORTED"
        elif seq.status is Status.TRUNCATED or (seq.index == last and result.status is Status.TRUNCATED):
            name = "TRUNCATED"
        else:
            name = "COMPLETED"
        target.status = getattr(status_type, name)
        target.rollout_id = rollout_id
        target.metadata = {
            **base,
            "tmpl_sequence": seq.index,
            "tmpl_sequences": len(sequences),
            "tmpl_branch": str(seq.branch),
            "tmpl_branch_kind": str(seq.branch.kind),
            "tmpl_agent": seq.agent,
            "tmpl_turns": list(seq.turns),
            "tmpl_episode": dict(episode),
            "tmpl_left_out": list(left_out),
        }
        out.append(target)
    return out


def _prompt_head(sample: Any) -> str:
    prompt = sample.prompt
    text = prompt[-1].get("content") if isinstance(prompt, list) and prompt else prompt
    return repr(str(text)[:60])


#: slime's estimators whose rewards are normalized per prompt (and those divided by the std too)
CENTERED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
SCALED = ("grpo", "gspo", "cispo")


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's ``--custom-reward-post-process-path``: per-prompt normalization that counts each episode once.

    slime's default reshapes the rewards by ``n_samples_per_prompt``, which a batch of ``Sample`` lists
    (several per episode) does not fit: it then normalizes the whole batch as one group, and an episode
    of three sequences would weigh three times. Here the groups are ``group_index`` (one prompt), the
    members of a group are its episodes (``rollout_id``, else ``index``), an episode's return is the mean
    of its Samples' rewards (all equal when the reward model scored the shared ``response``), and each
    Sample gets ``(its reward - mean of the group's returns) / (their std + 1e-6)``: the std only for
    ``grpo``/``gspo``/``cispo`` with ``args.grpo_std_normalization``, nothing at all unless
    ``args.advantage_estimator`` is one of :data:`CENTERED` and ``args.rewards_normalization``, as in
    slime. With one Sample per episode and full groups it is slime's default. Returns ``(raw, normalized)``.

    >>> from types import SimpleNamespace as NS
    >>> args = NS(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=False, reward_key=None)
    >>> post_process_rewards(args, [NS(group_index=0, index=0, rollout_id=0, reward=1.0)] * 2
    ...                      + [NS(group_index=0, index=1, rollout_id=1, reward=0.0)])
    ([1.0, 1.0, 0.0], [0.5, 0.5, -0.5])
    """
    key = getattr(args, "reward_key", None)
    raw = [float(s.reward[key] if key else s.reward) for s in samples]
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in CENTERED or not getattr(args, "rewards_normalization", False):
        return raw, list(raw)
    scaled = estimator in SCALED and getattr(args, "grpo_std_normalization", False)
    episodes: dict[Any, dict[Any, list[float]]] = {}
    for s, r in zip(samples, raw):
        rid = s.rollout_id if getattr(s, "rollout_id", None) is not None else s.index
        episodes.setdefault(s.group_index, {}).setdefault(rid, []).append(r)
    baseline: dict[Any, tuple[float, float]] = {}
    for group, members in episodes.items():
        returns = [math.fsum(rs) / len(rs) for rs in members.values()]
        mean = math.fsum(returns) / len(returns)
        # the unbiased std, as torch.std in slime (one episode: no spread)
        std = math.sqrt(math.fsum((g - mean) ** 2 for g in returns) / (len(returns) - 1)) if len(returns) > 1 else 0.0
        baseline[group] = (mean, std)
    out = []
    for s, r in zip(samples, raw):
        mean, std = baseline[s.group_index]
        out.append((r - mean) / (std + 1e-6) if scaled else r - mean)
    return raw, out


def write_sequence(target: Any, seq: Any) -> None:
    """A training sequence written on a slime ``Sample``: its IDs, response length (after its prompt), and the
    response's loss mask and rollout logprobs."""
    start = seq.prompt_length
    target.tokens = seq.ids.tolist()
    target.response_length = len(seq.ids) - start
    target.loss_mask = [int(m) for m in seq.mask[start:].tolist()]
    target.rollout_log_probs = [float(x) for x in seq.logprobs[start:].tolist()]
