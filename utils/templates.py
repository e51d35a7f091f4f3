"""Rendering a Jinja template that came from a file (another harness's log), bounded.

Why a child process: Jinja's sandbox blocks code, not work. A template can loop 10^10 times
(nested ``range`` loops), build a string of gigabytes in one C call (``'x' * 10**10``,
``center(10**10)``) or recurse; nothing inside one Python process stops a single C call. So the
template is rendered in a child Python with a CPU-time limit (``RLIMIT_CPU``, which machine load
does not shorten), an address-space limit (``RLIMIT_AS``) and a cap on what one rendering may
produce, and a hostile file is refused in one line within seconds. The environment is the one
transformers renders chat templates with (sandboxed, ``trim_blocks``, ``lstrip_blocks``, loop
controls). One child renders every context of a file (about 0.1 s to start).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

from .errors import input_error

#: CPU seconds one child may use for all its renderings (a chat prompt takes milliseconds)
MAX_CPU_SECONDS = 3
#: address space of the child (bytes): room for Python and jinja2, not for a bomb
MAX_MEMORY_BYTES = 1024 ** 3
#: characters one rendering may produce (a chat prompt is a few thousand)
MAX_RENDERED_CHARS = 1024 ** 2
#: wall-clock backstop (seconds), far past the CPU limit: only a child that does not run ends here
WALL_SECONDS = 120

_EXIT_MEMORY, _EXIT_OUTPUT = 3, 4

_CHILD = r"""
import json, sys
cpu, memory, cap = (int(a) for a in sys.argv[1:4])
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
except (ImportError, ValueError, OSError):
    pass  # no resource limits here: the parent's wall-clock backstop still ends the child
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
job = json.loads(sys.stdin.read())
out = []
try:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    try:
        template = env.from_string(job["template"])
    except (jinja2.TemplateError, TypeError, ValueError):
        template = None
    for context in job["contexts"]:
        if template is None:
            out.append(None)
            continue
        parts, size = [], 0
        try:
            for chunk in template.generate(**context):
                size += len(chunk)
                if size > cap:
                    sys.exit(4)
                parts.append(chunk)
            out.append("".join(parts))
        except (jinja2.TemplateError, TypeError, ValueError, OverflowError, ArithmeticError, LookupError,
                AttributeError, RecursionError):
            out.append(None)
except MemoryError:
    sys.exit(3)
sys.stdout.write(json.dumps(out))
"""


def render_templates(template: str, contexts: Sequence[Dict[str, Any]], file: Optional[str] = None,
                     field: Optional[str] = None) -> List[Optional[str]]:
    """``template`` rendered with each context (JSON values), as transformers renders a chat
    template; None for a context where the template does not render (a template error), every
    one None when jinja2 is not installed. A template that exceeds the CPU, memory or output
    bounds is refused in one line naming ``file`` and ``field``."""
    if not contexts:
        return []
    if importlib.util.find_spec("jinja2") is None:  # a dependency of transformers; only a template needs it
        return [None] * len(contexts)
    job = json.dumps({"template": template, "contexts": list(contexts)})
    limits = (MAX_CPU_SECONDS, MAX_MEMORY_BYTES, MAX_RENDERED_CHARS)
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, *map(str, limits)], input=job, capture_output=True,
                              text=True, encoding="utf-8", timeout=WALL_SECONDS)
    except subprocess.TimeoutExpired:
        why = f"did not finish within {WALL_SECONDS} s"
    else:
        if done.returncode == 0:
            try:
                rendered = json.loads(done.stdout)
            except ValueError:
                rendered = None
            if isinstance(rendered, list) and len(rendered) == len(contexts):
                return rendered
            why = "gave no result"
        elif done.returncode == _EXIT_MEMORY or "MemoryError" in done.stderr:
            why = f"needs more than {MAX_MEMORY_BYTES} bytes of memory"
        elif done.returncode == _EXIT_OUTPUT:
            why = f"produces more than {MAX_RENDERED_CHARS} characters"
        elif done.returncode < 0:  # killed: SIGXCPU at the CPU limit, SIGKILL past it
            why = f"uses more than {MAX_CPU_SECONDS} s of CPU (a loop without end?)"
        else:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            why = f"failed (exit code {done.returncode}: {last[:200]})"
    raise input_error(f"the template is refused: rendering it {why}, where a chat template renders in "
                      "milliseconds", file=file, field=field)
