"""``tmpl.integrations.verl`` where verl is not installed (tmpl's own environment: verl needs transformers<5.11).

Importing the package never imports verl; the names that subclass verl's classes raise
:class:`tmpl.errors.IntegrationNotInstalledError` with the install line. ``VerlServerBackend`` (no verl
import) maps verl's ``TokenOutput`` to tmpl's results.
"""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace

import pytest

import tmpl
from tmpl.backends import GenerationRequest, Sampling
from tmpl.integrations import verl as tv

HAS_VERL = importlib.util.find_spec("verl") is not None


@pytest.mark.skipif(HAS_VERL, reason="verl is installed here")
@pytest.mark.parametrize("name", ["TmplContinuousTokenBuilder", "TmplToolAgentLoop", "use_tmpl_builders"])
def test_names_that_need_verl_say_how_to_install_it(name):
    with pytest.raises(tmpl.errors.IntegrationNotInstalledError, match=r"tmpl\[verl\]") as info:
        getattr(tv, name)
    assert isinstance(info.value, ImportError)


class Manager:
    """verl's server-manager interface, answering from a list (what verl's ``TokenOutput`` carries)."""

    def __init__(self, outputs):
        self.outputs, self.calls = list(outputs), []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return out


def req(rid="r1", max_tokens=4):
    return GenerationRequest(rid, [1, 2, 3], max_tokens, frozenset({9}), Sampling(temperature=0.7))


def test_verl_server_backend_maps_verls_outputs():
    manager = Manager(
        [
            SimpleNamespace(token_ids=[5, 6, 9], log_probs=[-0.1, -0.2, -0.3], stop_reason="completed"),
            SimpleNamespace(token_ids=[5, 6, 7, 8, 8, 8], log_probs=[-0.1] * 6, stop_reason=None),
            SimpleNamespace(token_ids=[5], log_probs=[-0.5], stop_reason="aborted"),
            SimpleNamespace(token_ids=[5, 9], log_probs=None, stop_reason="completed"),
            RuntimeError("server gone"),
        ]
    )
    backend = tv.VerlServerBackend(manager, {"temperature": 0.7, "top_k": -1, "logprobs": False}, sticky_id="s1")

    async def all_five():
        return [await backend.agenerate(req(f"r{i}")) for i in range(5)]

    stop, length, abort, no_lps, failed = asyncio.run(all_five())
    assert (stop.token_ids, stop.logprobs, stop.finish_reason) == ([5, 6, 9], [-0.1, -0.2, -0.3], "stop")
    assert (length.token_ids, length.finish_reason) == ([5, 6, 7, 8], "length")  # cut at the turn's budget
    assert abort.finish_reason == "abort"
    assert no_lps.logprobs is None and no_lps.finish_reason == "stop"
    assert failed.finish_reason == "error" and "server gone" in failed.error
    sticky, prompt, params = manager.calls[0]
    assert sticky == "s1" and all(c[0] == "s1" for c in manager.calls)  # one server for the whole sample
    assert prompt == [1, 2, 3]
    assert params["max_tokens"] == 4 and params["stop_token_ids"] == [9] and params["logprobs"] is True
