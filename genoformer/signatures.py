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

`LightModules` goes one step further for a training command's model and data module, whose
modules import torch: while it is open, importing such a genoformer module gives its light copy
(`light_module`), whose classes are built from their source (`light_module_class`: bases,
decorators, fields, enum members and methods' signatures, nothing else run), so that the parser
reads GenoformerLM's, TransformerConfig's and GenomeDataModule's options as the real ones are.

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
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

SOURCE_ONLY = ("lightning", "torch")
"""Packages whose modules are read from source and never imported (they import torch): a class
they define is a stand-in (`stand_in_class`) wherever a signature read here names it."""


IMPORTS_TORCH = (*SOURCE_ONLY, "torchmetrics", "triton")
"""Packages that import torch: a genoformer module that imports one at its top level is `heavy`."""


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
def resolve(module: str, name: str, light: bool = False) -> Any:
    """The value `name` has in `module` once imported, found from the sources (see the module
    docstring); `Unresolved` when they do not say. `light`: a class of a module that imports
    torch or Lightning is its light copy (`light_module`) rather than imported."""
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
    if light and heavy(module):
        if isinstance(statement, ast.ClassDef):
            return light_module_class(module, statement)
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise Unresolved(f"{module}.{name} is a function of a module that imports torch")
    if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return getattr(importlib.import_module(module), name)  # defined here: the module must be light
    if isinstance(statement, ast.ImportFrom):
        alias = next(alias for alias in statement.names if (alias.asname or alias.name) == name)
        source = _absolute(module, statement)
        if light and heavy(source) and not _source_only(source) and not source.startswith("genoformer"):
            raise Unresolved(f"{module}.{name} comes from {source}, which imports torch")
        if not source.startswith("genoformer") and not _source_only(source):
            return getattr(importlib.import_module(source), alias.name)
        if (source, alias.name) == (module, name):
            raise Unresolved(f"{module} imports {name} from itself")
        try:
            return resolve(source, alias.name, light)
        except Unresolved:
            submodule = f"{source}.{alias.name}"
            if not _source_only(source) and not (light and heavy(submodule)) and _is_module(submodule):
                return importlib.import_module(submodule)
            raise
    if isinstance(statement, ast.Import):
        alias = next(alias for alias in statement.names if (alias.asname or alias.name.partition(".")[0]) == name)
        imported_name = alias.name if alias.asname else alias.name.partition(".")[0]
        if light and (_source_only(imported_name) or heavy(imported_name)):
            return SourceNamespace(imported_name)
        imported = importlib.import_module(alias.name)
        return imported if alias.asname else importlib.import_module(alias.name.partition(".")[0])
    return evaluate(module, statement.value, light)


def evaluate(module: str, expression: ast.expr, light: bool = False) -> Any:
    """The value of `expression` written at the top level of `module` (`light`: as `resolve`)."""
    names = {node.id for node in ast.walk(expression) if isinstance(node, ast.Name)}
    targets = [node.target for node in ast.walk(expression) if isinstance(node, ast.comprehension)]
    bound_inside = {node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)}
    namespace = {"__builtins__": builtins}
    for name in names - bound_inside:
        namespace[name] = resolve(module, name, light)
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


# ----------------------------------------------------------------------- light modules
@functools.lru_cache(maxsize=None)
def heavy(module: str, _seen: tuple[str, ...] = ()) -> bool:
    """Whether importing `module` imports torch: it is one of `IMPORTS_TORCH`, or a genoformer
    module whose top-level imports (not those under `if TYPE_CHECKING:`) reach one."""
    if module.partition(".")[0] in IMPORTS_TORCH:
        return True
    if not module.startswith("genoformer") or module in _seen:
        return False
    try:
        tree, _ = module_tree(module)
    except (Unresolved, ModuleNotFoundError):
        return False
    parents = [".".join(module.split(".")[:end]) for end in range(2, module.count(".") + 1)]
    imported = list(parents)
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            imported += [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom):
            source = _absolute(module, statement)
            imported.append(source)
            imported += [
                f"{source}.{alias.name}"
                for alias in statement.names
                if source.startswith("genoformer") and _is_module(f"{source}.{alias.name}")
            ]
    return any(heavy(name, (*_seen, module)) for name in imported)


def _is_module(name: str) -> bool:
    """Whether `name` is a genoformer module, found without importing a module that imports torch
    (its parent must be a package, and a light one)."""
    parent = name.rpartition(".")[0]
    try:
        if not module_tree(parent)[1] or heavy(parent):
            return False
        return importlib.util.find_spec(name) is not None
    except (Unresolved, ImportError, ValueError):
        return False


class SourceNamespace:
    """A module that imports torch (`import lightning as L`) as a light class body sees it: its
    attributes are resolved from source (`resolve(..., light=True)`), nothing is imported."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        try:
            return resolve(self.module, name, True)
        except Unresolved as error:
            raise AttributeError(str(error)) from error


_RUN_METHODS = re.compile(r"_\w+_")
"""The methods a light class keeps whole, which a parser may run (__post_init__, _missing_);
__init__ and the others are kept as their signatures."""
_KEPT_DECORATORS = ("property", "classmethod", "staticmethod", "abstractmethod", "cached_property")
"""The decorators a method kept as its signature keeps (what the class is made of: whether it is
abstract, which attributes are properties); others wrap what is never run here."""


@functools.lru_cache(maxsize=None)
def light_module(module: str) -> types.ModuleType:
    """The light copy of `module` (a genoformer module that imports torch): an empty module of the
    same name and file, into which `light_module_class` puts its classes as they are asked for,
    and whose other names are resolved from source on access (PEP 562 `__getattr__`)."""
    copy = types.ModuleType(module)
    copy.__file__ = _source_file(module)
    copy.__light_copy__ = True  # type: ignore[attr-defined]
    _, is_package = module_tree(module)
    copy.__package__ = module if is_package else module.rpartition(".")[0]

    def attribute(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = resolve(module, name, True)
        except Unresolved as error:
            raise AttributeError(f"module {module!r} has no attribute {name!r} read from source") from error
        setattr(copy, name, value)
        return value

    copy.__getattr__ = attribute  # type: ignore[method-assign]
    sys.modules.setdefault(module, copy)  # where dataclasses and jsonargparse look a class's module up
    return copy


class LightModules:
    """While open, the genoformer modules that import torch are their light copies (`light_module`)
    to `import` (a meta path finder) and in sys.modules, where those already imported step aside;
    closing removes every copy and puts them back, so that a later import runs the real module."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not name.startswith("genoformer.") or name in self.finding:
            return None
        self.finding.add(name)  # heavy() finds the module's source through the other finders
        try:
            real = importlib.util.find_spec(name)
            if real is None or not heavy(name):
                return None
            spec = importlib.util.spec_from_loader(name, self, origin=real.origin)
            spec.submodule_search_locations = real.submodule_search_locations
            return spec
        finally:
            self.finding.discard(name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return light_module(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass

    def build_every_class(self) -> None:
        """Build every class of the light copies made so far, so that each class they define is
        among its bases' subclasses (what a help lists as a type's known subclasses), as once
        the real modules are imported; a class whose source does not settle it is left out."""
        for name, module in list(sys.modules.items()):
            if isinstance(module, types.ModuleType) and vars(module).get("__light_copy__"):
                tree, _ = module_tree(name)
                for statement in tree.body:
                    if isinstance(statement, ast.ClassDef):
                        try:
                            resolve(name, statement.name, True)
                        except Unresolved:
                            continue

    def __init__(self) -> None:
        self.finding: set[str] = set()
        self.imported: dict[str, types.ModuleType] = {}

    def __enter__(self) -> LightModules:
        self.imported = {  # those already imported step aside until closed
            name: module for name, module in sys.modules.items() if name.startswith("genoformer.") and heavy(name)
        }
        for name in self.imported:
            del sys.modules[name]
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        sys.meta_path.remove(self)
        copies = [name for name, module in list(sys.modules.items()) if _is_light_copy(module)]
        for name in copies:
            del sys.modules[name]
        sys.modules.update(self.imported)
        for name in copies:  # the import system set each copy as its package's attribute
            package, _, attribute = name.rpartition(".")
            if package in sys.modules and _is_light_copy(vars(sys.modules[package]).get(attribute)):
                if name in self.imported:
                    setattr(sys.modules[package], attribute, self.imported[name])
                else:
                    delattr(sys.modules[package], attribute)
        light_module.cache_clear()
        stand_in_class.cache_clear()  # the classes of the next opening subclass new stand-ins
        resolve.cache_clear()


def _is_light_copy(value: Any) -> bool:
    return isinstance(value, types.ModuleType) and bool(vars(value).get("__light_copy__"))


def _signature_only(node: ast.FunctionDef) -> ast.FunctionDef:
    """A copy of the method `node` whose body is its docstring, without decorators other than
    `_KEPT_DECORATORS` and, but for __init__, without annotations and defaults: a parser reads the
    signature of __init__ (and whether a method is abstract, a property) and runs none of them,
    so the names they use need not be resolved."""
    copy = ast.FunctionDef(**{field: getattr(node, field) for field in node._fields})
    docstring = ast.get_docstring(node, clean=False)
    copy.body = [ast.Expr(ast.Constant(docstring)) if docstring is not None else ast.Pass()]
    copy.decorator_list = [
        decorator for decorator in node.decorator_list if ast.unparse(decorator).rpartition(".")[2] in _KEPT_DECORATORS
    ]
    if node.name != "__init__":  # its parameters' names only
        copy.args = ast.arguments(
            posonlyargs=[ast.arg(arg.arg) for arg in node.args.posonlyargs],
            args=[ast.arg(arg.arg) for arg in node.args.args],
            vararg=node.args.vararg and ast.arg(node.args.vararg.arg),
            kwonlyargs=[ast.arg(arg.arg) for arg in node.args.kwonlyargs],
            kw_defaults=[None] * len(node.args.kwonlyargs),
            kwarg=node.args.kwarg and ast.arg(node.args.kwarg.arg),
            defaults=[],
        )
        copy.returns = None
    return ast.copy_location(copy, node)


def light_module_class(module: str, statement: ast.ClassDef) -> type:
    """The class `statement` of `module` (which imports torch) built from its source into
    `light_module(module)`: its decorators, bases, class-level assignments (fields, enum members),
    dunder and sunder methods, and its other methods (and __init__) as their signatures, with every
    name they use resolved from source. What a parser reads of it (signature, fields, docstrings,
    members, abstract or not) is the class's; it runs nothing else. `Unresolved` when a name it needs is not settled by the source."""
    copy = light_module(module)
    if statement.name in vars(copy):
        return vars(copy)[statement.name]
    body = [
        node if node.name != "__init__" and _RUN_METHODS.fullmatch(node.name) else _signature_only(node)
        for node in statement.body
        if isinstance(node, ast.FunctionDef)
    ]
    body = [node for node in statement.body if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Pass))] + body
    reduced = ast.ClassDef(
        name=statement.name,
        bases=statement.bases,
        keywords=statement.keywords,
        body=body or [ast.Pass()],
        decorator_list=statement.decorator_list,
        **({"type_params": []} if "type_params" in ast.ClassDef._fields else {}),
    )
    ast.copy_location(reduced, statement)
    tree = ast.fix_missing_locations(
        ast.Module(body=[ast.ImportFrom("__future__", [ast.alias("annotations")], 0), reduced], type_ignores=[])
    )
    names = {node.id for node in ast.walk(reduced) if isinstance(node, ast.Name)}
    for node in ast.walk(reduced):  # the names of annotations, which stay text until read
        annotation = getattr(node, "annotation", None)
        for text in [annotation] + ([node.returns] if isinstance(node, ast.FunctionDef) else []):
            if text is not None:
                names |= {name.id for name in ast.walk(text) if isinstance(name, ast.Name)}
    namespace = vars(copy)
    needed = {  # what building the class runs: its bases, decorators and class-level values
        node.id
        for part in (*statement.bases, *statement.decorator_list, *statement.keywords, *body)
        if not isinstance(part, (ast.FunctionDef, ast.Expr, ast.Pass))
        and not (isinstance(part, ast.AnnAssign) and part.value is None)
        for node in ast.walk(part.value if isinstance(part, (ast.Assign, ast.AnnAssign)) and part.value else part)
        if isinstance(node, ast.Name)
    }
    for name in sorted(names - set(namespace) - {statement.name}):
        try:
            namespace[name] = resolve(module, name, True)
        except Unresolved:
            if name in needed:
                raise
    try:
        exec(compile(tree, copy.__file__ or f"<{module}>", "exec"), namespace)  # noqa: S102 - installed source, as an import would run it
    except (NameError, AttributeError, TypeError) as error:  # a base or decorator the source does not settle
        raise Unresolved(f"{module}.{statement.name}: {error}") from error
    return namespace[statement.name]
