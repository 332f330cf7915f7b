#!/usr/bin/env bash
# The second half of README's test command and of .ci/run (after `python -m pytest -q`): the tests that
# run in their own environments, made by .ci/run: verl's (build/venv-verl: verl 0.9.1 needs
# transformers<5.11, tmpl's exactness tests are written for 5.23) and verifiers' (build/venv-renderers).
# Without those environments these tests are skipped.
#
# The two suites run side by side, one per core (each starts its own vLLM servers, on one OpenMP thread:
# tests/conftest.py's ONE_THREAD); one after the other they took 4.1 minutes of cold run 10, much of it
# waiting on server starts. The verifiers suite's output is printed once it is done; either failing
# fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
VERIFIERS=
if [ -x build/venv-renderers/bin/python ]; then
    # verifiers 0.4.0 pins openai<3 and mcp==2.0.0: its tests run in their own environment (made by .ci/run)
    build/venv-renderers/bin/python -m pytest -q -p no:cacheprovider tests/test_integrations_renderers_verifiers.py \
        tests/test_integrations_verifiers_env.py > build/verifiers-tests.log 2>&1 &
    VERIFIERS=$!
else
    echo "tests/run_envs.sh: build/venv-renderers not found: the verifiers tests skipped (bash .ci/run makes it)"
fi
status=0
if [ -x build/venv-verl/bin/python ]; then
    # vLLM (for the agent-loop test's server) runs with this environment's python, not verl's
    TMPL_VLLM_PYTHON="$(python -c 'import sys; print(sys.executable)')" \
        build/venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/test_integrations_verl.py tests/test_integrations_verl_agent_loop.py tests/test_integrations_verl_vision.py \
        'tests/test_install_extras.py::test_each_extra_imports_its_modules_with_only_what_it_declares[verl]' || status=$?
else
    echo "tests/run_envs.sh: build/venv-verl not found: verl tests skipped (bash .ci/run makes it)"
fi
if [ -n "$VERIFIERS" ]; then
    wait "$VERIFIERS" || status=$?
    echo "--- verifiers' suite (build/venv-renderers) ---"
    cat build/verifiers-tests.log
fi
exit "$status"
