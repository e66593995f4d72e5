"""Import boundaries that keep the installed packages usable on their own (static, by AST).

- asd_jax, vsd_jax, models and configs never import scripts/: pip installs only the four
  packages, so such an import fails outside the repository root.
- The public decode engine (asd_jax/__init__.py and everything it imports) never imports the
  model zoo (models/) or the presets (configs/) (STYLE.md 2): any JAX model plugs in through
  LanguageModelFns, and the tests drive the engine with fakes.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("asd_jax", "vsd_jax", "models", "configs")


def _imports(path: Path) -> set[str]:
  """Every module `path` imports, at module level or inside functions."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module)
  return names


def test_installed_packages_never_import_scripts():
  offenders = [f"{path.relative_to(ROOT)}: {name}"
               for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
               for name in _imports(path) if name.split(".")[0] == "scripts"]
  assert not offenders, offenders


def test_the_public_engine_never_imports_the_model_zoo():
  seen, todo, offenders = set(), ["asd_jax"], []
  while todo:
    module = todo.pop()
    if module in seen:
      continue
    seen.add(module)
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
      path = ROOT / module.replace(".", "/") / "__init__.py"
    for name in _imports(path):
      top = name.split(".")[0]
      if top in ("models", "configs"):
        offenders.append(f"{module} imports {name}")
      elif top == "asd_jax" and name != "asd_jax":
        todo.append(name)
  assert len(seen) > 10  # the walk did follow the engine's imports
  assert not offenders, offenders
