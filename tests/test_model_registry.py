"""The lazy family registry (``models``, ``models.registry_sources``): a family's module is
imported only when that family is asked for, and the names it registers (model names and tiny
builders) are read from its source, so listing imports nothing and asking finds the module
whatever spelling it registers with."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_tiny_builders_of_families_not_yet_imported_are_found():
    """``models.tiny`` is public (docs/models.md): in a fresh process ``tiny_families()`` lists
    every family's builder without importing torch, and asking for one imports its module. Before,
    builders registered themselves on import only, so ``tiny_model_path('qwen2_vl')`` answered 'no
    tiny model builder for family qwen2_vl; families with one: llava' unless something had
    imported every interface first."""
    out = _fresh("""
        import sys
        from reform_eval.models.tiny import has_tiny_size, tiny_families
        print(sorted(tiny_families()), "torch" in sys.modules)
        print(has_tiny_size("mllama", "tiny"), "reform_eval.models.interfaces.mllama_interface" in sys.modules,
              "reform_eval.models.interfaces.qwen2_vl_interface" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr[-800:]
    listed, asked = out.stdout.strip().splitlines()[-2:]
    families = eval(listed.rsplit("]", 1)[0] + "]")
    assert {"llava", "qwen2_vl", "mllama", "blip2", "blip2_t5", "instructblip_t5", "paligemma"} <= set(families)
    assert listed.endswith("False")  # listing imported no family module
    assert asked == "True True False"  # asking imported that family's module, and only it


def test_the_deprecation_test_collects_every_tiny_family():
    """tests/test_deprecations.py parametrizes over ``tiny_families()`` at collection: run on its
    own it collected one case (llava) instead of one per family."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                          "tests/test_deprecations.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    cases = [ln for ln in out.stdout.splitlines() if "test_no_deprecation_warnings_from_our_calls[" in ln]
    assert len(cases) >= 12, out.stdout[-800:]


@pytest.fixture
def extra_interfaces(tmp_path, monkeypatch):
    """A second interface folder on the package path, read afresh; forgotten afterwards."""
    from reform_eval import models
    import reform_eval.models.interfaces as pkg
    from reform_eval.models import registry_sources, tiny

    monkeypatch.setattr(pkg, "__path__", list(pkg.__path__) + [str(tmp_path)])
    registry_sources.rescan()
    before = set(models.MODELS)
    yield tmp_path
    registry_sources.rescan()
    for name in set(models.MODELS) - before:
        del models.MODELS[name]
    for key in [k for k in tiny._BUILDERS if k[0].startswith("zz_")]:
        del tiny._BUILDERS[key]
    for mod in [m for m in sys.modules if m.startswith("reform_eval.models.interfaces.zz_")]:
        del sys.modules[mod]


def test_every_spelling_of_a_registration_is_found(extra_interfaces):
    """``@register_model(name="x")`` is valid Python for ``register_model(name)``; the registry's
    regex read only ``@register_model("x")``, so such a family was 'unknown' although its module
    existed, and nothing told the author. Keyword, single-quoted and qualified spellings, and a
    tiny builder registered by keyword, are all found, and the family loads when asked for."""
    from reform_eval import models
    from reform_eval.models.tiny import tiny_families

    (extra_interfaces / "zz_kw_interface.py").write_text(textwrap.dedent("""
        from reform_eval import models
        from reform_eval.models import register_model
        from reform_eval.models.tiny import register_tiny_builder


        @register_model(name="zz_kw")
        def make(config):
            return "kw", str


        @models.register_model( 'zz_quoted' )
        def make_quoted(config):
            return "quoted", str


        register_tiny_builder(family="zz_kw", fn=lambda out, size: None)
    """))
    assert {"zz_kw", "zz_quoted"} <= set(models.available_models())
    assert "zz_kw" in tiny_families()
    assert models.get_model("zz_kw", {})[0] == "kw"
    assert models.get_model("zz_quoted", {})[0] == "quoted"


def test_a_registration_the_scanner_cannot_read_is_an_error_naming_its_line(extra_interfaces):
    """A name that is not a literal string cannot be read without importing: one line naming the
    file and line, never a family silently missing."""
    from reform_eval import models
    from reform_eval.utils.errors import ReformError

    (extra_interfaces / "zz_var_interface.py").write_text(
        "from reform_eval.models import register_model\nNAME = 'zz_var'\n\n\n@register_model(NAME)\ndef make(config):\n"
        "    return object(), str\n")
    with pytest.raises(ReformError, match=r"zz_var_interface\.py:5: register_model\(\.\.\.\) must name"):
        models.available_models()
