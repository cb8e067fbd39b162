#!/usr/bin/env python3
"""The oracle for strata's template renderer: renders chat templates with Jinja2 as Hugging Face
transformers does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, its
raise_exception / strftime_now / tojson).

stdin: a JSON list of {"template": PATH, "context": {...}, "now": EPOCH_SECONDS}.
stdout: a JSON list of {"text": ...} or {"error": ...}, one per case."""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    results = []
    compiled = {}
    for case in json.load(sys.stdin):
        try:
            key = (case["template"], case.get("now", 0))
            if key not in compiled:
                env = make_env(case.get("now", 0))
                with open(case["template"], encoding="utf-8") as f:
                    compiled[key] = env.from_string(f.read())
            template = compiled[key]
            results.append({"text": template.render(**case["context"])})
        except Exception as e:  # every failure is an answer: the renderer must fail too
            results.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
