"""The docs cannot rot: the generated reference covers the code, the getting-started page's
commands run, and the README stays a front page.

The reference pages are generated from the code at every build (docs/gen_reference.py, a
MkDocs hook), so these tests check the generator against independent walks of the same code.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import quantune

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema_paths(schema: dict[str, Any]) -> set[str]:
    """Every field's dotted path in a JSON Schema, resolving $refs: ``[]`` for a list's items,
    ``<key>`` for a mapping's values."""
    defs = schema.get("$defs", {})
    paths: set[str] = set()

    def objects(node: dict[str, Any], step: str = ".") -> list[tuple[dict[str, Any], str]]:
        if "$ref" in node:
            return [(defs[node["$ref"].rsplit("/", 1)[1]], step)]
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            return objects(node["items"], "[].")
        if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            return objects(node["additionalProperties"], ".<key>.")
        found = []
        for key in ("anyOf", "oneOf", "allOf"):
            for option in node.get(key, []):
                found.extend(objects(option, step))
        return found if found else ([(node, step)] if "properties" in node else [])

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, prop in node.get("properties", {}).items():
            path = prefix + name
            paths.add(path)
            for nested, step in objects(prop):
                walk(nested, path + step)

    walk(schema, "")
    return paths


def test_the_config_reference_lists_every_field_of_the_schema(gen):
    page = gen.config_reference()
    paths = schema_paths(quantune.Config.model_json_schema())
    assert {"model", "data.evaluation", "passes[].name", "rules[].forbid", "executor.memory_limit_mb"} <= paths
    missing = sorted(p for p in paths if f"`{p}`" not in page)
    assert not missing, f"fields of the config schema missing from reference/config.md: {missing}"


def test_the_config_reference_lists_every_strategy_option(gen):
    from quantune.schema import config_json_schema

    page = gen.config_reference()
    for name, options in config_json_schema()["x-strategy-options"].items():
        assert f"### `{name}`" in page
        for path in schema_paths(options):
            assert f"`search.strategy_options.{path}`" in page, (name, path)


def test_the_cli_reference_lists_every_command_and_flag(gen):
    from quantune.cli import build_parser

    page = gen.cli_reference()
    usage = build_parser().format_help()
    commands = re.search(r"\{([a-z,]+)\}", usage)
    assert commands
    for command in commands.group(1).split(","):
        assert f"## `quantune {command}`" in page
        help_text = subprocess.run(
            [sys.executable, "-m", "quantune", command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        for flag in set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text)) - {"--help"}:
            assert f"`{flag}`" in page, (command, flag)


def test_the_passes_and_registries_pages_name_everything_registered(gen):
    passes, registries = gen.passes_reference(), gen.registries_reference()
    for name in quantune.pass_names():
        assert f"## `{name}`" in passes
        for param in quantune.get_pass(name).Config.model_fields:
            assert f"| `{param}` |" in passes, (name, param)
    for name in [*quantune.sampler_names(), *quantune.strategy_names(), *quantune.metric_names()]:
        assert f"| `{name}` |" in registries


def test_the_results_reference_lists_every_key_a_run_writes(gen, make_config, tmp_path):
    import json

    result = quantune.tune(make_config(stop={"max_trials": 1}), output=tmp_path / "out")
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    page = gen.results_reference()
    for key in written:
        assert f"| `{key}` |" in page, key
    for key in written["trials"][0]:
        assert f"| `{key}` |" in page, key
    assert result.trials


def test_the_api_reference_documents_every_public_name(gen):
    page = gen.api_reference()
    for name in quantune.__all__:
        if not name.startswith("_"):
            obj = getattr(quantune, name)
            assert f"::: {obj.__module__}.{obj.__qualname__}" in page


def marked_blocks(page: Path) -> list[str]:
    """The ```sh blocks of a page preceded by a ``<!-- test -->`` line, in order."""
    return re.findall(r"<!-- test -->\n```sh\n(.*?)```", page.read_text(), flags=re.S)


def test_the_getting_started_commands_run(tmp_path):
    blocks = marked_blocks(DOCS / "getting-started.md")
    assert len(blocks) >= 4, "the page's init, check, run and result blocks are marked <!-- test -->"
    script = "set -euo pipefail\n" + "\n".join(blocks)
    for command in ("quantune init", "quantune check", "quantune run"):
        assert command in script
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the page's commands run from a clone's root
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok: the data fits the model" in done.stdout
    verdict = done.stdout.strip().splitlines()[-1].split(" - ")[0]
    assert verdict in {"improved", "unconfirmed", "keep_original", "no_candidate_in_budget"}, done.stdout[-2000:]
    assert (tmp_path / "mine" / "runs" / "quantune" / "run.db").is_file()


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.findall(r"\b\d{4}-\d{2}-\d{2}\b", text), "no dates in the README"
    assert not re.findall(r"\b[0-9a-f]{7,40}\b", text), "no commit hashes in the README"
    for command in ("make demo", "make test", "quantune init", "quantune check", "quantune run"):
        assert command in text
    assert "make test" in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"


def test_the_readme_and_pages_link_to_files_that_exist():
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"


def test_the_extending_examples_run_as_a_plugin(make_config, tmp_path):
    """docs/extending.md's pass, sampler, strategy and metric (docs/examples/my_plugins.py) in one run."""
    config = make_config(
        passes=[{"name": "magnitude_prune", "search": True}, {"name": "dynamic_quant"}],
        plugins=[str(DOCS / "examples" / "my_plugins.py")],
        evaluation={"metric": "macro_f1", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        search={"sampler": "shuffled", "strategy": "first-met", "seed": 0},
        stop={"max_trials": 3},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.baseline["macro_f1"] == pytest.approx(1.0)  # the tiny CNN's labels are its own predictions
    ok = [t for t in result.trials if t.status == "ok"]
    assert ok and all(t.flow == ["magnitude_prune", "dynamic_quant"] for t in ok)
    assert {t.params["magnitude_prune.sparsity"] for t in ok} <= {0.0, 0.25, 0.5}
    assert "met: stopping" in ok[-1].stage and len(result.trials) == 1


def test_every_yaml_block_of_the_docs_is_a_valid_config():
    """Each ```yaml block, merged into a minimal config, passes the schema: no page names a field
    the config does not have (a renamed or removed field fails here, not in a user's run)."""
    import yaml

    base = {"model": "model.onnx", "data": {"evaluation": "eval.npz"}, "passes": [{"name": "dynamic_quant"}]}
    checked = 0
    for page in sorted(DOCS.rglob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
            config = {**base, **yaml.safe_load(block)}
            try:
                quantune.Config.model_validate(config)
            except Exception as error:  # the page and the block, not only pydantic's message
                raise AssertionError(f"{page.relative_to(ROOT)}: a yaml block is no valid config:\n{block}") from error
            checked += 1
    assert checked >= 10


def test_the_pages_hold_no_dates_or_commit_hashes():
    """Figures in the docs are the current ones, with the command that reproduces them; the
    history of how they changed lives in git and bench/history/."""
    for page in [*sorted(DOCS.rglob("*.md")), ROOT / "CONTRIBUTING.md"]:
        text = page.read_text()
        assert not re.findall(r"\b\d{4}-\d{2}-\d{2}\b", text), page
        assert not re.findall(r"\b[0-9a-f]{7,40}\b", text), page


def test_the_extending_quantizer_falls_back_through_its_knobs(make_config, tmp_path):
    """docs/extending.md's plugin quantizer names its exclude parameter in ``knobs``: an accuracy
    strategy quantizes with it and keeps nodes in float through it, though no name is shared with
    onnxruntime's passes."""
    config = make_config(
        passes=[{"name": "int8_weights", "search": True}],
        plugins=[str(DOCS / "examples" / "my_plugins.py")],
        search={"strategy": "conservative", "seed": 0},
        stop={"max_trials": 3},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    ok = [t for t in result.trials if t.status == "ok"]
    assert ok and all(t.flow == ["int8_weights"] for t in ok)
    assert any(t.params.get("int8_weights.keep_float") for t in ok), [t.params for t in ok]
    assert any(t.metrics.get("quantized_ops", 0) > 0 for t in ok), [t.metrics for t in ok]


def test_the_snippet_lines_are_intact():
    """A formatter that reads a ```python block as code turns ``--8<-- "file"`` into ``--8 < --"file"``,
    which MkDocs prints as it stands instead of the file: such blocks are fenced with
    ``<!-- fmt:off -->``, and every snippet line must still be one."""
    for page in sorted(DOCS.rglob("*.md")):
        for line in page.read_text().splitlines():
            if "8<" in line.replace(" ", ""):
                assert re.fullmatch(r'--8<-- "[^"]+"', line.strip()), f"{page.relative_to(ROOT)}: {line}"
