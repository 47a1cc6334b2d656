"""A function's signature and docstring read from its module's source, without running the module.

A command's `--help`, and any error in its options, needs only the typed signature and the
docstring of the function behind it; importing that function's module imports torch and the rest
(5 to 10 s on a 2-core CPU). `light_function(module, name)` parses the module's source (`ast`)
and evaluates only what the signature names: each name is followed to where it is bound, through
`from X import Y` statements (read from X's source in turn) and module-level assignments, so that
`backend: Backend = Backend.AUTO`, `horizons: list[int] = list(PROTOCOL_HORIZONS)` or
`split: Optional[SplitName] = None` cost nothing. Only a class or function that a signature names
is imported, from the module that defines it: those live in light modules (genoformer.kernels.backend,
genoformer.core.pooling, ...). It returns a stand-in with the function's signature, type hints
and docstring that imports and calls the real function when it is called.

`light_class(module, name, methods)` does the same for a class of a package that is never
imported for it (`SOURCE_ONLY`: Lightning, torch): a stand-in class with the named methods'
signatures and docstrings, in which every class those packages define that a signature names is
itself a stand-in (`stand_in_class`: the same name, nothing else), so that `genoformer fit --help`
reads Lightning's Trainer without importing it.

Where the source does not say (a name bound inside `if`/`try`, or computed at import in a way
this reader does not follow), `Unresolved` is raised and the caller imports the module instead:
slower, never wrong. The command-line tests hold every command's stand-in equal to its function.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

SOURCE_ONLY = ("lightning", "torch")
"""Packages whose modules are read from source and never imported (they import torch): a class
they define is a stand-in (`stand_in_class`) wherever a signature read here names it."""


class Unresolved(Exception):
    """The source does not say what a name of the signature is without running the module."""


def _source_only(module: str) -> bool:
    return module.partition(".")[0] in SOURCE_ONLY


def _source_file(module: str) -> Optional[str]:
    """The path of `module`'s source: found as an import would find it, but, for a module of
    `SOURCE_ONLY`, without importing its parent packages."""
    if not _source_only(module):
        spec = importlib.util.find_spec(module)  # imports the parent packages, which are light
        return None if spec is None else spec.origin
    search: Optional[list[str]] = None
    spec = None
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return None if spec is None else spec.origin


@functools.lru_cache(maxsize=None)
def module_tree(module: str) -> tuple[ast.Module, bool]:
    """The parsed source of `module` and whether it is a package (an __init__.py)."""
    origin = _source_file(module)
    if origin is None or not origin.endswith(".py"):
        raise Unresolved(f"no Python source for module {module!r}")
    path = Path(origin)
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), path.name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an `from ... import` names, relative imports resolved against `module`."""
    if not node.level:
        return node.module or ""
    _, is_package = module_tree(module)
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _binding(module: str, name: str) -> ast.stmt | None:
    """The last top-level statement of `module` that binds `name` (None when none does)."""
    tree, _ = module_tree(module)
    found = None
    for statement in tree.body:
        if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            found = statement
        elif isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in statement.targets
        ):
            found = statement
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == name
            and statement.value is not None
        ):
            found = statement
        elif isinstance(statement, (ast.Import, ast.ImportFrom)) and any(
            (alias.asname or alias.name.partition(".")[0]) == name for alias in statement.names
        ):
            found = statement
    return found


@functools.lru_cache(maxsize=None)
def resolve(module: str, name: str) -> Any:
    """The value `name` has in `module` once imported, found from the sources (see the module
    docstring); `Unresolved` when they do not say."""
    statement = _binding(module, name)
    if statement is None:
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise Unresolved(f"{module} binds no {name!r} at its top level")
    if _source_only(module):
        if isinstance(statement, ast.ClassDef):
            return stand_in_class(module, name)
        if not isinstance(statement, (ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            raise Unresolved(f"{module}.{name} is not a class, an alias or an import of one")
    if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return getattr(importlib.import_module(module), name)  # defined here: the module must be light
    if isinstance(statement, ast.ImportFrom):
        alias = next(alias for alias in statement.names if (alias.asname or alias.name) == name)
        source = _absolute(module, statement)
        if not source.startswith("genoformer") and not _source_only(source):
            return getattr(importlib.import_module(source), alias.name)
        try:
            return resolve(source, alias.name)
        except Unresolved:
            submodule = f"{source}.{alias.name}"
            if not _source_only(source) and importlib.util.find_spec(submodule) is not None:
                return importlib.import_module(submodule)
            raise
    if isinstance(statement, ast.Import):
        alias = next(alias for alias in statement.names if (alias.asname or alias.name.partition(".")[0]) == name)
        imported = importlib.import_module(alias.name)
        return imported if alias.asname else importlib.import_module(alias.name.partition(".")[0])
    return evaluate(module, statement.value)


def evaluate(module: str, expression: ast.expr) -> Any:
    """The value of `expression` written at the top level of `module`."""
    names = {node.id for node in ast.walk(expression) if isinstance(node, ast.Name)}
    targets = [node.target for node in ast.walk(expression) if isinstance(node, ast.comprehension)]
    bound_inside = {node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)}
    namespace = {"__builtins__": builtins}
    for name in names - bound_inside:
        namespace[name] = resolve(module, name)
    try:
        return eval(compile(ast.Expression(expression), f"<{module}>", "eval"), namespace)  # noqa: S307 - installed source, as an import would run it
    except (NameError, AttributeError, TypeError) as error:  # an expression that needs the module to run
        raise Unresolved(f"{module}: {ast.unparse(expression)!r}: {error}") from error


def _function_node(module: str, name: str) -> ast.FunctionDef:
    statement = _binding(module, name)
    if not isinstance(statement, ast.FunctionDef):
        raise Unresolved(f"{module}.{name} is not a function defined in {module}")
    if statement.decorator_list:
        raise Unresolved(f"{module}.{name} is decorated")
    return statement


def _parameters(module: str, node: ast.FunctionDef, skip: frozenset[str] = frozenset()) -> list[inspect.Parameter]:
    """The parameters of the function `node` of `module`; those in `skip` without their
    annotation (not evaluated: it may name what the source does not settle)."""
    arguments = node.args
    positional = arguments.posonlyargs + arguments.args
    defaults: list[Any] = [inspect.Parameter.empty] * (len(positional) - len(arguments.defaults))
    defaults += [evaluate(module, value) for value in arguments.defaults]
    kinds = [inspect.Parameter.POSITIONAL_ONLY] * len(arguments.posonlyargs) + [
        inspect.Parameter.POSITIONAL_OR_KEYWORD
    ] * len(arguments.args)
    listed = list(zip(positional, kinds, defaults))
    if arguments.vararg is not None:
        listed.append((arguments.vararg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    listed += [
        (
            argument,
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.empty if default is None else evaluate(module, default),
        )
        for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults)
    ]
    if arguments.kwarg is not None:
        listed.append((arguments.kwarg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return [
        inspect.Parameter(
            argument.arg,
            kind,
            default=default,
            annotation=inspect.Parameter.empty
            if argument.annotation is None or argument.arg in skip
            else evaluate(module, argument.annotation),
        )
        for argument, kind, default in listed
    ]


def light_function(module: str, name: str) -> Callable[..., Any]:
    """A stand-in for `module.name` built from the source: the same signature (without the return
    annotation), type hints, docstring and name; calling it imports the module and calls the
    function. `Unresolved` when the source does not say (see the module docstring)."""
    node = _function_node(module, name)
    parameters = _parameters(module, node)

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    stand_in.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    stand_in.__annotations__ = {p.name: p.annotation for p in parameters if p.annotation is not inspect.Parameter.empty}
    stand_in.__doc__ = ast.get_docstring(node, clean=False)
    stand_in.__name__ = stand_in.__qualname__ = name
    stand_in.__module__ = __name__  # not `module`: jsonargparse imports a function's module to name it
    return stand_in


@functools.lru_cache(maxsize=None)
def stand_in_class(module: str, name: str) -> type:
    """The stand-in for the class `name` of `module` (a module of `SOURCE_ONLY`) in a signature
    read from source: a class of the same name and nothing else. Its import path is private
    (`genoformer.signatures._StandIn.NAME`), so jsonargparse lists it among no known subclasses."""
    return type(name, (), {"__module__": __name__, "__qualname__": f"_StandIn.{name}", "__doc__": None})


def is_stand_in(value: Any) -> bool:
    """Whether `value` is a stand-in class (`stand_in_class`, `light_class`)."""
    return isinstance(value, type) and value.__module__ == __name__ and value.__qualname__.startswith("_StandIn.")


def light_class(
    module: str, name: str, methods: dict[str, frozenset[str]], keeps_signature: tuple[str, ...] = ()
) -> type:
    """A stand-in for the class `name` of `module` read from source: a class of that name whose
    methods `methods` (name -> the parameters to leave unannotated, such as those a command never
    takes) have the source's signatures (with the return annotation) and docstrings; it runs
    nothing. Methods decorated by other than the decorators named in `keeps_signature` (wrappers
    that keep the signature, functools.wraps) are `Unresolved`."""
    statement = _binding(module, name)
    if not isinstance(statement, ast.ClassDef):
        raise Unresolved(f"{module}.{name} is not a class defined in {module}")
    attributes: dict[str, Any] = {"__module__": __name__, "__qualname__": f"_StandIn.{name}"}
    attributes["__doc__"] = ast.get_docstring(statement, clean=False)
    for method, skip in methods.items():
        nodes = [node for node in statement.body if isinstance(node, ast.FunctionDef) and node.name == method]
        if not nodes:
            raise Unresolved(f"{module}.{name} defines no {method}")
        node = nodes[-1]
        decorators = [ast.unparse(decorator) for decorator in node.decorator_list]
        if any(decorator not in keeps_signature for decorator in decorators):
            raise Unresolved(f"{module}.{name}.{method} is decorated ({', '.join(decorators)})")
        parameters = _parameters(module, node, skip)

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            raise TypeError("a stand-in read from source: it runs nothing")

        returns = inspect.Signature.empty if node.returns is None else evaluate(module, node.returns)
        stand_in.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
        stand_in.__annotations__ = {
            p.name: p.annotation for p in parameters if p.annotation is not inspect.Parameter.empty
        }
        stand_in.__doc__ = ast.get_docstring(node, clean=False)
        stand_in.__name__ = method
        stand_in.__qualname__ = f"_StandIn.{name}.{method}"
        stand_in.__module__ = __name__
        attributes[method] = stand_in
    return type(name, (), attributes)
