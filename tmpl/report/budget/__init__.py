"""Budgets: every check of a template tmpl did not ship ends within a bounded time and memory.

A chat template is code written by strangers. ``{% for i in range(99999) %}{% for j in range(99999) %}``
runs for hours, ``{{ 'x' * 1000000000 }}`` asks for a gigabyte; Jinja's sandbox stops neither. So a
report, a fix or a matrix row on such a template runs as one *job* under a :class:`Budget`:

- **a forked worker process** (``os.fork``: the template, tokenizer and imports are inherited, nothing is
  pickled on the way in) with ``RLIMIT_AS`` set, when a job starts, to the address space the worker
  has then plus ``memory_mb`` (a large allocation fails with ``MemoryError`` in the worker, never in
  the caller; a native library that aborts instead is reported as out of memory), and ``RLIMIT_CPU``
  as a backstop should the parent die;
- **a wall-clock deadline** kept by the parent, which ``SIGKILL``s the worker at ``seconds``: a loop
  inside one C call (``str * int``, ``re``) cannot be interrupted from inside, a process can;
- **Jinja hooks** in the worker (installed only there, so nothing changes in the caller): ``*``, ``+`` and
  ``**`` on strings, lists and numbers are intercepted and refused before they build a value of more than
  ``output_chars`` items, and a render's output is counted as Jinja yields it, so a template that doubles
  its output or loops a billion times emitting text stops at ``output_chars`` within milliseconds,
  instead of growing until the memory limit;
- the result comes back pickled through a pipe (an exception as its class, args and attributes).

Exceeded: :class:`~tmpl.errors.BudgetExceededError` naming the template, the budget that ran out and its
limit; :func:`tmpl.report.check` turns it into a report whose verdicts are ``UNPROVEN (budget exceeded:
...)``. A worker killed by a signal (a C stack overflow on a deeply nested template, a native library
aborting when out of memory) is reported as such, never as a pass.

Why a worker process and not only in-process hooks: only a process can be stopped in the middle of a
C call, and only a process limit covers memory the hooks do not see (an intermediate list, a regex, a
tokenizer call). What it costs, measured on the 2-core development machine (Python 3.11,
transformers 5.23): a fork, an empty job and its answer take 3.7 ms from a process with tmpl imported,
7 ms with one tokenizer loaded (medians of 30-50), 18 ms when the machine was loaded by other work;
``check`` of qwen2.5-instruct took 261 ms in a worker against 226 ms in process (median of 7, loaded
machine, caches cleared each time). The cost grows with the parent's size: from a process holding
40 tokenizers (1.2 GB resident) a fork took 35 ms and the worker's exit 53 ms, and a worker that
inherits a big heap pays copy-on-write faults (the collector is frozen in workers so that it does not
touch every inherited object). So the matrix does not fork per template from a parent that loads
every tokenizer: its parent loads nothing, and each of its 2 workers loads and checks template after
template (a tokenizer stays loaded in the worker that loaded it, and templates sharing a tokenizer go
to that worker), with the budget and limits reset per template; a worker that ran out of budget or
crashed is replaced by a fresh fork. The rollout's hot path never calls this module.

Defaults (:data:`DEFAULT_BUDGET`), far above the slowest real template, measured by running each of
the 97 catalog templates (``../shared/tokenizers/templates/catalog.json``; 95 load), the 11 families
in ``../shared/tokenizers`` with their own templates and the 5 templates tmpl ships, one at a time,
each in a fresh worker that loads its tokenizer and checks it (2 cores, load average ~4 from other
work at the time):

- slowest ``check``: 1.63 s (``gemma4_e2b_chat_template.jinja`` @ gemma-4-it; median 0.21 s); slowest
  job with its tokenizer load: 9.1 s (``google-gemma-4.jinja`` @ gemma-4-it: the 262k-token Gemma 4
  tokenizer loads in ~7 s); the default, 60 s, is 6.6x the slowest job and 37x the slowest check;
- most address space a job added: 947 MB (the Gemma 4 tokenizer's load; checks on loaded tokenizers
  add far less); the default is 4096 MB;
- biggest single render: 16,288 characters (``unsloth-mistral-Devstral-Small-2507.jinja``); the
  default, 10,000,000 characters (10M), is 600x that.

Change them with ``tmpl.report.check(tpl, budget=Budget(seconds=10))``, or ``Budget.parse("10s,1GB,1M")``
for a command-line flag (``--budget``).

Its modules: :mod:`.limits` (the budget as data), :mod:`.hooks` (what the worker enforces inside),
:mod:`.worker` (the forked worker and the parent's wait), :mod:`.jobs` (running jobs under a budget).
"""

from __future__ import annotations

from .jobs import imap_budgeted, run_budgeted, run_job
from .limits import DEFAULT_BUDGET, Budget
from .worker import Outcome, Worker, in_worker, progress, worker_crashed

__all__ = [
    "DEFAULT_BUDGET",
    "Budget",
    "Outcome",
    "Worker",
    "imap_budgeted",
    "in_worker",
    "progress",
    "run_budgeted",
    "run_job",
    "worker_crashed",
]
