#!/usr/bin/env bash
# The second half of README's test command and of .ci/run (after `python -m pytest -q`): the tests that
# run in their own environments, made by .ci/run: verl's (build/venv-verl: verl 0.9.1 needs
# transformers<5.11, tmpl's exactness tests are written for 5.23) and verifiers' (build/venv-renderers).
# Without those environments these tests are skipped. One suite after the other: each already runs on
# two pytest-xdist workers (pyproject's addopts); side by side they took 4.3 minutes of cold run 11,
# against 4.1 one after the other in run 10.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x build/venv-verl/bin/python ]; then
    # vLLM (for the agent-loop test's server) runs with this environment's python, not verl's
    TMPL_VLLM_PYTHON="$(python -c 'import sys; print(sys.executable)')" \
        build/venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/test_integrations_verl.py tests/test_integrations_verl_agent_loop.py tests/test_integrations_verl_vision.py tests/test_integrations_verl_harness.py \
        'tests/test_install_extras.py::test_each_extra_imports_its_modules_with_only_what_it_declares[verl]'
else
    echo "tests/run_envs.sh: build/venv-verl not found: verl tests skipped (bash .ci/run makes it)"
fi
if [ -x build/venv-renderers/bin/python ]; then
    # verifiers 0.4.0 pins openai<3 and mcp==2.0.0: its tests run in their own environment (made by .ci/run)
    build/venv-renderers/bin/python -m pytest -q -p no:cacheprovider tests/test_integrations_renderers_verifiers.py \
        tests/test_integrations_verifiers_env.py tests/test_integrations_verifiers_harness.py
else
    echo "tests/run_envs.sh: build/venv-renderers not found: the verifiers tests skipped (bash .ci/run makes it)"
fi
