"""``python -m build`` typed in a clone's root finds this folder before PyPA's ``build`` (the
working directory comes first on ``sys.path``): hand the command over to PyPA's build, so the
standard way to make this project's sdist and wheel works where users type it."""
import os
import runpy
import sys

if __spec__ is not None and __spec__.name == "build.__main__":
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    for _name in [m for m in sys.modules if m == "build" or m.startswith("build.")]:
        del sys.modules[_name]
    try:
        runpy.run_module("build", run_name="__main__", alter_sys=True)
    except ImportError as e:
        sys.exit(f"python -m build: PyPA's build is not installed here ({e}); pip install build")
else:
    sys.exit("reform_eval.build holds the dataset builders, not a command (to make a wheel: python -m build)")
