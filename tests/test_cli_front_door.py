"""The command line's front door: paths are paths, the hub fails fast offline, templates are named
after their source, and every command exits with a status a CI job can gate on (docs/cli.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tmpl
from tmpl.chat_template import ChatTemplate
from tmpl.cli import EXIT_SAFE, EXIT_UNPROVEN, EXIT_UNSAFE, EXIT_USAGE, main
from tmpl.errors import (
    HubUnreachableError,
    NotATemplateError,
    SourceNotFoundError,
    TemplateError,
    TemplateSourceError,
    TmplError,
)
from tmpl.sources import is_hub_id, looks_like_path, resolve_template

from .conftest import DATA, PRISTINE_ENV, REPO

HOSTNAME = Path("/etc/hostname")


def folder(family: str) -> str:
    path = DATA / family
    if not path.is_dir():
        pytest.skip(f"tokenizer data for {family!r} not found under TMPL_TEST_DATA={DATA}")
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``main(argv)``: its status, stdout and stderr (argparse's SystemExit turned into a status)."""
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def one_line_error(err: str, command: str) -> str:
    """The one line a failed command prints: ``tmpl <command>: <message>``, no traceback."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith(f"tmpl {command}: "), err
    return lines[0]


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "weights.jinja"
    path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.jinja"
    path.write_bytes("{% for m in messages %}{{ m.content }}{% endfor %} café".encode("latin-1"))
    return path


# -- paths are paths -----------------------------------------------------------------------------


def test_a_source_that_does_not_exist_says_so(capsys, tmp_path):
    missing = str(tmp_path / "no" / "such" / "model")
    status, out, err = run(capsys, "check", missing)
    line = one_line_error(err, "check")
    assert status == EXIT_USAGE and out == ""
    assert f"{missing}: does not exist; expected a tokenizer folder" in line
    assert "Repo id" not in line and "repo_name" not in line  # not the hub's rules for ids
    assert run(capsys, "check", "gpt2")[0] == EXIT_USAGE  # one word: no path, no owner/name, not a hub id
    for command in (["fix", missing], ["replay", missing], ["matrix", missing]):
        status, _, err = run(capsys, *command)
        assert status == EXIT_USAGE and f"{missing}: does not exist" in one_line_error(err, command[0])


def test_a_folder_without_tokenizer_files_names_the_folders_inside(capsys):
    folder("qwen3")
    status, _, err = run(capsys, "check", str(DATA))
    line = one_line_error(err, "check")
    assert status == EXIT_USAGE
    assert f"{DATA}: is a folder without tokenizer files" in line and "qwen3" in line
    status, _, err = run(capsys, "matrix", "--tokenizer", str(DATA), str(REPO / "tmpl" / "templates"))
    assert status == EXIT_USAGE and "is a folder without tokenizer files" in one_line_error(err, "matrix")


@pytest.mark.skipif(not HOSTNAME.is_file(), reason="no /etc/hostname")
def test_a_file_that_is_not_a_template(capsys):
    status, out, err = run(capsys, "fix", str(HOSTNAME))
    line = one_line_error(err, "fix")
    assert status == EXIT_USAGE and out == ""
    assert "/etc/hostname: has no Jinja syntax" in line and "expected a tokenizer folder" in line
    assert "not a valid JSON" not in line
    status, _, err = run(capsys, "check", str(HOSTNAME))
    assert status == EXIT_USAGE and "/etc/hostname: is a file; expected a tokenizer folder" in one_line_error(
        err, "check"
    )
    status, _, err = run(capsys, "check", folder("qwen2.5-instruct"), "--template", str(HOSTNAME))
    assert status == EXIT_USAGE and "/etc/hostname: has no Jinja syntax" in one_line_error(err, "check")


def test_binary_and_non_utf8_templates(capsys, binary, latin1):
    qwen = folder("qwen2.5-instruct")
    status, out, err = run(capsys, "check", qwen, "--template", str(binary))
    assert status == EXIT_USAGE and out == ""
    assert f"{binary}: is a binary file; expected a chat template file" in one_line_error(err, "check")
    status, out, err = run(capsys, "check", qwen, "--template", str(latin1))
    offset = len("{% for m in messages %}{{ m.content }}{% endfor %} caf")
    assert status == EXIT_USAGE and out == ""
    assert f"{latin1}: is not UTF-8 text (byte 0xe9 at offset {offset})" in one_line_error(err, "check")
    status, _, err = run(capsys, "fix", str(latin1), "--tokenizer", qwen)
    assert status == EXIT_USAGE and "is not UTF-8 text" in one_line_error(err, "fix")


def test_json_that_is_not_a_tokenizer_config(capsys, tmp_path):
    qwen = folder("qwen2.5-instruct")
    not_config = tmp_path / "data.json"
    not_config.write_text('{"rows": [1, 2]}', encoding="utf-8")
    status, _, err = run(capsys, "check", qwen, "--template", str(not_config))
    assert status == EXIT_USAGE and f"{not_config}: is JSON without a chat_template" in one_line_error(err, "check")
    broken = tmp_path / "broken.json"
    broken.write_text("{'not': json", encoding="utf-8")
    status, _, err = run(capsys, "check", qwen, "--template", str(broken))
    assert status == EXIT_USAGE and f"{broken}: is not valid JSON" in one_line_error(err, "check")
    # a tokenizer config is a template file: its chat_template is used, named after the file (the text is
    # made unique: reports are kept per fingerprint, under the name of the first template checked)
    config = json.loads((Path(qwen) / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] += "{#- tokenizer config test -#}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    status, out, _ = run(capsys, "check", qwen, "--template", str(tmp_path / "tokenizer_config.json"), "--json")
    assert status == EXIT_SAFE and json.loads(out)["name"] == "tokenizer_config.json"


def test_template_text_is_never_taken_from_a_path_argument(capsys, tmp_path):
    qwen = folder("qwen2.5-instruct")
    status, out, err = run(capsys, "check", qwen, "--template", "/nonexistent.jinja")
    assert status == EXIT_USAGE and out == ""  # no report about the string "/nonexistent.jinja"
    assert "/nonexistent.jinja: does not exist; expected a chat template file" in one_line_error(err, "check")
    # a path without a template suffix or a separator is still a path on the command line
    status, out, err = run(capsys, "check", qwen, "--template", "my-template")
    assert status == EXIT_USAGE and out == "" and "my-template: does not exist" in one_line_error(err, "check")
    status, _, err = run(capsys, "check", qwen, "--template", str(tmp_path))
    assert status == EXIT_USAGE and f"{tmp_path}: is a folder; expected a chat template file" in err


def test_the_api_tells_paths_from_template_text(tokenizer_of, tmp_path):
    tok = tokenizer_of("qwen2.5-instruct")
    with pytest.raises(SourceNotFoundError, match="/nonexistent.jinja: does not exist") as info:
        ChatTemplate(tok, "/nonexistent.jinja")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, TemplateError)
    with pytest.raises(SourceNotFoundError, match="templates/mine.j2"):
        ChatTemplate(tok, "templates/mine.j2")
    with pytest.raises(SourceNotFoundError):
        ChatTemplate(tok, tmp_path / "absent.jinja")  # an os.PathLike is always a path
    with pytest.raises(TemplateSourceError, match="'qwen9': is neither Jinja template text"):
        ChatTemplate(tok, "qwen9")  # no Jinja syntax, no file: refused, not rendered as the text "qwen9"
    with pytest.raises(NotATemplateError, match="no Jinja syntax"):
        plain = tmp_path / "plain.txt"
        plain.write_text("hello", encoding="utf-8")
        ChatTemplate(tok, str(plain))
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert resolve_template(tok, text) == (text, None)
    good = tmp_path / "good.jinja"
    good.write_text(text, encoding="utf-8")
    assert resolve_template(tok, str(good)) == (text, "good") == resolve_template(tok, good)
    assert looks_like_path("a/b.jinja") and looks_like_path("x.j2") and not looks_like_path("{{ x }}.jinja")
    assert is_hub_id("Qwen/Qwen3-4B") and not is_hub_id("/abs/path") and not is_hub_id("a/b/c")
    assert not is_hub_id("../x") and not is_hub_id("gpt2")


# -- named after the source ----------------------------------------------------------------------


def test_a_template_is_named_after_where_its_text_came_from(tokenizer_of, tmp_path, capsys):
    tok = tokenizer_of("qwen2.5-instruct")
    text = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}{% endfor %}"
    custom = ChatTemplate(tok, text)
    assert custom.name.startswith("custom-") and custom.name != "qwen2.5-instruct"
    with pytest.raises(TmplError) as info:
        custom.suffix_ids([{"role": "tool", "content": "x"}], completion_ids=[1])
    assert custom.name in str(info.value) and "qwen2.5-instruct" not in str(info.value)
    assert ChatTemplate(tok).name == "qwen2.5-instruct" == ChatTemplate(tok, tok.chat_template).name
    path = tmp_path / "no-tools.jinja"
    path.write_text(text, encoding="utf-8")
    assert ChatTemplate.from_pretrained(folder("qwen2.5-instruct"), chat_template=path).name == "no-tools"
    assert ChatTemplate.from_pretrained(folder("qwen2.5-instruct")).name == "qwen2.5-instruct"
    status, out, _ = run(capsys, "check", folder("qwen2.5-instruct"), "--template", str(path))
    assert status == EXIT_UNPROVEN and out.startswith("# `no-tools.jinja`")  # the file's name, not the host's


# -- the hub without network ---------------------------------------------------------------------


def hub_run(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str, float, float]:
    """``tmpl <args>`` in a fresh process with an empty hub cache: status, stdout, stderr, seconds
    inside ``main`` (transformers imported before) and in all."""
    code = (
        "import sys, time, tmpl.cli, transformers\n"
        "t = time.perf_counter()\n"
        "try:\n    status = tmpl.cli.main(sys.argv[1:])\n"
        "except SystemExit as exc:\n    status = exc.code\n"
        "print(f'SECONDS {time.perf_counter() - t:.3f}', file=sys.stderr); sys.exit(status)"
    )
    full = {**PRISTINE_ENV, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"), **env}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TMPL_HUB_TIMEOUT", "TMPL_HUB_RETRIES"):
        if name not in env:
            full.pop(name, None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full, timeout=120)
    total = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    inside = float(lines[-1].split()[1])
    return done.returncode, done.stdout, "\n".join(lines[:-1]), inside, total


def test_a_hub_id_offline_fails_in_seconds_naming_the_ways_out(tmp_path):
    repo = "tmpl-tests/no-such-model"
    # a closed local port as the hub: refused at once; 2 tries (the default) then the message
    status, _, err, inside, total = hub_run(tmp_path, "check", repo, HF_ENDPOINT="http://127.0.0.1:9")
    line = one_line_error(err, "check")
    assert status == EXIT_USAGE and line.startswith(f"tmpl check: {repo}: is no local folder")
    assert "http://127.0.0.1:9 unreachable after 2 tries" in line and "Connection refused" in line
    assert "HF_HUB_OFFLINE=1" in line and "local folder" in line and "TMPL_HUB_TIMEOUT" in line
    assert "Retrying" not in err  # the hub client's 5 retries twice over (~49 s) never start
    assert inside < 4 and total < 20, (inside, total)
    # HF_HUB_OFFLINE=1: the hub is not asked; the local cache is empty
    status, _, err, inside, _ = hub_run(tmp_path, "check", repo, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    line = one_line_error(err, "check")
    assert status == EXIT_USAGE and "HF_HUB_OFFLINE=1 is set and it is not in the local hub cache" in line
    assert "local folder" in line and inside < 5


def test_hub_retries_and_timeout_are_configurable(tmp_path):
    repo = "tmpl-tests/no-such-model"
    status, _, err, _, _ = hub_run(
        tmp_path, "check", repo, HF_ENDPOINT="http://127.0.0.1:9", TMPL_HUB_RETRIES="0", TMPL_HUB_TIMEOUT="0.5"
    )
    assert status == EXIT_USAGE and "unreachable after 1 try" in err
    status, _, err, _, _ = hub_run(tmp_path, "check", repo, HF_ENDPOINT="http://127.0.0.1:9", TMPL_HUB_RETRIES="3")
    assert status == EXIT_USAGE and "unreachable after 4 tries" in err
    status, _, err, _, _ = hub_run(tmp_path, "check", repo, HF_ENDPOINT="http://127.0.0.1:9", TMPL_HUB_TIMEOUT="soon")
    assert status == EXIT_USAGE and "TMPL_HUB_TIMEOUT='soon': expected a number of seconds > 0" in err
    status, _, err, _, _ = hub_run(tmp_path, "check", repo, "--hub-timeout", "0")
    assert status == EXIT_USAGE and "argument --hub-timeout: expected a number of seconds > 0" in err


def fake_hub_cache(root: Path, repo: str, source: str) -> Path:
    """A hub cache (``HF_HUB_CACHE``) holding ``repo`` as a download would leave it: one snapshot with
    the tokenizer files of the local folder ``source``, the files the hub does not have marked so."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision, encoding="utf-8")
    for f in Path(source).iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    absent = repo_dir / ".no_exist" / revision
    absent.mkdir(parents=True)
    for name in (
        "config.json",
        "generation_config.json",
        "chat_template.jinja",
        "chat_template.json",
        "added_tokens.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "processor_config.json",
        "preprocessor_config.json",
        "vocab.json",
        "merges.txt",
        "tekken.json",
    ):
        if not (snapshot / name).exists():
            (absent / name).touch()
    return root


def test_an_unreachable_hub_falls_back_to_the_local_cache(tmp_path):
    repo = "tmpl-tests/cached-qwen"
    cache = fake_hub_cache(tmp_path / "cache", repo, folder("qwen2.5-instruct"))
    for env in ({"HF_ENDPOINT": "http://127.0.0.1:9"}, {"HF_HUB_OFFLINE": "1"}):
        status, _, err, inside, _ = hub_run(tmp_path, "check", repo, "--json", HF_HUB_CACHE=str(cache), **env)
        assert status == EXIT_SAFE, err
        assert "Retrying" not in err


def test_the_api_raises_a_typed_error_for_an_unreachable_hub(monkeypatch):
    from tmpl import sources

    monkeypatch.setattr(sources, "_hub_endpoint", lambda: "http://127.0.0.1:9")
    monkeypatch.setattr(sources, "_hub_offline", lambda: False)
    start = time.perf_counter()
    with pytest.raises(HubUnreachableError) as info:
        sources.load_tokenizer("tmpl-tests/no-such-model", hub_timeout=1.0, hub_retries=0)
    assert time.perf_counter() - start < 5
    assert isinstance(info.value, ConnectionError) and info.value.timeout == 1.0
    assert info.value.source == "tmpl-tests/no-such-model" and "HF_HUB_OFFLINE=1" in str(info.value)


# -- exit statuses -------------------------------------------------------------------------------


def test_check_exit_statuses_follow_the_gated_verdicts(capsys):
    status, out, err = run(capsys, "check", folder("qwen2.5-instruct"))
    assert status == EXIT_SAFE and "tool loop (token-in/token-out): SAFE" in out and err == ""
    status, out, err = run(capsys, "check", folder("mistral-nemo-instruct-2407"), "--json")
    assert status == EXIT_UNSAFE and json.loads(out)["verdicts"]["tool_loop"]["level"] == "UNSAFE"
    assert one_line_error(err, "check").startswith("tmpl check: tool_loop is UNSAFE (")
    status, out, err = run(capsys, "check", folder("gemma-2-it"))
    assert status == EXIT_UNPROVEN and "tool_loop is UNSUPPORTED" in one_line_error(err, "check")
    # SAFE WITH tmpl TEMPLATE qwen3: the template given is not safe itself; it gates as its own verdict
    status, out, err = run(capsys, "check", folder("qwen3"))
    line = one_line_error(err, "check")
    assert status == EXIT_UNSAFE and "SAFE WITH tmpl TEMPLATE qwen3" in out
    assert "tool_loop is UNSAFE (" in line and "tmpl ships a safe template for it: qwen3" in line


def latest_user_marked(tokenizer_of, tmp_path: Path) -> Path:
    """Qwen2.5's template with the latest user message marked " (latest)": a tool loop within one user
    turn keeps its renders (SAFE), a new user turn changes an earlier one (UNSAFE for multi_user)."""
    text = tokenizer_of("qwen2.5-instruct").chat_template
    close = "message.content + '<|im_end|>'"
    assert text.count(close) == 1
    marked = text.replace(close, "message.content + (' (latest)' if loop.index0 == ns_u.last else '') + '<|im_end|>'")
    count = "{%- set ns_u = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    count += "{%- set ns_u.last = loop.index0 %}{%- endif %}{%- endfor %}"
    path = tmp_path / "latest-user.jinja"
    path.write_text(count + marked, encoding="utf-8")
    return path


def test_require_chooses_the_verdicts_that_gate(capsys, tokenizer_of, tmp_path):
    qwen, template = folder("qwen2.5-instruct"), str(latest_user_marked(tokenizer_of, tmp_path))
    status, out, err = run(capsys, "check", qwen, "--template", template, "--json")
    verdicts = json.loads(out)["verdicts"]
    assert verdicts["tool_loop"]["level"] == "SAFE" and verdicts["multi_user"]["level"] == "UNSAFE"
    assert status == EXIT_SAFE and err == ""  # the default gates the tool loop only
    status, _, err = run(capsys, "check", qwen, "--template", template, "--require", "multi_user")
    assert status == EXIT_UNSAFE and "multi_user is UNSAFE" in one_line_error(err, "check")
    assert run(capsys, "check", qwen, "--template", template, "--require", "tool_loop,multi_user")[0] == EXIT_UNSAFE
    assert run(capsys, "check", qwen, "--template", template, "--require", " tool_loop ")[0] == EXIT_SAFE
    status, _, err = run(capsys, "check", qwen, "--require", "tool_loop,everything")
    assert status == EXIT_USAGE and "unknown use 'everything'; choose from tool_loop, multi_user" in err
    # SAFE WITH tmpl TEMPLATE gates as the template's own verdict, for each use asked for
    status, _, err = run(capsys, "check", folder("qwen3"), "--require", "multi_user")
    assert status == EXIT_UNSAFE and "multi_user is UNSAFE" in one_line_error(err, "check")


def test_a_budget_that_runs_out_is_unproven(capsys, tmp_path):
    pytest.importorskip("tmpl.report.budget")
    loops = tmp_path / "loops.jinja"
    loops.write_text(
        "{% for i in range(99999) %}{% for j in range(99999) %}{{ i }}{% endfor %}{% endfor %}", encoding="utf-8"
    )
    start = time.perf_counter()
    status, out, err = run(capsys, "check", folder("qwen2.5-instruct"), "--template", str(loops), "--budget", "3s")
    assert time.perf_counter() - start < 30
    assert status == EXIT_UNPROVEN and "UNPROVEN (budget exceeded" in out
    assert "tool_loop is UNPROVEN (budget exceeded" in one_line_error(err, "check")
    status, _, err = run(capsys, "check", folder("qwen2.5-instruct"), "--budget", "fast")
    assert status == EXIT_USAGE and "argument --budget: budget 'fast'" in err
    # the matrix row and the fix of the same template end within their budget too, status 3
    start = time.perf_counter()
    status, out, err = run(
        capsys, "matrix", "-q", "--tokenizer", folder("qwen2.5-instruct"), str(loops), "--budget", "3s"
    )
    assert status == EXIT_UNPROVEN and "UNPROVEN (budget exceeded" in out and "1 UNPROVEN" in err
    status, out, err = run(capsys, "fix", str(loops), "--tokenizer", folder("qwen2.5-instruct"), "--budget", "3s")
    assert status == EXIT_UNPROVEN and out == "" and "budget exceeded" in one_line_error(err, "fix")
    assert time.perf_counter() - start < 40


def test_fix_exit_statuses(capsys, tmp_path):
    status, out, _ = run(capsys, "fix", folder("qwen3"), "-o", str(tmp_path / "fixed.jinja"))
    assert status == EXIT_SAFE and "## Proof" in out and (tmp_path / "fixed.jinja").is_file()
    status, out, err = run(capsys, "fix", folder("gemma-2-it"))
    assert status == EXIT_UNPROVEN and out == "" and "refused" in err and "usable tool conversation" in err
    glm = DATA / "templates" / "llama.cpp" / "GLM-4.6.jinja"
    if glm.is_file():
        status, _, err = run(capsys, "fix", str(glm), "--tokenizer", folder("qwen3"))
        assert status == EXIT_UNSAFE and "refused" in err and "GLM-4.6.jinja" in err
        status, _, err = run(capsys, "fix", str(glm))  # a template file needs a tokenizer to render with
        assert status == EXIT_USAGE and "--tokenizer" in one_line_error(err, "fix")


def test_a_refused_fix_prints_its_counterexample(capsys):
    """Gemma 4's content + calls break (issue 21): refused with the conversation that breaks the rewrite,
    status 1; a proven rewrite (status 0) would print its proof instead."""
    status, out, err = run(capsys, "fix", folder("gemma-4-it"))
    if status == EXIT_SAFE:
        pytest.skip("gemma-4-it's rewrite is proven now: nothing refused to print")
    assert status == EXIT_UNSAFE and out == "" and "tmpl fix: refused: chat template 'gemma-4-it'" in err
    assert "counterexample (" in err and "messages = [" in err and "first difference at token" in err


def test_matrix_exit_status_is_the_worst_row(capsys, tmp_path, latin1):
    assert run(capsys, "matrix", "-q")[0] == EXIT_SAFE  # the shipped templates
    status, out, err = run(capsys, "matrix", "-q", folder("qwen2.5-instruct"), folder("qwen3"))
    assert status == EXIT_UNSAFE and "SAFE WITH tmpl TEMPLATE qwen3" in out
    assert "1 UNSAFE (of 2 templates; gated on tool_loop)" in one_line_error(err, "matrix")
    status, _, err = run(capsys, "matrix", "-q", folder("qwen2.5-instruct"), folder("gemma-2-it"))
    assert status == EXIT_UNPROVEN and "1 UNSUPPORTED" in err
    # a row that failed to load (a non-UTF-8 template) counts as unproven, the others still run
    status, out, err = run(capsys, "matrix", "-q", "--tokenizer", folder("qwen2.5-instruct"), str(latin1))
    assert status == EXIT_UNPROVEN and "SKIPPED" in out and "1 SKIPPED" in err


def test_replay_exit_statuses(capsys, tmp_path, binary):
    from .test_drift import FUNCS, SCHEMAS, USER, Scripted, _tpl, export

    tpl = _tpl("qwen2.5-instruct")
    enc = tpl.codec.encode
    reordered = enc('<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call><|im_end|>')
    final = enc("Sunny.<|im_end|>")

    def policy(req, answers):
        turn = int(req.request_id.split("-")[2])
        return answers[0] if turn == 0 else answers[1]

    def exported(name, answers):
        rollout = tmpl.Rollout(
            tpl, Scripted(lambda r: policy(r, answers)), tools=FUNCS, max_turns=3, measure_drift=True
        )
        return str(export.to_jsonl(rollout.run([USER]), tmp_path / name))

    drifted = exported("drifted.jsonl", (reordered, final))
    status, out, _ = run(capsys, "replay", drifted)
    assert status == EXIT_UNSAFE and "1 samples, 1 measured, 1 drifted: json_reserialized 1" in out
    clean = exported("clean.jsonl", (final, final))
    status, out, _ = run(capsys, "replay", clean)
    assert status == EXIT_SAFE and "0 drifted" in out
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(SCHEMAS), encoding="utf-8")
    assert run(capsys, "replay", drifted, "--model", folder("qwen2.5-instruct"), "--tools", str(tools))[0] == 1
    status, _, err = run(capsys, "replay", str(binary))
    assert status == EXIT_USAGE and f"{binary}: cannot be read" in one_line_error(err, "replay")
    status, _, err = run(capsys, "replay", clean, "--model", folder("qwen2.5-instruct"), "--tools", str(binary))
    assert status == EXIT_USAGE and f"{binary}: cannot be read as JSON" in one_line_error(err, "replay")
    status, _, err = run(capsys, "replay", clean, "--model", folder("qwen2.5-instruct"), "--tools", "/nope.json")
    assert status == EXIT_USAGE and "/nope.json: does not exist" in one_line_error(err, "replay")


def test_the_console_script_returns_the_status(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tmpl", "check", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        env={**PRISTINE_ENV, "HF_HUB_OFFLINE": "1"},
        cwd=os.getcwd(),
    )
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert one_line_error(done.stderr, "check").endswith(
        "does not exist; expected a tokenizer folder "
        "(with tokenizer_config.json or tokenizer.json), "
        "or a hub id like owner/name"
    )
